"""Renderers: conversation -> exact token ids + loss mask, selected by name.

Use `get_renderer(name, tokenizer, thinking=...)`; `RENDERERS` lists the names.
"""

from __future__ import annotations

from .base import NotPrefixExtendingError, Renderer, RenderError, Sample

__all__ = ["NotPrefixExtendingError", "Renderer", "RenderError", "Sample", "get_renderer", "RENDERERS"]

# name -> "module:Class"; imported lazily so `specgen --help` stays fast.
RENDERERS: dict[str, str] = {
    "kimi-k2.5": ".kimi:KimiRenderer",
    "kimi-k2-thinking": ".kimi:KimiK2ThinkingRenderer",
    "kimi-k2-instruct": ".kimi:KimiK2InstructRenderer",
    "hf": ".hf:HFRenderer",
}


def get_renderer(name: str, tokenizer, *, thinking: bool = True, **options) -> Renderer:
    """Build the renderer called `name` over `tokenizer`.

    `options` go to the renderer class (e.g. `template=` for "hf": a chat template to use
    instead of the tokenizer's own); an option the renderer does not take is a RenderError.
    """
    import importlib

    try:
        target = RENDERERS[name]
    except KeyError:
        raise RenderError(
            f"unknown renderer {name!r}; choose one of: {', '.join(sorted(RENDERERS))}"
        ) from None
    module, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module, __name__), cls_name)
    try:
        return cls(tokenizer, thinking=thinking, **options)
    except TypeError as exc:
        if not options:
            raise
        raise RenderError(f"renderer {name!r} does not take {', '.join(options)} ({exc})") from None

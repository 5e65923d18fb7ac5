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


def get_renderer(name: str, tokenizer, *, thinking: bool = True) -> Renderer:
    """Build the renderer called `name` over `tokenizer`."""
    import importlib

    try:
        target = RENDERERS[name]
    except KeyError:
        raise RenderError(
            f"unknown renderer {name!r}; choose one of: {', '.join(sorted(RENDERERS))}"
        ) from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module, __name__), cls)(tokenizer, thinking=thinking)

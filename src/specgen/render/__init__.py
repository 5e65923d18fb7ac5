"""Renderers: conversation -> exact token ids + loss mask, selected by name.

Use `get_renderer(name, tokenizer, thinking=...)`; `RENDERERS` lists the names.
"""

from __future__ import annotations

from .base import NotPrefixExtendingError, Renderer, RenderError, Sample

__all__ = ["NotPrefixExtendingError", "Renderer", "RenderError", "Sample", "get_renderer",
           "mode_renderers", "target_renderer", "template_switches", "RENDERERS"]

# Names a chat template may not take as a switch: the server sets them itself.
RESERVED_TEMPLATE_KEYS = frozenset({"messages", "tools", "documents", "add_generation_prompt",
                                    "continue_final_message", "tokenize", "chat_template"})


def template_switches(thinking: bool, extra: dict | None = None) -> dict:
    """The template switches a request sends as `chat_template_kwargs`: `thinking` and
    `enable_thinking` from the thinking mode, then `[target] chat_template_kwargs` over them."""
    return {"thinking": thinking, "enable_thinking": thinking, **(extra or {})}

# name -> "module:Class"; imported lazily so `specgen --help` stays fast.
RENDERERS: dict[str, str] = {
    "kimi-k2.5": ".kimi:KimiRenderer",
    "kimi-k2-thinking": ".kimi:KimiK2ThinkingRenderer",
    "kimi-k2-instruct": ".kimi:KimiK2InstructRenderer",
    "hf": ".hf:HFRenderer",
}


def get_renderer(name: str, tokenizer, *, thinking: bool = True,
                 chat_template_kwargs: dict | None = None, **options) -> Renderer:
    """Build the renderer called `name` over `tokenizer`.

    `chat_template_kwargs` are the template switches exactly as the server gets them: the
    `hf` renderer hands them to the template; a native renderer reads its thinking mode from
    `thinking` (or `enable_thinking`) there. `options` go to the renderer class (e.g.
    `template=` for "hf": a chat template to use instead of the tokenizer's own); an option the
    renderer does not take is a RenderError.
    """
    import importlib

    if chat_template_kwargs is not None:
        if name == "hf":
            options["chat_template_kwargs"] = dict(chat_template_kwargs)
        for key in ("thinking", "enable_thinking"):
            if key in chat_template_kwargs:
                thinking = bool(chat_template_kwargs[key])
                break
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


def target_renderer(cfg, tokenizer) -> Renderer:
    """The renderer of a run's target: `[target] renderer` over `tokenizer`, with the thinking
    mode of `[sampling] reasoning` and the template switches a request carries."""
    thinking = cfg.sampling.thinking
    return get_renderer(cfg.target.renderer, tokenizer, thinking=thinking,
                        chat_template_kwargs=template_switches(
                            thinking, cfg.target.chat_template_kwargs))


def mode_renderers(renderer: Renderer, chat_template_kwargs: dict | None = None):
    """thinking -> the target's renderer in that mode: `renderer` (the run's, for its own
    mode), the other built once when a dataset's reasoning mix asks for it, with the
    `[target] chat_template_kwargs` over that mode's switches."""
    cache = {renderer.thinking: renderer}

    def renderer_for(thinking: bool) -> Renderer:
        found = cache.get(thinking)
        if found is None:
            found = cache[thinking] = get_renderer(
                renderer.name, renderer.tokenizer, thinking=thinking,
                chat_template_kwargs=template_switches(thinking, chat_template_kwargs))
        return found

    return renderer_for

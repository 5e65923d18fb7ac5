"""A task's request, built once: the sampling drawn for it, the renderer of its thinking
mode, the history as the serving stack renders it, our prompt ids, and the body to send
(chat, or token-in: our prompt ids)."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from ..config import RunConfig
from ..render import Renderer
from ..render.serving import history_as_served
from ..sampling import sample_settings
from .stages import Stages
from .state import Conv, Job


class JobBuilder:
    def __init__(self, cfg: RunConfig, stages: Stages, *, tokens_mode: bool,
                 dialect_url: str | None, renderer_for: Callable[[bool], Renderer]):
        self.cfg = cfg
        self.stages = stages
        self.tokens_mode = tokens_mode
        self.dialect_url = dialect_url  # build_request's dialect; None = the first base URL
        self.renderer_for = renderer_for  # the renderer of a thinking mode

    def build(self, c: Conv, step: Any, task_id: int, attempts: int) -> Job:
        """The job of the planner's next request `step` of conversation `c`. Raises
        RenderError, or ValueError / TypeError / KeyError for a request that cannot be
        built from the row."""
        cfg, ds = self.cfg, c.ds
        settings = sample_settings(cfg, ds.cfg, c.conv.id, step.turn,
                                   sample=int(c.conv.meta.get("sample", 0)))
        renderer = self.renderer_for(settings.thinking)
        # the history as the serving stack renders it (render.serving); the request body
        # still carries the messages as given: the server does this itself
        serving = cfg.target.serving
        served = history_as_served(step.messages, serving, renderer.content_format(serving))
        history = step.messages if served is None else served
        prompt_ids = array("I", renderer.prompt_ids(history, step.tools))
        if self.tokens_mode:  # the prompt travels as our ids: no template on the server
            body = self.stages.build_token_request(cfg, ds.cfg, prompt_ids,
                                                   renderer.stop_token_ids, settings=settings)
        else:
            body = self.stages.build_request(cfg, ds.cfg, step, base_url=self.dialect_url,
                                             settings=settings)
        return Job(task_id=task_id, conv=c, turn=step.turn, messages=list(history),
                   tools=step.tools, body=body, prompt_ids=prompt_ids, attempts=attempts,
                   max_tokens=ds.max_tokens, tool_matches=step.tool_matches,
                   settings=settings, renderer=renderer)

"""The pipeline stages the engine calls (docs/design.md, "Stage interfaces"), gathered in one
object so the engine has a single seam to them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Stages:
    iter_rows: Callable[..., Any]  # specgen.sources.iter_rows(ds, start=)
    # specgen.planner.next_request(conv, answers, turns, tool_results=)
    next_request: Callable[..., Any]
    build_request: Callable[..., Any]  # specgen.request.build_request(cfg, ds, req)
    normalize: Callable[..., Any]  # specgen.normalize.normalize(resp, tools=, renderer=, on_length=)
    quarantined: type[BaseException]  # specgen.normalize.Quarantined
    end: type  # specgen.planner.End
    # specgen.normalize.sampled_completion_ids(renderer, norm, context=, tools=): ids of a
    # truncated answer
    truncated_ids: Callable[..., Any] | None = None
    # Token-in mode: specgen.request.build_token_request(cfg, ds, prompt_ids, stop_ids) and
    # specgen.normalize.normalize_ids(resp, tools=, renderer=, prompt_ids=, on_length=)
    build_token_request: Callable[..., Any] | None = None
    normalize_ids: Callable[..., Any] | None = None


def default_stages() -> Stages:
    """The real stages from specgen.sources / planner / request / normalize."""
    from .. import normalize, planner, request, sources

    return Stages(
        iter_rows=sources.iter_rows,
        next_request=planner.next_request,
        build_request=request.build_request,
        normalize=normalize.normalize,
        quarantined=normalize.Quarantined,
        end=planner.End,
        truncated_ids=normalize.sampled_completion_ids,
        build_token_request=request.build_token_request,
        normalize_ids=normalize.normalize_ids,
    )

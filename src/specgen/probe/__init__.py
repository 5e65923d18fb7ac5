"""`specgen probe`: a provider canary before the big spend (docs/probe.md).

Every endpoint of the target model that the config's provider policy allows gets the same few
canary requests, pinned to it; their answers are measured (`measure`), ranked against
thresholds and written out with a ready `[endpoint.provider]` block (`report`). `send` plans
and sends them under a hard cost cap; `suite` picks the canaries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..config import RunConfig
from .measure import Thresholds
from .send import Plan, ProbeError, ProbeOptions, ProbeResult

__all__ = ["Plan", "ProbeError", "ProbeOptions", "ProbeResult", "Thresholds", "probe"]


async def probe(cfg: RunConfig, opts: ProbeOptions, *, tokenizer, renderer,
                on_plan: Callable[[Plan], None] | None = None, on_answer=None) -> ProbeResult:
    """Plan, show (`on_plan`), check the cost cap, send, and measure. Raises ProbeError."""
    from ..client import ChatClient
    from ..engine.stages import default_stages
    from ..render import mode_renderers
    from .send import check_can_start, fetch_endpoints, make_plan, send_plan

    check_can_start(cfg)
    renderer_for = mode_renderers(renderer, cfg.target.chat_template_kwargs)
    sim = urls = None
    if cfg.endpoint.is_sim:
        from .. import sim as simmod

        sim = await asyncio.to_thread(simmod.start_in_thread, cfg.sim.config,
                                      seed=cfg.sim.seed, tokenizer=tokenizer,
                                      renderer=cfg.target.renderer)
        urls = [sim.url]
    try:
        client = ChatClient.from_config(cfg.endpoint, base_urls=urls, stream=True,
                                        concurrency=max(1, opts.concurrency))
        async with client:
            endpoints = await fetch_endpoints(cfg, client)
            plan = make_plan(cfg, endpoints, opts, renderer_for)
            if on_plan is not None:
                on_plan(plan)
            if plan.estimate_usd > opts.max_cost_usd:
                raise ProbeError(
                    f"refusing to start: the worst case is ${plan.estimate_usd:.4f} "
                    f"({len(plan.canaries)} canaries x {len(plan.targets)} endpoints, each "
                    f"answered with max_tokens), above --max-cost ${opts.max_cost_usd:g}; "
                    "raise --max-cost, or lower --per-provider / --max-tokens / --providers")
            return await send_plan(cfg, client, plan, opts, renderer_for, default_stages(),
                                   on_answer=on_answer)
    finally:
        if sim is not None:
            await asyncio.to_thread(sim.stop)

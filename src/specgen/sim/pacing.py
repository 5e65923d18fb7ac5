"""Writing a stream's SSE events at a provider's generation speed, and ending it as its fault
says (chat and token-in streams alike)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

DONE = b"data: [DONE]\n\n"
# Faults that break a stream part-way (between 20% and 80% of its events).
BREAKING = ("mid_stream_error", "connection_reset", "malformed_json")


async def send_paced(request, events: Sequence[tuple[bytes, int]], cut: int,
                     tokens_per_second: float) -> None:
    """Write `events[:cut]` (each `(bytes, tokens it carries)`), at most as fast as
    `tokens_per_second` generates their tokens (0: all at once); what is due is written in
    one piece, then the writer waits for the client to read."""
    start = time.monotonic()
    sent = 0
    i = 0
    while i < cut:
        if tokens_per_second <= 0:
            batch, i = [e for e, _ in events[i:cut]], cut
        else:
            due = (time.monotonic() - start) * tokens_per_second
            batch = []
            while i < cut and (sent <= due or not batch):
                batch.append(events[i][0])
                sent += events[i][1]
                i += 1
        request.write(b"".join(batch))
        await request.drain()
        if i < cut and tokens_per_second > 0:
            wait = sent / tokens_per_second - (time.monotonic() - start)
            if wait > 0:
                await asyncio.sleep(max(wait, 0.005))


async def send_stream(sim, ctx, events: Sequence[tuple[bytes, int]], *,
                      account: Callable[[Any], None], error_event: Callable[[], bytes],
                      broken_event: Callable[[], bytes]) -> str:
    """Send a stream's events (after its head) and end it as `ctx.fault` says: whole, then
    `[DONE]` and `account(ctx)`; or cut part-way by `mid_stream_error` (then `error_event()`),
    `malformed_json` (`broken_event()`, the rest, `[DONE]`) or `connection_reset` (a TCP
    reset); the two are built only when needed. Returns the outcome to count: "completed" or the fault."""
    request, fault = ctx.request, ctx.fault
    cut = len(events)
    if fault in BREAKING:
        cut = max(1, int(len(events) * (0.2 + 0.6 * ctx.draw)))
    await send_paced(request, events, cut, ctx.provider.tokens_per_second)
    if fault is None or fault == "slow_first_byte":
        request.write(DONE)
        account(ctx)
        request.end_stream()
        return "completed"
    sim.stats.provider(ctx.provider.name)["failed"] += 1
    if fault == "mid_stream_error":
        request.write(error_event())
        request.end_stream()
    elif fault == "malformed_json":
        request.write(broken_event())
        request.write(b"".join(e for e, _ in events[cut:]) + DONE)
        request.end_stream()
    else:  # connection_reset
        await asyncio.sleep(0.02)
        sim._finish(ctx, fault)
        request.reset()
    return fault

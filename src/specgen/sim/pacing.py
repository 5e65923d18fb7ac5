"""Writing a stream's SSE events at a provider's generation speed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence


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

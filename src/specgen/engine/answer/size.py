"""Stage 2, size: an answer larger than `[endpoint] max_answer_bytes` is quarantined
`answer_too_large` before any per-answer work (normalising, rendering, the witness) holds the
event loop on it.

A stream is cut by the client at the cap (`ChatResponse.oversize`: the size it held then, the
rest never read); a non-streamed body is measured here. The size is the answer's text
(content, reasoning and tool-call arguments, in UTF-8 bytes) or, when that is more, its
sampled ids at `BYTES_PER_ID` each: a token-in answer holds ids and no text.
"""

from __future__ import annotations

from ...client.parse import BYTES_PER_ID
from .attempt import Answer, AnswerContext
from .outcomes import Outcome, Quarantined


def answer_bytes(resp, cap: int) -> int:
    """The answer's size: its text in UTF-8 bytes (characters first: no encoding below the
    cap/4), or BYTES_PER_ID a sampled id when that is more."""
    ids = BYTES_PER_ID * len(resp.completion_token_ids or ())
    chars = len(resp.content or "") + len(resp.reasoning or "")
    for call in resp.tool_calls or ():  # a loop, no list: this runs for every answer, twice
        chars += len(call.arguments or "")
    if chars * 4 <= cap:  # at most 4 bytes a character: under the cap, whatever the text
        return max(chars, ids)
    parts = [resp.content or "", resp.reasoning or "",
             *(call.arguments or "" for call in resp.tool_calls or ())]
    return max(ids, sum(len(p.encode("utf-8", "surrogatepass")) for p in parts))


def check(a: Answer, ctx: AnswerContext) -> Outcome | None:
    cap = ctx.cfg.endpoint.max_answer_bytes
    resp = a.resp
    if resp.oversize is not None:
        return Quarantined("answer_too_large", {
            "message": f"the stream was cut at {resp.oversize:,} bytes (text, or "
                       f"{BYTES_PER_ID} a token id) "
                       f"([endpoint] max_answer_bytes = {cap:,})",
            "bytes": resp.oversize, "max_answer_bytes": cap, "cut": True})
    size = answer_bytes(resp, cap)
    if size > cap:
        return Quarantined("answer_too_large", {
            "message": f"the answer holds {size:,} bytes (text, or {BYTES_PER_ID} a token id) "
                       f"([endpoint] max_answer_bytes = {cap:,})",
            "bytes": size, "max_answer_bytes": cap, "cut": False})
    return None

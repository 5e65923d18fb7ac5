"""Stage 2, normalise: the answer as an assistant message and the ids the model sampled.

Chat mode: `specgen.normalize.normalize` (repairs, or a quarantine reason), then the
renderer's completion ids of the message (a cut answer, kept with `on_length = "keep"`, gets
the ids of what was sampled, without a stop token). Token-in mode: `normalize_ids` (the
server's own ids are the completion). An answer that cannot be normalised is quarantined with
the normaliser's reason; one that breaks the normaliser (a bug) as `normalize_error`.
"""

from __future__ import annotations

import logging

from ...render import RenderError
from .attempt import Answer, AnswerContext
from .outcomes import Outcome, Quarantined

log = logging.getLogger("specgen.engine")


def check(a: Answer, ctx: AnswerContext) -> Outcome | None:
    job, resp, stages = a.job, a.resp, ctx.stages
    on_length = job.ds.cfg.on_length
    try:
        if ctx.tokens_mode:
            norm = stages.normalize_ids(resp, tools=job.tools, renderer=job.renderer,
                                        prompt_ids=job.prompt_ids, on_length=on_length)
        else:
            norm = stages.normalize(resp, tools=job.tools, renderer=job.renderer,
                                    on_length=on_length, messages=job.messages)
        truncated = bool(getattr(norm, "truncated", False))
        if getattr(norm, "ids", None) is not None:
            completion = norm.ids  # token-in: the sampled ids are the sample
        elif truncated and stages.truncated_ids is not None:
            # kept at max_tokens (on_length = "keep"): no stop token was sampled
            completion = stages.truncated_ids(job.renderer, norm, context=job.messages,
                                              tools=job.tools)
        else:
            completion = job.renderer.completion_ids(norm.message, context=job.messages,
                                                     tools=job.tools)
    except stages.quarantined as q:
        return Quarantined(getattr(q, "reason", None) or str(q),
                           {"message": getattr(q, "detail", "") or str(q)})
    except RenderError as exc:
        return Quarantined("render_error", {"message": str(exc)})
    except Exception as exc:  # noqa: BLE001 - one odd answer must not stop the run
        log.exception("normalising an answer from %s failed", resp.provider)
        return Quarantined("normalize_error", {"message": f"{type(exc).__name__}: {exc}"})
    a.message = norm.message
    a.completion = completion
    a.truncated = truncated
    a.repairs = list(norm.repairs)
    return None

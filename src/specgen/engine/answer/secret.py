"""Stage 1, secret: an answer that quotes the API key or a proxy credential is quarantined
`secret_in_answer`, never kept as a sample.

A sample is what the model sampled, so its text is never rewritten to hide a secret; an answer
holding one (a relay echoing the request's headers, a dataset row quoting the key) is set
aside instead, and only the stored copy is masked (`specgen.client.secrets.mask_answer`), so
the key reaches neither the quarantine row, the attempts table, the log nor an export. Live
and batch answers pass this same stage. The first such answer fires the `secret_in_answer`
alarm (`specgen.quality.alarms`). Only secrets of `Redactor.MIN_FOUND` characters or more are
searched for (a one-character placeholder key would quarantine every answer).
"""

from __future__ import annotations

from ...client.secrets import mask_answer, quoted
from .attempt import Answer, AnswerContext, Note
from .outcomes import Outcome, Quarantined

REASON = "secret_in_answer"


def check(a: Answer, ctx: AnswerContext) -> Outcome | None:
    secrets = ctx.secrets
    if secrets is None:
        return None
    fields = quoted(a.resp, secrets)
    if not fields:
        return None
    mask_answer(a.resp, secrets)
    where = ", ".join(fields)
    message = (f"the answer quotes the API key or a proxy credential (in {where}): "
               "quarantined, stored masked; a relay or provider echoes request headers, or "
               "the dataset holds the key")
    a.notes.append(Note(REASON, f"{message} (task {a.job.task_id})", once=False))
    return Quarantined(REASON, {"message": message, "fields": fields})

"""Stage 3, witness: what the provider's own token counts say of the rebuilt ids.

Token-in mode is exact by construction (our prompt ids, the server's sampled ids): `true_ids`.
A backend that returned its own ids makes them the sample (`true_ids`), and the witness's
verdict on ours is kept among the repairs (`witness:<check>`) so verify can measure it. Any
other hosted answer is judged by `specgen.quality.witness.CountWitness` against its `usage`:
`exact`, `repaired` (a count-guided repair of the completion — re-serialised arguments,
inserted whitespace, repeated stream events — or of the prompt — the history as a serving
stack renders it), `unverified` or `mismatch`. This stage only measures; what a verdict means
for the sample is the quality stage's call (`answer.quality`).
"""

from __future__ import annotations

import functools
from array import array
from collections import Counter

from ...conversation import REASONING_KEYS
from ...display import UNKNOWN_PROVIDER
from ...quality.forms import MAX_OFFSET, answer_form
from ...quality.repairs import (
    SAMPLED_FORM,
    Ambiguous,
    count_repair,
    dedup_repair,
    form_repair,
    prompt_repair,
)
from ...quality.repairs import candidates as repair_candidates
from ...quality.shapes import FLOOR_SLACK_PER_MESSAGE, shape_signature
from ...quality.witness import Verdict
from ...render.serving import history_as_served, may_be_served_differently, reserialized_history
from .attempt import Answer, AnswerContext, Note
from .outcomes import Outcome

# a provider's usage.completion_tokens_details.reasoning_tokens is a second witness once it
# equalled our count of the reasoning on each of its first answers
REASONING_SAMPLES = 20  # answers compared per provider (then the verdict stands)
REASONING_MIN = 5  # answers compared before it is trusted


def check(a: Answer, ctx: AnswerContext) -> Outcome | None:
    if ctx.tokens_mode:
        _token_in(a)
        return None
    verdict = judge(a, ctx)
    a.verdict = verdict
    check_ = verdict.check
    if check_ != "mismatch" and verdict.repairs:  # repaired (or pending on its prompt side)
        if verdict.message is not None:
            a.unrepaired = (a.message, a.completion, list(verdict.completion_repairs))
            a.message, a.completion = verdict.message, verdict.ids
        if verdict.prompt_ids is not None:  # the model saw another prompt: that one
            a.prompt_ids = array("I", verdict.prompt_ids)
            a.prompt_messages = verdict.prompt_messages
        a.repairs += [f"count:{name}" for name in verdict.repairs]
    resp = a.resp
    if resp.prompt_token_ids is not None and resp.completion_token_ids is not None:
        # the backend's own ids are the sample; the witness's verdict on ours is kept
        # so that verify can measure the witness against the truth
        a.repairs.append(f"witness:{check_}")
        check_ = "true_ids"
    a.count_check = check_
    return None


def _token_in(a: Answer) -> None:
    """Exact by construction: the prompt was ours, the ids are the server's. The re-render
    of the parsed message is what the next turn's history holds; a difference is flagged,
    unless the ids are another form the model may have sampled (named `sampled_form:*`)."""
    job = a.job
    a.resp.prompt_token_ids = list(job.prompt_ids)
    a.resp.completion_token_ids = a.completion
    a.verdict = Verdict("true_ids", "token-in")
    a.count_check = "true_ids"
    if a.truncated:
        return
    forms = job.renderer.completion_variant_ids(a.message, context=job.messages,
                                                tools=job.tools)
    form = next((name for name, ids in forms.items() if ids == list(a.completion)), None)
    if form is None:
        a.repairs.append("flag:rerender_differs")
    elif form != "canonical":  # sampled in another form (no section end, ...): verify
        a.repairs.append(f"{SAMPLED_FORM}:{form}")  # re-renders it in that form


def judge(a: Answer, ctx: AnswerContext) -> Verdict:
    """The count witness's verdict on the answer's ids, with the repairs it may take."""
    if not ctx.cfg.quality.count_witness:
        return Verdict("unverified", "count witness off ([quality] count_witness)")
    job, resp, message = a.job, a.resp, a.message
    key = resp.provider or resp.base_url or UNKNOWN_PROVIDER
    reasoning_witness = _reasoning_witness(ctx, key, job)
    repair = sampled = None
    restyled = repair_candidates(message)
    # the forms the model may have sampled besides the canonical one (a tool-call answer
    # without the section end, ...): a count-guided repair like a re-serialisation
    forms = not a.truncated and message is not None and len(job.renderer.completion_variants(
        message, context=job.messages, tools=job.tools)) > 1
    if a.truncated or not (restyled or resp.duplicates or forms):
        # nothing a provider could have transformed (or a cut answer): a plain answer
        if a.truncated:
            return Verdict("unverified", "cut at max_tokens: counts not judged")
    else:
        def render(m):
            return job.renderer.completion_ids(m, context=job.messages, tools=job.tools)

        def rebuild(candidate):
            try:
                m = ctx.stages.normalize(candidate, tools=job.tools, renderer=job.renderer,
                                         on_length=job.ds.cfg.on_length,
                                         messages=job.messages).message
            except Exception:  # noqa: BLE001 - quarantined, unrenderable or a normaliser
                return None  # bug: no candidate (the answer itself was normalised fine)
            return m, render(m)

        def repair(target: int):
            fits = [fix for fix in (
                count_repair(message, target, render) if restyled else None,
                dedup_repair(resp, target, rebuild, reasoning_witness) if resp.duplicates
                else None)
                if fix is not None]
            if fits and all(f[1] == fits[0][1] for f in fits):
                return fits[0]  # one result, however it is reached
            return None  # none, or two that fit with other ids: ambiguous

        if forms:
            variants = functools.cache(lambda m: job.renderer.completion_variant_ids(
                m, context=job.messages, tools=job.tools))

            def sampled(target: int):
                """`repair` joined with the forms the model may have sampled."""
                fits = [fix for fix in (
                    form_repair(message, target, variants),
                    dedup_repair(resp, target, rebuild, reasoning_witness) if resp.duplicates
                    else None)
                    if fix is not None]
                if any(isinstance(f, Ambiguous) for f in fits) or len(
                        {tuple(f[1]) for f in fits}) != 1:
                    return None  # none, or two that fit with other ids: ambiguous
                return fits[0]
    prompt_fix = None
    chosen: list = []
    candidates = served_candidates(job)
    if candidates:  # a history a serving stack would render otherwise: not a plain prompt
        def prompt_fix(target: int):
            fit = prompt_repair(candidates, target,
                                lambda msgs: job.renderer.prompt_ids(msgs, job.tools))
            if fit is None:
                return None
            chosen.append(fit[2])
            return fit[0], fit[1]
    thinking = job.settings.thinking if job.settings is not None else None
    messages = job.messages or []
    system = any(m.get("role") == "system" for m in messages)
    verdict = ctx.witness.judge(
        key, prompt=len(job.prompt_ids), completion=len(a.completion),
        usage=resp.usage or {}, repair=repair, prompt_repair=prompt_fix, sampled_repair=sampled,
        shape=shape_signature(job.tools, job.messages, thinking), tools=bool(job.tools),
        key=job.task_id, form=answer_form(message),
        history=any(m.get("role") in ("assistant", "tool") for m in messages),
        system=system, prompt_floor=lambda: prompt_floor(job),
        default_system=None if system else lambda: default_system_ids(job))
    _learn_reasoning(a, ctx, key)
    if chosen and verdict.prompt_ids is not None:
        verdict.prompt_messages = chosen[-1]
    if verdict.check == "exact" and resp.duplicates and dedup_repair(
            resp, len(a.completion), rebuild) is not None:
        # a repeated event whose text does not change the count: with it or without it
        # the counts agree, so they cannot vouch for either
        verdict.check = verdict.completion_check = "unverified"
        verdict.detail = ("a repeated stream event the counts cannot judge (they agree with "
                          "and without it)")
        return verdict
    if verdict.unvouched and (split := ctx.witness.split_forms(key)) and verdict.form in split:
        a.notes.append(Note("form_unverified",
                            f"{key}'s counts of {verdict.form} answers split between offsets "
                            "(none holds for 80% of them): its samples of that form are "
                            "unverified"))
    if verdict.check == "unverified" and ctx.witness.unusable(key):
        a.notes.append(Note("counts_unusable",
                            f"{key}'s token counts never settle on a constant offset against "
                            "ours: they are no witness, its samples are unverified"))
    return verdict


def _bare(messages: list, system: bool) -> list:
    """The messages without reasoning, with an empty system prompt when they have none."""
    out = [{k: v for k, v in m.items() if k not in REASONING_KEYS} for m in messages]
    return out if system else [{"role": "system", "content": ""}, *out]


def prompt_floor(job) -> int:
    """The fewest prompt ids any serving stack could have fed for this request (quality.
    shapes, `shortfall`): our rendering of its messages with no tools block, no reasoning in
    the history and an empty system prompt, less `FLOOR_SLACK_PER_MESSAGE` per message (role
    markers and wrappers another stack may render shorter)."""
    messages = job.messages or []
    system = any(m.get("role") == "system" for m in messages)
    try:
        n = len(job.renderer.prompt_ids(_bare(messages, system), None))
    except Exception:  # noqa: BLE001 - a renderer that refuses the bare form: no floor
        return 0
    return n - FLOOR_SLACK_PER_MESSAGE * (len(messages) + 1) - MAX_OFFSET


def default_system_ids(job) -> int:
    """How many ids the template's default system prompt adds to a request without one."""
    messages = job.messages or []
    try:
        bare = len(job.renderer.prompt_ids([{"role": "system", "content": ""}, *messages],
                                           job.tools))
    except Exception:  # noqa: BLE001
        return 0
    return max(0, len(job.prompt_ids) - bare)


def _reasoning_ids(job):
    return lambda text: len(job.renderer.tokenizer.encode(text)) if text else 0


def _reasoning_witness(ctx: AnswerContext, key: str, job):
    """Our count of a reasoning text, when `key`'s `reasoning_tokens` have been a witness: equal
    to ours on each of its first `REASONING_SAMPLES` judged answers (at least
    `REASONING_MIN`); else None. It tells apart repeated-event repairs the completion count
    cannot (`quality.repairs.dedup_repair`)."""
    seen = ctx.reasoning_deltas.get(key)
    if not seen or seen.total() < REASONING_MIN or set(seen) != {0}:
        return None
    return _reasoning_ids(job)


def _learn_reasoning(a: Answer, ctx: AnswerContext, key: str) -> None:
    """Compare the provider's `reasoning_tokens` with our count of the sample's reasoning, on
    its first `REASONING_SAMPLES` answers whose reasoning is settled: whole (not cut), and no
    stream event of it repeated (a repeat may be a relay's)."""
    seen = ctx.reasoning_deltas.setdefault(key, Counter())
    resp, message = a.resp, a.message
    if seen.total() >= REASONING_SAMPLES or a.truncated or message is None \
            or not message.reasoning or any(f == "reasoning" for f, _, _ in resp.duplicates):
        return
    details = (resp.usage or {}).get("completion_tokens_details")
    theirs = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if isinstance(theirs, bool) or not isinstance(theirs, int):
        return
    seen[theirs - _reasoning_ids(a.job)(message.reasoning)] += 1


def served_candidates(job) -> list[tuple[str, list]]:
    """The histories a hosted provider's stack may have rendered instead of ours (render.
    serving), each named as its repair, when it renders other text than ours."""
    messages = job.messages
    if not may_be_served_differently(messages):
        return []
    out = []
    if (args := reserialized_history(messages)) is not None:
        out.append(("history_reserialized", args))
    for stack in ("vllm", "sglang"):
        served = history_as_served(messages, stack, job.renderer.content_format(stack))
        if served is not None:
            out.append((f"history_served_{stack}", served))
    if not out:
        return []
    text = job.renderer.render_text
    ours = text(messages, job.tools, add_generation_prompt=True)
    return [(n, m) for n, m in out
            if text(m, job.tools, add_generation_prompt=True) != ours]

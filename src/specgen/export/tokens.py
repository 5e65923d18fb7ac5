"""The `tokens` export: one row per training sample, `input_ids` + `loss_mask` + metadata.

**True ids first.** When the backend returned the ids it processed and sampled (vLLM/SGLang
`return_token_ids`, the simulator: `true_prompt_ids` and `true_completion_ids` both stored),
those are the sample: `input_ids` = true prompt + true completion, mask 0 on the prompt, 1 on
the completion. Our rebuilt ids then only measure reconstruction (`specgen verify`).

Every row also carries the provider's witness: its usage counts, the sample's `count_check`
("true_ids" whenever the exported ids are the backend's) and the repairs applied; and
`tool_matches`: how each recorded tool result in its prompt was matched to the model's call
(`exact`, `name`, `position`; empty when the prompt reuses none); who served it: `provider`,
`model` and `quantization`; and `sampling`: what the sample was drawn with (a JSON object:
temperature, top_p, reasoning, thinking, its index among the dataset's `n` samples of the
prompt; a list for a merged row; null for samples stored before the record).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ..store import ResultRow
from .conversations import sample_id

TRUE_IDS = "true_ids"


def has_true_ids(r: ResultRow) -> bool:
    return r.true_prompt_ids is not None and r.true_completion_ids is not None


def exported_ids(r: ResultRow) -> tuple[list[int], int]:
    """(input_ids, n_prompt) of the sample as exported: the backend's ids when it returned
    them (both parts), else ours."""
    if has_true_ids(r):
        prompt = r.true_prompt_ids or []
        return [*prompt, *(r.true_completion_ids or [])], len(prompt)
    return r.input_ids, r.n_prompt


def exported_count_check(r: ResultRow) -> str | None:
    """The count_check of the exported sample: "true_ids" when the ids are the backend's."""
    return TRUE_IDS if has_true_ids(r) else r.count_check


# From least to most trusted: a merged row carries its least trusted part's verdict.
_TRUST = ("mismatch", None, "unverified", "repaired", "exact", TRUE_IDS)


def _weakest(a: str | None, b: str | None) -> str | None:
    rank = {v: i for i, v in enumerate(_TRUST)}
    return a if rank.get(a, 0) <= rank.get(b, 0) else b


@dataclass(slots=True)
class TokenSample:
    """One exported sample (one stored sample, or several merged by `--merge-prefix`)."""

    dataset: str
    conv_id: str
    turn: int
    input_ids: list[int]
    loss_mask: list[int]
    n_prompt: int
    provider: str | None
    model: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    cost_usd: float | None
    turns: list[int] = field(default_factory=list)
    # the witness: the provider's counts of what n_prompt / num_loss_tokens count (a merged
    # row: its first sample's prompt, the sum of its samples' completions), the verdict, repairs
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    count_check: str | None = None
    repairs: list[str] = field(default_factory=list)
    tool_matches: list[str] = field(default_factory=list)
    quantization: str | None = None
    # the sampling of each sample in the row (specgen.sampling; None: stored before the record)
    sampling: list[dict | None] = field(default_factory=list)
    # the witness's two sides (docs/quality.md, "Two sides"); a merged row: the prompt side of
    # its first sample, the weakest completion verdict and the sum of the completion deltas
    prompt_delta: int | None = None
    completion_delta: int | None = None
    prompt_check: str | None = None
    completion_check: str | None = None

    @property
    def id(self) -> str:
        return sample_id(self.dataset, self.conv_id, self.turn)

    @classmethod
    def from_row(cls, r: ResultRow) -> TokenSample:
        ids, n_prompt = exported_ids(r)
        return cls(
            dataset=r.dataset, conv_id=r.conv_id, turn=r.turn, input_ids=ids,
            loss_mask=[0] * n_prompt + [1] * (len(ids) - n_prompt), n_prompt=n_prompt,
            provider=r.provider, model=r.model,
            finish_reason=r.finish_reason, prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens, reasoning_tokens=r.reasoning_tokens,
            cost_usd=r.cost_usd, turns=[r.turn],
            usage_prompt_tokens=r.prompt_tokens, usage_completion_tokens=r.completion_tokens,
            count_check=exported_count_check(r), repairs=list(r.repairs),
            tool_matches=list(r.tool_matches), quantization=r.quantization,
            sampling=[r.sampling], prompt_delta=r.prompt_delta,
            completion_delta=r.completion_delta, prompt_check=r.prompt_check,
            completion_check=r.completion_check,
        )


def is_prefix(a: list[int], b: list[int]) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


def merge_prefix(samples: list[TokenSample]) -> list[TokenSample]:
    """Merge consecutive samples of one conversation where each is an id-level prefix of the
    next (on the ids exported: true ids where the backend returned them): the longer sequence
    with every sampled span masked (masks OR-ed). Samples where the property does not hold
    stay separate."""
    out: list[TokenSample] = []
    for s in samples:
        prev = out[-1] if out else None
        if prev is not None and is_prefix(prev.input_ids, s.input_ids):
            mask = list(s.loss_mask)
            for i, m in enumerate(prev.loss_mask):
                if m:
                    mask[i] = 1
            out[-1] = TokenSample(
                dataset=s.dataset, conv_id=s.conv_id, turn=s.turn, input_ids=s.input_ids,
                loss_mask=mask, n_prompt=prev.n_prompt,
                provider=_join(prev.provider, s.provider), model=_join(prev.model, s.model),
                finish_reason=s.finish_reason,
                prompt_tokens=_add(prev.prompt_tokens, s.prompt_tokens),
                completion_tokens=_add(prev.completion_tokens, s.completion_tokens),
                reasoning_tokens=_add(prev.reasoning_tokens, s.reasoning_tokens),
                cost_usd=_add(prev.cost_usd, s.cost_usd), turns=[*prev.turns, s.turn],
                usage_prompt_tokens=prev.usage_prompt_tokens,
                usage_completion_tokens=(
                    None if prev.usage_completion_tokens is None
                    or s.usage_completion_tokens is None
                    else prev.usage_completion_tokens + s.usage_completion_tokens),
                count_check=_weakest(prev.count_check, s.count_check),
                repairs=[*prev.repairs, *(x for x in s.repairs if x not in prev.repairs)],
                tool_matches=s.tool_matches,  # its prompt extends prev's: holds its results
                quantization=_join(prev.quantization, s.quantization),
                sampling=[*prev.sampling, *s.sampling],
                prompt_delta=prev.prompt_delta, prompt_check=prev.prompt_check,
                completion_delta=_add(prev.completion_delta, s.completion_delta),
                completion_check=_weakest(prev.completion_check, s.completion_check),
            )
        else:
            out.append(s)
    return out


def token_samples(
    groups: Iterable[list[ResultRow]], *, merge: bool
) -> Iterator[tuple[list[ResultRow], list[TokenSample]]]:
    """(the stored samples of one conversation, the rows to export for them)."""
    for rows in groups:
        samples = [TokenSample.from_row(r) for r in rows]
        yield rows, merge_prefix(samples) if merge else samples


def _join(a: str | None, b: str | None) -> str | None:
    if a is None or a == b:
        return b
    if b is None or b in a.split(","):
        return a
    return f"{a},{b}"


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


# -- writers ----------------------------------------------------------------------------------
def token_row(s: TokenSample, *, merged: bool) -> dict:
    row = {
        "id": s.id, "dataset": s.dataset, "conv_id": s.conv_id, "turn": s.turn,
        "input_ids": s.input_ids, "loss_mask": s.loss_mask, "length": len(s.input_ids),
        "n_prompt": s.n_prompt, "num_loss_tokens": sum(s.loss_mask),
        "provider": s.provider, "model": s.model, "finish_reason": s.finish_reason,
        "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
        "reasoning_tokens": s.reasoning_tokens, "cost_usd": s.cost_usd,
        "usage_prompt_tokens": s.usage_prompt_tokens,
        "usage_completion_tokens": s.usage_completion_tokens,
        "count_check": s.count_check, "repairs": s.repairs, "tool_matches": s.tool_matches,
        "quantization": s.quantization,
        "sampling": sampling_text(s.sampling, merged=merged),
        "prompt_delta": s.prompt_delta, "completion_delta": s.completion_delta,
        "prompt_check": s.prompt_check, "completion_check": s.completion_check,
    }
    if merged:
        row["merged_turns"] = s.turns
    return row


def sampling_text(records: list[dict | None], *, merged: bool) -> str | None:
    """The `sampling` column: the sample's record as JSON (a merged row: the list, one per
    merged turn); null when none was recorded (samples stored before the record)."""
    if not any(records):
        return None
    import orjson

    return orjson.dumps(records if merged else records[0]).decode()


def parquet_schema(*, merged: bool):
    import pyarrow as pa

    fields = [
        ("id", pa.string()), ("dataset", pa.string()), ("conv_id", pa.string()),
        ("turn", pa.int32()), ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())), ("length", pa.int32()), ("n_prompt", pa.int32()),
        ("num_loss_tokens", pa.int32()), ("provider", pa.string()), ("model", pa.string()),
        ("finish_reason", pa.string()), ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()), ("reasoning_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("usage_prompt_tokens", pa.int64()), ("usage_completion_tokens", pa.int64()),
        ("count_check", pa.string()), ("repairs", pa.list_(pa.string())),
        ("tool_matches", pa.list_(pa.string())), ("quantization", pa.string()),
        ("sampling", pa.string()),
        ("prompt_delta", pa.int64()), ("completion_delta", pa.int64()),
        ("prompt_check", pa.string()), ("completion_check", pa.string()),
    ]
    if merged:
        fields.append(("merged_turns", pa.list_(pa.int32())))
    return pa.schema(fields)

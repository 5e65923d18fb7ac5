"""The rows the engine writes to the run store, one record type per table.

Each record's fields are its table's columns, in order: the store derives every column list
from them (`specgen.store.columns`), so a column is named once. Records are NamedTuples, built
by field name and handed to SQLite as they are (a tuple needs no conversion per row).
Semantics of every column: docs/design.md, "Store schema".
"""

from __future__ import annotations

from typing import NamedTuple


class DatasetRecord(NamedTuple):
    name: str
    position: int
    path: str
    format: str
    rows_read: int
    rows_invalid: int
    rows_duplicate: int
    rows_other_shard: int
    exhausted: int
    state: str
    config_hash: str


class ConversationRecord(NamedTuple):
    id: int
    dataset: str
    conv_id: str
    row_index: int
    status: str
    end_reason: str | None
    data: bytes  # zlib(orjson(Conversation.to_json()))


class TaskRecord(NamedTuple):
    id: int
    conversation: int
    dataset: str
    turn: int
    status: str  # pending | done | failed | quarantined
    attempts: int
    error: str | None


class AttemptRecord(NamedTuple):
    task: int
    session: int
    base_url: str | None
    provider: str | None
    model: str | None
    started_at: float
    first_byte_at: float | None
    ended_at: float
    outcome: str  # ok | retry:<class> | fatal:<class> | rejected:<r> | quarantined:<r> | cancelled
    http_status: int | None
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None
    generation_id: str | None
    dataset: str
    first_token_at: float | None = None


class ResultRecord(NamedTuple):
    task: int
    conversation: int
    dataset: str
    turn: int
    provider: str | None
    model: str | None
    finish_reason: str | None
    native_finish_reason: str | None
    request: bytes  # pack_json({"messages", "tools"[, "max_tokens"]}) as sent
    message: str  # orjson(AssistantMessage.to_openai())
    input_ids: bytes  # pack_ids(prompt + completion)
    n_prompt: int
    true_prompt_ids: bytes | None
    true_completion_ids: bytes | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    cost_usd: float | None
    repairs: str  # JSON list
    latency_s: float | None
    created_at: float
    count_check: str | None
    tool_matches: str | None  # JSON list, NULL when empty
    quantization: str | None
    sampling: str | None  # JSON
    # the count witness's two sides (quality.shapes): provider − ours, and each verdict
    prompt_delta: int | None = None
    completion_delta: int | None = None
    prompt_check: str | None = None
    completion_check: str | None = None
    prompt_shape: str | None = None


class VerdictRecord(NamedTuple):
    """A stored sample judged again (docs/quality.md, "Two sides"): its new verdicts, and
    its message, ids and repairs when the completion's verdict chose another repair (None:
    unchanged). Written as an UPDATE of its results row, by field name."""

    task: int
    count_check: str
    prompt_check: str | None
    completion_check: str | None
    message: str | None = None
    input_ids: bytes | None = None
    repairs: str | None = None


class QuarantineRecord(NamedTuple):
    task: int
    dataset: str
    provider: str | None
    reason: str
    response: bytes  # pack_json of the raw answer
    created_at: float
    detail: str | None  # JSON object: the reason's figures (e.g. both counts of a mismatch)


class EventRecord(NamedTuple):
    ts: float
    session: int
    kind: str
    dataset: str | None
    provider: str | None
    detail: str


class InvalidRowRecord(NamedTuple):
    dataset: str
    row_index: int
    line: int | None
    reason: str

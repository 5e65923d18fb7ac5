"""What the client hands to the rest of the pipeline: one answer, or one classified error.

Streaming and non-streaming answers end up in the same `ChatResponse`, so the normaliser and
the engine never care how the bytes arrived.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(slots=True)
class RawToolCall:
    """A tool call as the API returned it (id and arguments possibly rewritten by a server)."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ChatResponse:
    """One completed answer, stream or not, before any normalisation."""

    content: str | None
    reasoning: str | None  # from `reasoning` or `reasoning_content`, whichever came
    reasoning_field: str | None  # which of the two field names carried it
    tool_calls: list[RawToolCall]
    finish_reason: str | None
    native_finish_reason: str | None
    provider: str | None
    model: str | None
    id: str | None  # generation id (OpenRouter: usable with GET /generation)
    usage: dict[str, Any] = field(default_factory=dict)  # as returned (prompt/completion/cost...)
    # True ids when the backend returns them (vLLM/SGLang `return_token_ids`, the simulator).
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    base_url: str | None = None
    started_at: float = 0.0
    first_byte_at: float | None = None  # the response headers arrived
    # the first byte of the model's output (content, reasoning, a tool call) arrived; for an
    # answer that is not streamed, when its body was read (= ended_at)
    first_token_at: float | None = None
    ended_at: float = 0.0
    # streams: when the first content / reasoning / tool-call text arrived (time to first token)
    first_token_at: float | None = None
    stream: bool = False
    http_status: int | None = None
    # OpenRouter's X-OpenRouter-Cache-Status ("HIT" means a replayed, unbilled answer).
    cache_status: str | None = None
    # Token-in answers: the matched stop (vLLM `stop_reason`, SGLang `finish_reason.matched`:
    # an id, or a stop string), and whether the client appended a stop id the server left out.
    stop_reason: int | str | None = None
    stop_appended: bool = False
    # Streams: (field "content" | "reasoning", offset, length) of text an event repeated byte
    # for byte added; a count-guided repair may take it out (specgen.quality.repairs).
    duplicates: list[tuple[str, int, int]] = field(default_factory=list)
    # a stream cut by the client at `[endpoint] max_answer_bytes`: the text it held then
    oversize: int | None = None
    # what the client left out of `usage` (a count or cost that was not a non-negative
    # number: treated as missing, never charged; specgen.client.usage)
    usage_warnings: list[str] = field(default_factory=list)
    # The quantization that served the answer, when the answer says (a top-level
    # `quantization` next to `provider`; the simulator's providers that reveal it).
    quantization: str | None = None
    # metadata fields (provider, model, id, quantization, usage) in which the client masked
    # the API key or a proxy credential (specgen.client.secrets); the answer's text is never
    # masked by the client: the `secret` answer stage quarantines it
    masked: list[str] = field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return int(self.usage.get("prompt_tokens") or 0)

    @property
    def completion_tokens(self) -> int:
        return int(self.usage.get("completion_tokens") or 0)

    @property
    def cost_usd(self) -> float | None:
        cost = self.usage.get("cost")
        return float(cost) if isinstance(cost, int | float) else None


ErrorClass = Literal[
    # retryable
    "rate_limit",  # 429
    "in_flight_budget",  # 402 in_flight_budget_exhausted: the account's running requests
    "overloaded",  # 503 / 529
    "server",  # other 5xx
    "timeout",  # 408, first-byte/idle/total timeouts
    "unreachable",  # no response at all: DNS, refused, TLS, connect timeout, reset before it
    "connection",  # the connection broke after the response began (EOF / reset mid-body)
    "error_in_body",  # HTTP 200 with an error object or choices[0].error
    "stream_error",  # a mid-stream error chunk
    "invalid_response",  # malformed JSON / missing fields
    # fatal for the request
    "bad_request",  # 400
    "moderation",  # 403 (no limit_source)
    "weight_exceeds_budget",  # 402: this one request's estimate exceeds the whole budget
    # fatal for the run
    "auth",  # 401
    "credits",  # 402 out of credits / key limit
    "spend_limit",  # 403 with limit_source: a guardrail, workspace or key budget is spent
    "no_endpoints",  # 404 with availability
]

RETRYABLE: frozenset[str] = frozenset(
    {"rate_limit", "in_flight_budget", "overloaded", "server", "timeout", "unreachable",
     "connection", "error_in_body", "stream_error", "invalid_response"}
)
FATAL_FOR_RUN: frozenset[str] = frozenset({"auth", "credits", "spend_limit", "no_endpoints"})
# Run-fatal classes that are an account's budget, not a fault: the run stops cleanly
# (state stopped, resumable) rather than failing.
ACCOUNT_LIMITS: frozenset[str] = frozenset({"credits", "spend_limit"})


class ApiError(Exception):
    """A failed request, classified. `retry_after` is seconds from a Retry-After header."""

    def __init__(
        self,
        kind: ErrorClass,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        provider: str | None = None,
        body: Any = None,
        usage: dict[str, Any] | None = None,
        base_url: str | None = None,
        code: Any = None,
        timeout_phase: str | None = None,
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.provider = provider
        self.body = body
        self.usage = usage or {}  # a failed-but-billed attempt still reports its cost
        self.base_url = base_url
        self.code = code  # error.code from the body, when there was one
        self.timeout_phase = timeout_phase  # connect | first_byte | idle | total (kind "timeout")
        # Filled by the client so a failed attempt can be recorded like a successful one.
        self.model: str | None = None
        self.generation_id: str | None = None
        self.started_at: float = 0.0
        self.first_byte_at: float | None = None
        self.ended_at: float = 0.0

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    @property
    def fatal_for_run(self) -> bool:
        return self.kind in FATAL_FOR_RUN

    @property
    def metadata(self) -> dict[str, Any]:
        """`error.metadata` of the body (empty when absent)."""
        meta = self.body.get("metadata") if isinstance(self.body, dict) else None
        return meta if isinstance(meta, dict) else {}

    @property
    def availability(self) -> dict[str, Any] | None:
        """OpenRouter's `error.availability` (404 no endpoints: `code`, `retryable`...)."""
        if isinstance(self.body, dict):
            for where in (self.body, self.metadata):
                value = where.get("availability")
                if isinstance(value, dict):
                    return value
        return None

    @property
    def limit_source(self) -> str | None:
        """OpenRouter's `metadata.limit_source` (which budget refused: in-flight, credits,
        key limit, guardrail, workspace)."""
        value = self.metadata.get("limit_source")
        return value if isinstance(value, str) else None

    @property
    def resets_at(self) -> str | None:
        """When a spent budget resets (`metadata.resets_at`), as the server wrote it."""
        value = self.metadata.get("resets_at")
        return str(value) if isinstance(value, str | int | float) else None

    @property
    def reasons(self) -> list[Any] | None:
        """Moderation reasons (`error.metadata.reasons`, 403)."""
        value = self.metadata.get("reasons")
        return value if isinstance(value, list) else None

    @property
    def cost_usd(self) -> float | None:
        cost = self.usage.get("cost")
        return float(cost) if isinstance(cost, int | float) else None

    def __repr__(self) -> str:
        return f"ApiError({self.kind!r}, {self.message!r}, status={self.status!r})"

    def __str__(self) -> str:
        status = f" HTTP {self.status}" if self.status else ""
        return f"{self.kind}{status}: {self.message}"

"""The simulator's configuration: one TOML file (every knob has a default), see docs/sim.md.

`load_sim_config(path)` reads a file, `SimConfig.from_dict(raw)` a parsed table, and
`SimConfig()` is the built-in default (three clean providers, no quirks, no faults, no latency).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..config import QUANTIZATIONS, ConfigError, build_table, read_toml

# Parameters a provider may support (OpenRouter's `supported_parameters` vocabulary).
DEFAULT_SUPPORTED_PARAMETERS = [
    "tools", "tool_choice", "parallel_tool_calls", "max_tokens", "temperature", "top_p",
    "top_k", "min_p", "seed", "stop", "reasoning", "include_reasoning", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "response_format", "structured_outputs",
    "logprobs", "top_logprobs", "logit_bias",
]


@dataclass
class LengthConfig:
    """Distribution of the completion length in tokens (before `max_tokens` truncation)."""

    distribution: Literal["fixed", "uniform", "lognormal"] = "lognormal"
    tokens: int = 300  # fixed: the length; lognormal: the median; uniform: ignored
    sigma: float = 0.7  # lognormal shape
    min: int = 8
    max: int = 8192
    reasoning_share: float = 0.6  # share of the length spent in reasoning when thinking is on


@dataclass
class ToolCallConfig:
    """How often and how the simulated model calls tools when the request declares some."""

    rate: float = 0.5  # P(tool calls) for tool_choice "auto" (or absent)
    # P(tool calls) right after tool results (chat requests); None = `rate`
    rate_after_result: float | None = None
    max_parallel: int = 2  # calls per answer at most (1 when parallel_tool_calls is false)
    # P(more than one call) when several are allowed; None = 1..max_parallel uniformly
    parallel_rate: float | None = None
    content_rate: float = 0.3  # P(a short content sentence before the calls)
    compact_arguments_rate: float = 0.2  # share of answers whose arguments are compact JSON
    optional_rate: float = 0.5  # P(an optional schema property is filled in)


@dataclass
class FaultRates:
    """Per-request probabilities of each fault (their sum must be <= 1)."""

    rate_limit: float = 0.0  # 429 with Retry-After
    timeout: float = 0.0  # 408
    server_error: float = 0.0  # 500
    bad_gateway: float = 0.0  # 502
    unavailable: float = 0.0  # 503
    moderation: float = 0.0  # 403 with metadata.reasons / flagged_input
    error_in_body: float = 0.0  # HTTP 200 whose body is an error
    mid_stream_error: float = 0.0  # an error chunk part-way through a stream
    connection_reset: float = 0.0  # TCP reset part-way through the body
    slow_first_byte: float = 0.0  # nothing sent for `slow_first_byte_s`
    malformed_json: float = 0.0  # a body (or one SSE event) that is not valid JSON

    def items(self):
        """(name, rate) pairs in declaration order (a dataclass's __dict__ keeps it)."""
        return vars(self).items()

    def values(self):
        return vars(self).values()


@dataclass
class QuirkRates:
    """Per-request probabilities of each serving-stack quirk of one provider."""

    tool_calls_in_content: float = 0.0  # no `tools` in the request: model calls one, raw text
    tool_calls_as_text: float = 0.0  # `tools` given, but the call comes back as marker text
    im_end_in_content: float = 0.0  # literal <|im_end|> left at the end of content
    spaces_around_special: float = 0.0  # ' <think> ok </think> 1' style decoding
    think_in_content: float = 0.0  # no reasoning parser: reasoning + </think> land in content
    drop_end_think: float = 0.0  # </think> dropped: everything lands in reasoning
    renumber_tool_call_ids: float = 0.0  # functions.{name}:{index within this answer}
    openai_tool_call_ids: float = 0.0  # ids replaced with call_<random>
    reserialize_arguments: float = 0.0  # arguments parsed and re-dumped in the other style
    empty_content: float = 0.0  # content and tool calls dropped, finish_reason "stop"
    wrong_model: float = 0.0  # the answer names `wrong_model_slug` as its model
    pad_whitespace: float = 0.0  # content gets "\n\n" after reasoning, "\n" before tool calls
    duplicate_events: float = 0.0  # streams: one content/reasoning event sent twice
    # a relay that adds a word (" Indeed": one token) to the end of the content, the usage
    # still the model's honest count (docs/sim.md, "Usage counting")
    relay_extra_token: float = 0.0
    # the provider drops `tools`: the model sees no declaration, no tool parser runs, and the
    # calls it still makes come back as raw Kimi marker text in `content`
    tools_ignored: float = 0.0

    def items(self):
        """(name, rate) pairs in declaration order (a dataclass's __dict__ keeps it)."""
        return vars(self).items()


@dataclass
class OutageWindow:
    """A time window (seconds after the server started listening) in which the simulator is
    unreachable: `refuse` closes the listening socket (connection refused) and resets the open
    connections; `reset` accepts connections and resets them before any response byte;
    `graceful` shuts down as a server does on SIGTERM: it stops accepting, closes idle
    keep-alive connections and each busy one once its answer is out."""

    start_s: float
    duration_s: float
    mode: Literal["refuse", "reset", "graceful"] = "refuse"

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


# `spend_limit_source` -> the `scope` of its 403 body.
SPEND_LIMIT_SCOPES = {"openrouter_guardrail_budget": "guardrail",
                      "openrouter_workspace_budget": "workspace",
                      "openrouter_key_limit": "key"}


@dataclass
class ProviderConfig:
    """One simulated provider endpoint of the served model(s)."""

    name: str
    tag: str = ""  # slug for order/only/ignore; default: the name lower-cased, dashed
    quantization: str = "unknown"
    prompt_price_per_m: float = 0.6  # USD per million prompt tokens
    completion_price_per_m: float = 2.5  # USD per million completion tokens
    cache_read_price_per_m: float | None = None  # cached prompt tokens; default: prompt price
    billed_price_factor: float = 1.0  # usage.cost = this x the listed prices (> 1: bills more)
    cache_hit_rate: float = 0.0  # P(part of the prompt is reported as cached)
    latency_s: float = 0.0  # time to first token
    latency_jitter: float = 0.0  # relative: latency is drawn in [1-j, 1+j] * latency_s
    tokens_per_second: float = 0.0  # generation speed; 0 = instant
    context_length: int = 262144
    max_completion_tokens: int = 65536  # also the default max_tokens
    supported_parameters: list[str] = field(
        default_factory=lambda: list(DEFAULT_SUPPORTED_PARAMETERS)
    )
    collects_data: bool = False  # excluded by provider.data_collection = "deny"
    zdr: bool = False  # kept by provider.zdr = true
    distillable: bool = True  # kept by provider.enforce_distillable_text = true
    reasoning_field: Literal["reasoning", "reasoning_content"] = "reasoning"
    models: list[str] = field(default_factory=list)  # served models; empty = all
    uptime: float = 99.5  # percent, shown in the endpoint list
    faults: FaultRates = field(default_factory=FaultRates)
    quirks: QuirkRates = field(default_factory=QuirkRates)
    # How the provider counts (the reported `usage`; the true counts are len(ids)):
    usage_completion_offset: int = 0  # added to completion_tokens (-1: stop token not counted)
    # per answer form (quality.forms: plain, reasoning, tools, reasoning+tools), instead of
    # usage_completion_offset for that form: e.g. {tools = -1, "reasoning+tools" = -2}
    usage_completion_offsets: dict[str, int] = field(default_factory=dict)
    # prompt_tokens += this per earlier assistant or tool message of the request: the
    # provider renders a conversation's history its own way (the delta moves with it)
    history_rendering_tokens: int = 0
    # prompt_tokens -= the official template's default system prompt (the ids it adds to a
    # request without a system message): the provider does not add it (Moonshot's platform)
    omits_default_system: bool = False
    usage_alternating: bool = False  # completion_tokens one over, then one under, in turn
    usage_prompt_offset: int = 0  # added to prompt_tokens
    usage_noise: float = 0.0  # completion_tokens x U[1 - noise, 1 + noise] per request, rounded
    hidden_system_prompt_tokens: int = 0  # a hidden system prompt: prompt_tokens += this
    # Tool declarations rendered the provider's own way: prompt_tokens of a request with tools
    # += a constant per tools block in [-N, N] (never 0), drawn from the block (docs/sim.md)
    tools_rendering_tokens: int = 0
    prompt_drop_rate: float = 0.0  # share of answers whose prompt_tokens is short (compressed)
    # A vLLM/SGLang serving stack: history tool-call arguments parsed and re-written by the
    # template's tojson, so the prompt the model sees (and counts, and returns) differs.
    rerenders_history: bool = False
    # Or the whole of one stack's message preprocessing (render.serving): "vllm" or "sglang"
    # (list content joined, arguments parsed, ...); "" = none.
    serving: str = ""
    # Quality knobs (docs/sim.md, "Provider quality"): how well this endpoint's model behaves.
    tool_call_rate: float | None = None  # P(tool calls) when tools are offered; None: [tool_calls]
    schema_violation_rate: float = 0.0  # share of calls whose arguments break their schema
    actual_quantization: str = ""  # what it really serves ("" = the declared quantization)
    actual_quantization_rate: float = 1.0  # share of answers served so (the rest: declared)
    reveal_quantization: bool = True  # answers name what served them (`quantization` field)

    @property
    def counts_exactly(self) -> bool:
        """Whether the reported usage is the true count (no counting key set)."""
        return not (self.usage_completion_offset or self.usage_prompt_offset or self.usage_noise
                    or self.hidden_system_prompt_tokens or self.tools_rendering_tokens
                    or self.prompt_drop_rate or self.usage_completion_offsets
                    or self.history_rendering_tokens or self.omits_default_system
                    or self.usage_alternating)

    @property
    def slug(self) -> str:
        """The base slug (`deepinfra` for tag `deepinfra/fp4`)."""
        return self.tag.split("/", 1)[0]

    def prompt_price(self) -> float:
        return self.prompt_price_per_m / 1e6

    def completion_price(self) -> float:
        return self.completion_price_per_m / 1e6

    def cache_read_price(self) -> float:
        per_m = self.cache_read_price_per_m
        return (self.prompt_price_per_m if per_m is None else per_m) / 1e6


def default_providers() -> list[ProviderConfig]:
    return [
        ProviderConfig(name="Moonshot AI", tag="moonshotai/int4", quantization="int4",
                       prompt_price_per_m=0.6, completion_price_per_m=3.0,
                       cache_read_price_per_m=0.15),
        ProviderConfig(name="Together", tag="together/fp8", quantization="fp8",
                       prompt_price_per_m=0.5, completion_price_per_m=2.8),
        ProviderConfig(name="DeepInfra", tag="deepinfra/fp4", quantization="fp4",
                       prompt_price_per_m=0.45, completion_price_per_m=2.25),
    ]


@dataclass
class SimConfig:
    """Every knob of the simulator (docs/sim.md documents each)."""

    seed: int = 0
    tokenizer: str = "demo"  # "demo", a model directory, or a hub id
    renderer: str = "kimi-k2.5"
    models: list[str] = field(default_factory=lambda: ["moonshotai/kimi-k2.5"])
    model_version: str = "20260127"  # responses name the dated slug `{model}-{model_version}`
    default_thinking: bool = True  # thinking mode when the request has no `reasoning`
    text_mode: Literal["canonical", "raw"] = "canonical"
    raw_rate: float = 0.1  # raw mode: share of completions whose ids are re-segmented
    raw_max_splits: int = 3  # raw mode: tokens split per perturbed completion, at most
    length: LengthConfig = field(default_factory=LengthConfig)
    tool_calls: ToolCallConfig = field(default_factory=ToolCallConfig)
    providers: list[ProviderConfig] = field(default_factory=default_providers)
    faults: FaultRates = field(default_factory=FaultRates)  # router-level, before routing
    retry_after_s: float = 1.0  # Retry-After of a 429
    slow_first_byte_s: float = 30.0  # how long a slow_first_byte fault stays silent
    error_metadata: Literal["both", "provider_raw", "error_type"] = "both"
    credit_limit_usd: float | None = None  # 402 once this much has been spent; None = no limit
    api_keys: list[str] = field(default_factory=list)  # accepted bearer keys; empty = any
    keepalive_interval_s: float = 1.0  # `: OPENROUTER PROCESSING` while waiting; 0 = never
    keepalive_initial: bool = True  # one keep-alive comment as the first bytes of a stream
    stream_chunk_tokens: int = 1  # completion tokens per stream chunk
    # In-flight spending budget (402 in_flight_budget_exhausted / weight_exceeds_budget).
    in_flight_budget_usd: float | None = None  # None = no in-flight budget
    in_flight_retry_after_s: float = 1.0  # Retry-After of an in_flight_budget_exhausted 402
    in_flight_linger_s: float = 0.0  # finished requests keep their weight this long
    # A guardrail / workspace / key budget (403 once the spend reaches it).
    spend_limit_usd: float | None = None  # None = no such budget
    spend_limit_source: str = "openrouter_guardrail_budget"  # a key of SPEND_LIMIT_SCOPES
    spend_limit_resets_at: str | None = None  # ISO-8601, echoed as metadata.resets_at
    wrong_model_slug: str = "meta-llama/llama-3-8b"  # the `model` of a wrong_model answer
    outages: list[OutageWindow] = field(default_factory=list)  # [[outages]]
    # The Batch API (specgen.sim.batch): the least time a batch takes, the share of lines
    # answered with an error line, the share left unanswered (the batch ends `expired`), and
    # the batch price as a share of the live price.
    batch_processing_s: float = 2.0
    batch_line_fail_rate: float = 0.0
    batch_expire_rate: float = 0.0
    batch_price_factor: float = 0.5
    batch_create_delay_s: float = 0.0  # the answer to POST /v1/batches comes this much later
    source: Path | None = None  # the file this came from

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "sim config") -> SimConfig:
        """Validate a parsed TOML table; errors name the file and the key."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a table")
        raw = dict(raw)
        nested: dict[str, Any] = {}
        for key, sub in (("length", LengthConfig), ("tool_calls", ToolCallConfig),
                         ("faults", FaultRates)):
            if key in raw:
                nested[key] = build_table(sub, raw.pop(key), key, where)
        if "providers" in raw:
            providers_raw = raw.pop("providers")
            if not isinstance(providers_raw, list) or not providers_raw:
                raise ConfigError(f"{where}: 'providers' must be a non-empty array of tables "
                                  "([[providers]])")
            nested["providers"] = [
                _provider(p, f"providers[{i}]", where) for i, p in enumerate(providers_raw)
            ]
        if "outages" in raw:
            outages_raw = raw.pop("outages")
            if not isinstance(outages_raw, list):
                raise ConfigError(f"{where}: 'outages' must be an array of tables ([[outages]])")
            nested["outages"] = [build_table(OutageWindow, o, f"outages[{i}]", where)
                                 for i, o in enumerate(outages_raw)]
        if isinstance(raw.get("spend_limit_resets_at"), datetime.datetime | datetime.date):
            raw["spend_limit_resets_at"] = _iso(raw["spend_limit_resets_at"])
        if isinstance(raw.get("models"), str):
            raw["models"] = [raw["models"]]
        raw.pop("source", None)
        cfg = build_table(cls, raw, "sim", where)
        for key, value in nested.items():
            setattr(cfg, key, value)
        cfg.validate(where)
        return cfg

    def validate(self, where: str = "sim config") -> None:
        """Check ranges and cross-field rules; raises ConfigError."""
        _rate(self.raw_rate, "raw_rate", where)
        _rates(self.faults, "faults", where)
        for name in ("reasoning_share",):
            _rate(getattr(self.length, name), f"length.{name}", where)
        for f in dataclasses.fields(ToolCallConfig):
            value = getattr(self.tool_calls, f.name)
            if f.name != "max_parallel" and value is not None:
                _rate(value, f"tool_calls.{f.name}", where)
        if self.tool_calls.max_parallel < 1:
            raise ConfigError(f"{where}: tool_calls.max_parallel must be >= 1")
        if not 1 <= self.length.min <= self.length.max:
            raise ConfigError(f"{where}: length needs 1 <= min <= max "
                              f"(got min={self.length.min}, max={self.length.max})")
        if self.length.tokens < 1 or self.length.sigma < 0:
            raise ConfigError(f"{where}: length.tokens must be >= 1 and length.sigma >= 0")
        if not self.models or not all(isinstance(m, str) and m for m in self.models):
            raise ConfigError(f"{where}: 'models' must list at least one model slug")
        if not self.providers:
            raise ConfigError(f"{where}: at least one provider is needed")
        if self.raw_max_splits < 1:
            raise ConfigError(f"{where}: raw_max_splits must be >= 1")
        if self.stream_chunk_tokens < 1:
            raise ConfigError(f"{where}: stream_chunk_tokens must be >= 1")
        for key in ("retry_after_s", "slow_first_byte_s", "keepalive_interval_s"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{where}: {key} must be >= 0")
        for key in ("credit_limit_usd", "in_flight_budget_usd", "spend_limit_usd"):
            value = getattr(self, key)
            if value is not None and not value >= 0:
                raise ConfigError(f"{where}: {key} must be >= 0 (or absent: no limit)")
        for key in ("in_flight_retry_after_s", "in_flight_linger_s"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"{where}: {key} must be >= 0")
        if self.spend_limit_source not in SPEND_LIMIT_SCOPES:
            raise ConfigError(f"{where}: spend_limit_source must be one of "
                              f"{', '.join(SPEND_LIMIT_SCOPES)}, not {self.spend_limit_source!r}")
        if self.spend_limit_resets_at is not None:
            if isinstance(self.spend_limit_resets_at, datetime.datetime | datetime.date):
                self.spend_limit_resets_at = _iso(self.spend_limit_resets_at)
            try:
                datetime.datetime.fromisoformat(str(self.spend_limit_resets_at))
            except ValueError:
                raise ConfigError(f"{where}: spend_limit_resets_at must be an ISO-8601 date "
                                  f"and time, not {self.spend_limit_resets_at!r}") from None
        if not isinstance(self.wrong_model_slug, str) or not self.wrong_model_slug:
            raise ConfigError(f"{where}: wrong_model_slug must be a non-empty model slug")
        self._validate_outages(where)
        _rate(self.batch_line_fail_rate, "batch_line_fail_rate", where)
        _rate(self.batch_expire_rate, "batch_expire_rate", where)
        for key in ("batch_processing_s", "batch_create_delay_s"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"{where}: {key} must be >= 0")
        if not 0 < self.batch_price_factor <= 1:
            raise ConfigError(f"{where}: batch_price_factor must be > 0 and <= 1")
        tags: set[str] = set()
        for i, p in enumerate(self.providers):
            label = f"{where}: providers[{i}] ({p.name!r})"
            if not p.tag:
                p.tag = _slugify(p.name)
            if p.tag.lower() in tags:
                raise ConfigError(f"{label}: duplicate tag {p.tag!r}")
            tags.add(p.tag.lower())
            if p.serving not in ("", "vllm", "sglang"):
                raise ConfigError(f"{label}: serving {p.serving!r} is not one of \"vllm\", "
                                  "\"sglang\" (or \"\": none)")
            if p.quantization not in QUANTIZATIONS:
                raise ConfigError(f"{label}: quantization {p.quantization!r} is not one of "
                                  f"{', '.join(sorted(QUANTIZATIONS))}")
            for key in ("prompt_price_per_m", "completion_price_per_m", "latency_s",
                        "tokens_per_second", "latency_jitter", "billed_price_factor"):
                if getattr(p, key) < 0:
                    raise ConfigError(f"{label}: {key} must be >= 0")
            if p.cache_read_price_per_m is not None and p.cache_read_price_per_m < 0:
                raise ConfigError(f"{label}: cache_read_price_per_m must be >= 0")
            _rate(p.cache_hit_rate, f"providers[{i}].cache_hit_rate", where)
            if p.latency_jitter > 1:
                raise ConfigError(f"{label}: latency_jitter must be in [0, 1]")
            if p.context_length < 1 or p.max_completion_tokens < 1:
                raise ConfigError(f"{label}: context_length and max_completion_tokens must be >= 1")
            for key in ("usage_completion_offset", "usage_prompt_offset",
                        "hidden_system_prompt_tokens"):
                value = getattr(p, key)
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ConfigError(f"{label}: {key} must be an integer, got {value!r}")
            _form_offsets(p.usage_completion_offsets, label)
            h = p.history_rendering_tokens
            if not isinstance(h, int) or isinstance(h, bool):
                raise ConfigError(f"{label}: history_rendering_tokens must be an integer, "
                                  f"got {h!r}")
            if p.hidden_system_prompt_tokens < 0:
                raise ConfigError(f"{label}: hidden_system_prompt_tokens must be >= 0")
            if (not isinstance(p.tools_rendering_tokens, int)
                    or isinstance(p.tools_rendering_tokens, bool)
                    or p.tools_rendering_tokens < 0):
                raise ConfigError(f"{label}: tools_rendering_tokens must be an integer >= 0, "
                                  f"got {p.tools_rendering_tokens!r}")
            _rate(p.prompt_drop_rate, f"providers[{i}].prompt_drop_rate", where)
            if (not isinstance(p.usage_noise, int | float) or isinstance(p.usage_noise, bool)
                    or not 0.0 <= p.usage_noise <= 1.0):
                raise ConfigError(f"{label}: usage_noise must be in [0, 1], got "
                                  f"{p.usage_noise!r}")
            _rates(p.faults, f"providers[{i}].faults", where)
            for key in ("schema_violation_rate", "actual_quantization_rate"):
                _rate(getattr(p, key), f"providers[{i}].{key}", where)
            if p.tool_call_rate is not None:
                _rate(p.tool_call_rate, f"providers[{i}].tool_call_rate", where)
            if p.actual_quantization and p.actual_quantization not in QUANTIZATIONS:
                raise ConfigError(f"{label}: actual_quantization {p.actual_quantization!r} is "
                                  f"not one of {', '.join(sorted(QUANTIZATIONS))}")
            for name, value in p.quirks.items():
                _rate(value, f"providers[{i}].quirks.{name}", where)
            unknown_models = set(p.models) - set(self.models)
            if unknown_models:
                raise ConfigError(f"{label}: models {sorted(unknown_models)} are not in the "
                                  f"served 'models' list")

    def _validate_outages(self, where: str) -> None:
        windows = []
        for i, o in enumerate(self.outages):
            if isinstance(o, dict):  # SimConfig(outages=[{...}]) from Python
                o = build_table(OutageWindow, o, f"outages[{i}]", where)
            if not isinstance(o, OutageWindow):
                raise ConfigError(f"{where}: outages[{i}] must be a table "
                                  "{start_s, duration_s, mode}")
            if not o.start_s >= 0:
                raise ConfigError(f"{where}: outages[{i}].start_s must be >= 0")
            if not o.duration_s > 0:
                raise ConfigError(f"{where}: outages[{i}].duration_s must be > 0")
            if o.mode not in ("refuse", "reset", "graceful"):
                raise ConfigError(f"{where}: outages[{i}].mode must be 'refuse', 'reset' or "
                                  f"'graceful', not {o.mode!r}")
            windows.append((o.start_s, i, o))
        self.outages = [o for _, _, o in sorted(windows, key=lambda w: w[:2])]
        for k in range(1, len(self.outages)):
            prev, cur = self.outages[k - 1], self.outages[k]
            if cur.start_s < prev.end_s:
                raise ConfigError(f"{where}: outages overlap: the window starting at "
                                  f"{cur.start_s:g} s begins before the one starting at "
                                  f"{prev.start_s:g} s ends ({prev.end_s:g} s)")

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["source"] = str(self.source) if self.source else None
        return data

    def dated(self, model: str) -> str:
        return f"{model}-{self.model_version}" if self.model_version else model


def load_sim_config(path: str | Path) -> SimConfig:
    """Read and validate a simulator TOML file."""
    path = Path(path)
    cfg = SimConfig.from_dict(read_toml(path, "sim config"), str(path))
    cfg.source = path
    if cfg.tokenizer != "demo":
        candidate = (path.parent / cfg.tokenizer).expanduser()
        if not Path(cfg.tokenizer).is_absolute() and candidate.exists():
            cfg.tokenizer = str(candidate)
    return cfg


def _provider(raw: Any, name: str, where: str) -> ProviderConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [{name}] must be a table")
    raw = dict(raw)
    faults = build_table(FaultRates, raw.pop("faults", {}), f"{name}.faults", where)
    quirks = build_table(QuirkRates, raw.pop("quirks", {}), f"{name}.quirks", where)
    p = build_table(ProviderConfig, raw, name, where)
    p.faults, p.quirks = faults, quirks
    return p


def _rate(value: float, key: str, where: str) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{where}: {key} must be a probability in [0, 1], got {value}")


def _rates(rates: FaultRates, key: str, where: str) -> None:
    total = 0.0
    for name, value in rates.items():
        _rate(value, f"{key}.{name}", where)
        total += value
    if total > 1.0 + 1e-9:
        raise ConfigError(f"{where}: the rates in [{key}] add up to {total:g}, more than 1")


def _iso(value: datetime.date) -> str:
    """A TOML date or date-time as ISO-8601 (UTC written as Z)."""
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _slugify(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "provider"


FORMS = ("plain", "reasoning", "tools", "reasoning+tools")


def _form_offsets(value: object, label: str) -> None:
    """`usage_completion_offsets`: {form: integer} over the answer forms."""
    if not isinstance(value, dict):
        raise ConfigError(f"{label}: usage_completion_offsets must be a table of answer forms "
                          f"({', '.join(FORMS)}) to integers, got {value!r}")
    for form, offset in value.items():
        if form not in FORMS:
            raise ConfigError(f"{label}: usage_completion_offsets: {form!r} is not an answer "
                              f"form ({', '.join(FORMS)})")
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise ConfigError(f"{label}: usage_completion_offsets.{form} must be an integer, "
                              f"got {offset!r}")

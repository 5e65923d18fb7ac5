"""Run configuration: one TOML file, validated into typed dataclasses with clear errors.

Relative paths (run_dir, dataset paths, a sim config) are resolved against the directory of the
config file, so a config and its data can move together. docs/config.md documents every key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import orjson

# OpenRouter's provider object: its keys and their checks (re-exported for the simulator)
from .errors import ConfigError
from .model_cards import GENERIC_TEMPERATURE, check_reasoning, silent_card, thinking_of
from .provider_object import PROVIDER_KEYS, QUANTIZATIONS, provider_problem  # noqa: F401


@dataclass
class TargetConfig:
    model: str
    tokenizer: str
    renderer: str = ""  # default chosen from the model name, see default_renderer()
    # The stack that serves the target, for how it renders history (specgen.render.serving):
    # "auto" = vllm for local engines (resolved at start), transformers otherwise.
    serving: Literal["auto", "transformers", "vllm", "sglang"] = "auto"
    # Template switches sent as `chat_template_kwargs` (vLLM/SGLang; over the `thinking` /
    # `enable_thinking` that [sampling] reasoning sets) and handed to the renderer the same way.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # How the Kimi encoder's long-run rule meets special tokens: "whole" (the tokenizer's own
    # `encode(text)`) or "split_special" (special tokens split off first, as vLLM, SGLang and
    # transformers' apply_chat_template tokenize). docs/tokenizers.md, "Which encode".
    encode: Literal["whole", "split_special"] = "whole"


@dataclass
class EndpointConfig:
    base_url: list[str]
    api_key_env: str | None = "OPENROUTER_API_KEY"
    concurrency: int = 256
    stream: bool = True
    provider: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    connect_timeout: float = 10.0
    first_byte_timeout: float = 300.0
    idle_timeout: float = 120.0
    total_timeout: float = 3600.0
    max_attempts: int = 6
    adaptive_concurrency: bool = True
    min_concurrency: int = 4
    # Ask vLLM/SGLang/sim for the true prompt+completion ids. None (unset) = on for servers
    # that are local engines: every base URL a local host and no OpenRouter-like endpoint
    # list (resolved at start, see specgen.engine.runner); off otherwise.
    return_token_ids: bool | None = None
    # "chat": /chat/completions with messages (the server renders the template);
    # "tokens": our renderer's prompt ids sent as a token prompt to a local engine (vLLM
    # /v1/completions, SGLang /generate), the sampled ids parsed back into the message.
    # "batch": the same chat requests sent through the provider's Batch API (docs/batch.md).
    mode: Literal["chat", "tokens", "batch"] = "chat"
    # Token-in API: "vllm" (/v1/completions), "sglang" (/generate); "auto" = vllm.
    token_api: Literal["auto", "vllm", "sglang"] = "auto"
    retry_base_delay: float = 1.0  # full-jitter exponential backoff: base and cap, seconds
    retry_max_delay: float = 60.0
    quarantine_retries: int = 0  # re-ask this many times when an answer is quarantined
    # GET /models/{model}/endpoints at start (quantizations, prices): "auto" = try, and carry
    # on without when the server has none; true = warn when it fails; false = never ask.
    fetch_endpoints: bool | Literal["auto"] = "auto"
    # Request dialect: "openrouter" (reasoning/provider/usage fields), "openai" (vLLM, SGLang:
    # chat_template_kwargs), or "auto": openrouter when the server lists endpoints (OpenRouter,
    # the simulator), else by the base URL (see specgen.request.dialect).
    dialect: Literal["auto", "openrouter", "openai"] = "auto"
    # Model slugs accepted in answers besides target.model and its dated slugs
    # (e.g. "moonshotai/kimi-k2.5-20260127"); any other model in an answer is rejected.
    accept_models: list[str] = field(default_factory=list)
    # While the endpoint is unreachable: the longest wait between probes, seconds.
    outage_probe_max: float = 30.0
    # Streams are read in batches, every connection once per tick (milliseconds; 0 = off:
    # every read as it lands, through aiohttp). See docs/client.md, "Batched stream reads".
    stream_tick_ms: float = 200.0
    # Unset (or true): HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY from the environment;
    # "http://host:port": every URL through it (NO_PROXY still applies); false: always direct.
    # docs/client.md, "Proxies". Credentials belong in the environment, not here.
    proxy: str | bool | None = None
    # mode = "batch" (docs/batch.md): the API, the lines and bytes per batch, the provider's
    # completion window, what to do with lines a batch could not answer, how often to poll.
    batch_api: Literal["openai", "openrouter"] = "openai"
    batch_max_requests: int = 5000
    batch_max_bytes: int = 100_000_000
    completion_window: str = "24h"
    batch_fallback: Literal["none", "live"] = "none"
    batch_poll_interval: float = 30.0
    batch_linger_s: float = 5.0  # wait this long for more requests before submitting
    # where a provider differs from OpenAI: the paths under base_url, the upload's purpose
    batch_files_path: str = "files"
    batch_batches_path: str = "batches"
    batch_file_purpose: str = "batch"
    # The most text one answer may hold (content + reasoning + tool-call arguments, UTF-8
    # bytes): a stream is cut there and the answer quarantined `answer_too_large`.
    max_answer_bytes: int = 4 * 1024 * 1024

    @property
    def is_sim(self) -> bool:
        return self.base_url == ["sim"]

    @property
    def tokens_mode(self) -> bool:
        return self.mode == "tokens"

    @property
    def token_api_name(self) -> str:
        """`vllm` or `sglang` (what `token_api = "auto"` means)."""
        return "sglang" if self.token_api == "sglang" else "vllm"


@dataclass
class SamplingConfig:
    # Unset: the model card's value for the thinking mode (specgen.sampling), else 1.0.
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int = 16384
    reasoning: bool | dict[str, Any] = True
    seed: int | None = None
    stop: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # merged into the request body
    # Fill silent temperature / top_p from the model card (specgen.model_cards.MODEL_CARDS).
    # Unset = on, except for a store made before the key: it resumes as it was made (off).
    model_defaults: bool | None = None

    @property
    def thinking(self) -> bool:
        return thinking_of(self.reasoning)

    @property
    def model_defaults_on(self) -> bool:
        """`model_defaults`: unset means on (a store made before the key pins it off)."""
        return self.model_defaults is not False


@dataclass
class BudgetConfig:
    max_cost_usd: float | None = None
    # USD per million tokens; override (or stand in for) the prices the endpoint list gives.
    prompt_price_per_m: float | None = None
    completion_price_per_m: float | None = None
    # On a 402 weight_exceeds_budget (the request's worst case does not fit the key's credit),
    # retry with a max_tokens that fits instead of ending the task.
    shrink_max_tokens: bool = False
    # mode = "batch": the batch price as a share of the live price (None: 0.5).
    batch_price_factor: float | None = None


@dataclass
class DatasetConfig:
    name: str
    path: Path
    format: str = "auto"
    max_tokens: int | None = None
    token_budget: int | None = None
    limit: int | None = None
    turns: Literal["last", "all", "first"] = "last"
    skip_invalid: bool = False
    on_length: Literal["drop", "keep"] = "drop"
    split: str | None = None  # for HF datasets folders with several splits, and Hub datasets
    # `path = "hf://datasets/OWNER/NAME"` (specgen.sources.hub): the branch, tag or commit, and
    # the subset (the Hub's config name); the commit is pinned in the run at its first session
    revision: str | None = None
    subset: str | None = None
    weight: float | None = None
    # Rewrite tool-call ids to the model's native form (functions.{name}:{k}); None = on for
    # the Kimi renderers (see specgen.sources.toolids).
    native_tool_ids: bool | None = None
    # How recorded tool results are reused after the model's own calls: "strict", "name"
    # or "position" (specgen.planner, docs/datasets.md "Tool loops").
    tool_results: str = "name"
    # Sampling of this dataset's requests (specgen.sampling): a value, or a mix to draw from
    # per task (temperature) / per conversation (reasoning), with optional weights.
    temperature: float | list[float] | None = None
    temperature_weights: list[float] | None = None
    reasoning: bool | dict[str, Any] | list[Any] | None = None
    reasoning_weights: list[float] | None = None
    n: int = 1  # samples per prompt: n separate conversations, each its own sample(s)
    # The path as the config wrote it: what the result hash uses, so shards of one config run
    # from different directories or machines hash alike (and merge).
    path_as_written: str | None = field(default=None, init=False)
    # A Hub dataset's repo id, and (once resolved before the run) the local files it reads.
    hub: str | None = field(default=None, init=False)
    files: list[Path] | None = field(default=None, init=False)


@dataclass
class EngineConfig:
    """Tuning of the scheduler and store writer; none of it changes results."""

    commit_interval: float = 0.2  # seconds between store commits (at most)
    commit_rows: int = 500  # commit early once this many rows are buffered
    admit_window: float = 2.0  # conversations admitted ahead, as a multiple of concurrency
    heartbeat_interval: float = 2.0  # seconds between session heartbeats in the store
    log_interval: float = 10.0  # seconds between plain progress lines (no TTY / log file)
    drain_timeout: float = 60.0  # on a first stop: wait this long for in-flight requests
    commit_thread: bool = True  # commit in a worker thread (the loop keeps serving sockets)
    outage_timeout: float = 1800.0  # seconds the endpoint may stay unreachable before stopping
    retry_after_cap: float = 300.0  # a Retry-After above this pauses the whole endpoint
    store_error_timeout: float = 600.0  # seconds answers are held while commits fail
    ballast_mb: float = 64.0  # MB reserved in the run dir at start, freed when the disk fills
    # "auto": uvloop when installed (the `fast` extra), else asyncio's own loop
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"


@dataclass
class QualityConfig:
    """What a sample must show to be kept (docs/quality.md)."""

    count_witness: bool = True  # check every sample against the provider's own token counts
    # a sample whose counts contradict ours: quarantined (default), or stored as a
    # `mismatch` that no default export includes ("flag" warns once per provider, "keep" not)
    on_count_mismatch: Literal["quarantine", "flag", "keep"] = "quarantine"
    require_witness: bool = False  # drop samples no count backs (`unverified`)
    # Provider policing (docs/quality.md, "Provider policing"): rolling figures per provider
    # over the last `window` answers; with auto_exclude, a provider past a threshold (with at
    # least `min_samples` answers behind the figure) is added to provider.ignore.
    auto_exclude: bool = False
    # the samples of a provider excluded automatically are made again by the providers that
    # remain (engine.redo): true (automatic exclusions), "all" (also `specgen provider
    # --exclude`), false (never; exports just leave them out)
    redo_excluded: bool | Literal["all"] = True
    window: int = 200  # recent answers per provider (and per dataset, for the alarms)
    min_samples: int = 20
    min_schema_accuracy: float = 0.9
    min_count_agreement: float = 0.9
    max_quarantine_rate: float = 0.2
    max_mismatch_rate: float = 0.2
    # exit 0 means samples: a run that kept less than this share of its answered tasks ends
    # `unproductive` (exit 6, specgen.judgement)
    min_kept_share: float = 0.5
    # Alarms per dataset (docs/quality.md, "Alarms"): what happens when one fires, and each
    # alarm's threshold / min_samples / false (quality.alarms.ALARMS holds the defaults).
    on_alarm: Literal["stop", "pause_dataset", "warn"] = "stop"
    alarms: dict[str, Any] | bool = field(default_factory=dict)
    # repetition loops in the sampled ids (quality.repetition): false, tokens, or
    # {tokens, period, action = "flag" | "quarantine"}; flagged at 64+ tokens by default
    repetition: dict[str, Any] | bool | int = field(default_factory=dict)
    # a probe.json (`specgen probe`): each provider's prompt delta per request shape, known
    # from the run's first answer on (docs/quality.md, "Two sides")
    witness_from: Path | None = None


@dataclass
class SimSection:
    config: Path | None = None
    seed: int = 0


@dataclass
class RunConfig:
    run_dir: Path
    target: TargetConfig
    endpoint: EndpointConfig
    datasets: list[DatasetConfig]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    sim: SimSection = field(default_factory=SimSection)
    quality: QualityConfig = field(default_factory=QualityConfig)
    source: Path | None = None  # the TOML file this came from

    def dataset(self, name: str) -> DatasetConfig:
        for d in self.datasets:
            if d.name == name:
                return d
        raise KeyError(name)

    def max_tokens_for(self, ds: DatasetConfig) -> int:
        return ds.max_tokens if ds.max_tokens is not None else self.sampling.max_tokens

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form (paths as strings). Holds no secrets: keys live in the environment."""
        return _jsonable(dataclasses.asdict(self))

    def global_result_hash(self) -> str:
        """Hash of the run-wide settings that change what any answer would be: the model, the
        renderer and the sampling (max_tokens is per dataset, see dataset_result_hash).

        The tokenizer is identified by its fingerprint (checked separately), not its path.
        Budgets, limits, concurrency, timeouts, provider policy and the engine tuning are left
        out: changing them continues a run.
        """
        data = self.to_json()
        sampling = {k: v for k, v in data["sampling"].items()
                    if k not in ("max_tokens", "model_defaults")}
        # The model card that decides what the config leaves silent enters the hash: a run
        # whose samples follow a card never resumes under other defaults.
        card = silent_card(self.target.model, self.sampling.model_defaults_on,
                           self.sampling.temperature, self.sampling.top_p,
                           [d.temperature for d in self.datasets])
        if card:  # the model card decides what the config leaves silent: say which
            sampling["model_card"] = card
        elif sampling["temperature"] is None:  # silent meant 1.0 before the model cards
            sampling["temperature"] = GENERIC_TEMPERATURE
        target = {k: v for k, v in data["target"].items() if k != "tokenizer"
                  and not (k == "serving" and v == "auto")  # runs made before the keys
                  and not (k == "chat_template_kwargs" and not v)
                  and not (k == "encode" and v == "whole")}
        return _hash({"target": target, "sampling": sampling})

    def dataset_result_hash(self, ds: DatasetConfig) -> str:
        """Hash of one dataset's settings that change its results (source, format, turns,
        effective max_tokens, on_length, split, native_tool_ids, tool_results)."""
        d = _jsonable(dataclasses.asdict(ds))
        keep = {k: d[k] for k in RESULT_DATASET_KEYS}
        if ds.path_as_written is not None:
            keep["path"] = ds.path_as_written
        keep["max_tokens"] = self.max_tokens_for(ds)
        if keep["tool_results"] == "name":
            del keep["tool_results"]  # the default: runs made before the key still resume
        for key in SAMPLING_DATASET_KEYS + HUB_DATASET_KEYS:  # only when set: runs made
            if d[key] is not None and not (key == "n" and d[key] == 1):  # before them resume
                keep[key] = d[key]
        return _hash(keep)

    def result_hash(self) -> str:
        """Hash of everything that changes what a task's result would be (global settings and
        every dataset's). Stored in the run's meta as `config_hash`."""
        return _hash({
            "global": self.global_result_hash(),
            "datasets": {d.name: self.dataset_result_hash(d) for d in self.datasets},
        })


RESULT_DATASET_KEYS = ("path", "format", "max_tokens", "turns", "on_length", "split",
                       "native_tool_ids", "tool_results")
# Per-dataset sampling keys (change results; hashed only when set, see dataset_result_hash).
SAMPLING_DATASET_KEYS = ("temperature", "temperature_weights", "reasoning",
                         "reasoning_weights", "n")
HUB_DATASET_KEYS = ("revision", "subset")


def _hash(obj: Any) -> str:
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()


def default_renderer(model: str) -> str:
    m = model.lower()
    if "k2.5" in m or "k2-5" in m or "k2.6" in m:
        return "kimi-k2.5"
    if "k2-thinking" in m:
        return "kimi-k2-thinking"
    if "kimi-k2" in m:
        return "kimi-k2-instruct"
    return "hf"


def read_toml(path: Path, what: str = "config") -> dict[str, Any]:
    """A TOML file's tables; a missing file or bad TOML is a `ConfigError` naming the file."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def load_config(path: str | os.PathLike[str]) -> RunConfig:
    """Read and validate a run config TOML file."""
    path = Path(path)
    return parse_config(read_toml(path), path)


EMPTY_PROBE_BYTES = 64 * 1024  # how much of a JSONL file empty_datasets() reads at most


def empty_datasets(cfg: RunConfig) -> list[DatasetConfig]:
    """The datasets whose file is empty: size 0, or a JSONL file (`.jsonl`/`.ndjson`, also
    gzipped) whose lines are all blank. Cheap: looks at the file size and at most the first
    EMPTY_PROBE_BYTES of a JSONL file; folders, Parquet and other files are never reported
    (unless of size 0). An empty dataset is not an error: the run warns and goes on."""
    out = []
    for ds in cfg.datasets:
        try:
            if _file_is_empty(Path(ds.path)):
                out.append(ds)
        except OSError:
            continue  # unreadable: the dataset reader reports it with its own error
    return out


def _file_is_empty(path: Path) -> bool:
    if not path.is_file():
        return False
    size = path.stat().st_size
    if size == 0:
        return True
    name = path.name.lower()
    if name.endswith((".jsonl", ".ndjson")):
        if size > EMPTY_PROBE_BYTES:
            return False
        with open(path, "rb") as f:
            head = f.read(EMPTY_PROBE_BYTES)
    elif name.endswith((".jsonl.gz", ".ndjson.gz")):
        import gzip
        import zlib

        try:
            with gzip.open(path, "rb") as f:
                head = f.read(EMPTY_PROBE_BYTES + 1)
        except (EOFError, zlib.error, gzip.BadGzipFile):
            return False  # a broken archive is the reader's error to report
        if len(head) > EMPTY_PROBE_BYTES:
            return False
    else:
        return False
    return not head.removeprefix(b"\xef\xbb\xbf").strip()


def parse_config(raw: dict[str, Any], path: Path) -> RunConfig:
    base = path.parent
    where = str(path)
    _check_finite(raw, "", where)
    raw = dict(raw)
    datasets_raw = raw.pop("dataset", None)
    if not datasets_raw:
        raise ConfigError(f"{where}: no [[dataset]] tables; a run needs at least one dataset")
    if not isinstance(datasets_raw, list):
        raise ConfigError(f"{where}: 'dataset' must be an array of tables ([[dataset]])")
    for key in ("target", "endpoint"):
        if key not in raw:
            raise ConfigError(f"{where}: missing required table [{key}]")

    endpoint_raw = dict(_table(raw.get("endpoint"), "endpoint", where))
    base_url = endpoint_raw.get("base_url")
    if isinstance(base_url, str):
        endpoint_raw["base_url"] = [base_url]
    provider = endpoint_raw.get("provider", {})
    _check_provider(provider, where)

    unknown = set(raw) - TOP_LEVEL_KEYS
    if unknown:
        raise ConfigError(
            f"{where}: unknown top-level key(s): {', '.join(sorted(unknown))}"
            f"{did_you_mean(unknown, TOP_LEVEL_KEYS | {'dataset'})} "
            f"(known: {', '.join(sorted(TOP_LEVEL_KEYS | {'dataset'}))})"
        )
    cfg = RunConfig(
        run_dir=_resolve(base, _require(raw, "run_dir", str, where)),
        target=build_table(TargetConfig, raw.get("target"), "target", where),
        endpoint=build_table(EndpointConfig, endpoint_raw, "endpoint", where),
        sampling=build_table(SamplingConfig, raw.get("sampling", {}), "sampling", where),
        budget=build_table(BudgetConfig, raw.get("budget", {}), "budget", where),
        engine=build_table(EngineConfig, raw.get("engine", {}), "engine", where),
        sim=build_table(SimSection, raw.get("sim", {}), "sim", where),
        quality=build_table(QualityConfig, raw.get("quality", {}), "quality", where),
        datasets=[
            build_table(DatasetConfig, d, f"dataset[{i}]", where) for i, d in enumerate(datasets_raw)
        ],
        source=path,
    )
    _validate_target(cfg, base, where)
    _validate_endpoint(cfg.endpoint, where)
    if cfg.endpoint.mode == "batch":
        from .batch_config import check_batch

        check_batch(cfg, endpoint_raw, where)
    if cfg.target.chat_template_kwargs and openrouter_dialect(cfg.endpoint):
        raise ConfigError(f"{where}: target.chat_template_kwargs is sent only to vLLM/SGLang-"
                          "style servers (dialect openai); OpenRouter and the simulator take "
                          "[sampling] reasoning instead")
    _validate_sampling(cfg.sampling, where)
    _validate_numbers(cfg, where)
    _validate_quality(cfg.quality, where)
    _check_sampling_values(cfg.sampling, where)
    if cfg.quality.witness_from is not None:
        cfg.quality.witness_from = _resolve(base, cfg.quality.witness_from)
        if not cfg.quality.witness_from.is_file():
            raise ConfigError(f"{where}: quality.witness_from: no file "
                              f"{cfg.quality.witness_from} (a probe.json of `specgen probe`)")
        from .quality.witness_from import read_deltas

        try:
            read_deltas(cfg.quality.witness_from)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if cfg.sim.config is not None:
        cfg.sim.config = _resolve(base, cfg.sim.config)
        if not cfg.sim.config.is_file():
            raise ConfigError(f"{where}: sim.config {str(cfg.sim.config)!r} does not exist")
    names = set()
    for i, ds in enumerate(cfg.datasets):
        label = f"{where}: dataset[{i}] ({ds.name!r})"
        if not ds.name or not ds.name.strip():
            raise ConfigError(f"{where}: dataset[{i}]: name must not be empty")
        if ds.name in names:
            raise ConfigError(f"{label}: duplicate dataset name")
        names.add(ds.name)
        written = datasets_raw[i].get("path") if isinstance(datasets_raw[i], dict) else None
        if isinstance(written, str) and written.startswith("hf://"):
            _hub_dataset(ds, written, label)
        elif ds.revision is not None or ds.subset is not None:
            raise ConfigError(f"{label}: revision and subset are for Hub datasets "
                              "(path = \"hf://datasets/OWNER/NAME\")")
        else:
            ds.path_as_written = str(ds.path)
            ds.path = _resolve(base, ds.path)
        if ds.hub is None and not ds.path.exists():
            raise ConfigError(f"{label}: path {str(ds.path)!r} does not exist")
        from .sources.files import check_readable

        if (unreadable := check_readable(ds.path)) is not None:
            raise ConfigError(f"{label}: path {unreadable}")
        if ds.format != "auto":
            from .sources.formats import FORMATS

            if ds.format not in FORMATS:
                raise ConfigError(f"{label}: format {ds.format!r} is unknown (auto, "
                                  f"{', '.join(sorted(FORMATS))})")
        if ds.turns not in ("last", "all", "first"):
            raise ConfigError(f"{label}: turns must be 'last', 'all' or 'first', not {ds.turns!r}")
        if ds.on_length not in ("drop", "keep"):
            raise ConfigError(f"{label}: on_length must be 'drop' or 'keep', not {ds.on_length!r}")
        _check_tool_results(ds.tool_results, label)
        for key in ("max_tokens", "token_budget", "limit"):
            value = getattr(ds, key)
            if value is not None and value < (0 if key != "max_tokens" else 1):
                raise ConfigError(f"{label}: {key} must be positive, got {value}")
        if ds.weight is not None and not ds.weight > 0:
            raise ConfigError(f"{label}: weight must be > 0, got {ds.weight}")
        worst = cfg.max_tokens_for(ds)
        if ds.token_budget and isinstance(worst, int) and ds.token_budget < worst:
            raise ConfigError(
                f"{label}: token_budget {ds.token_budget} is smaller than one request's worst "
                f"case (max_tokens {worst}): a request in flight is counted at its max_tokens, "
                "so nothing would ever be sent; raise token_budget or lower max_tokens")
        _check_dataset_sampling(ds, label)
    return cfg


def _hub_dataset(ds: DatasetConfig, written: str, label: str) -> None:
    """`path = "hf://datasets/OWNER/NAME"`: resolved before the run (specgen.engine.hub_pin);
    until then `path` is a placeholder that names the repo."""
    from .sources.hub import HubError, hub_repo

    try:
        ds.hub = hub_repo(written)
    except HubError as exc:
        raise ConfigError(f"{label}: path {exc}") from None
    for key in ("revision", "subset", "split"):
        value = getattr(ds, key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(f"{label}: {key} must be a non-empty string")
    ds.path_as_written = written
    ds.path = Path(written)


def _validate_quality(q: QualityConfig, where: str) -> None:
    """Policing thresholds are shares, counts are positive, alarms parse (quality.alarms)."""
    from .quality.alarms import alarm_rules
    from .quality.repetition import repetition_rule

    repetition_rule(q.repetition, where)
    for key in ("min_schema_accuracy", "min_count_agreement", "max_quarantine_rate",
                "max_mismatch_rate", "min_kept_share"):
        value = getattr(q, key)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{where}: quality.{key} must be a share in [0, 1], got {value}")
    for key in ("window", "min_samples"):
        if getattr(q, key) < 1:
            raise ConfigError(f"{where}: quality.{key} must be >= 1, got {getattr(q, key)}")
    if q.min_samples > q.window:
        raise ConfigError(f"{where}: quality.min_samples ({q.min_samples}) is larger than "
                          f"quality.window ({q.window}): no figure could ever be judged")
    rules = alarm_rules(q.alarms, where)
    for name, rule in rules.items():
        if rule.min_samples > q.window:
            raise ConfigError(f"{where}: quality.alarms.{name}.min_samples ({rule.min_samples}) "
                              f"is larger than quality.window ({q.window})")


def _check_dataset_sampling(ds: DatasetConfig, label: str) -> None:
    """A dataset's sampling values and mixes (specgen.sampling)."""
    if ds.n < 1:
        raise ConfigError(f"{label}: n (samples per prompt) must be >= 1, got {ds.n}")
    temps = ds.temperature if isinstance(ds.temperature, list) else (
        [] if ds.temperature is None else [ds.temperature])
    for i, t in enumerate(temps):
        key = f"temperature[{i}]" if isinstance(ds.temperature, list) else "temperature"
        if not 0 <= t <= 2:
            raise ConfigError(f"{label}: {key} must be between 0 and 2, got {t}")
    mixes = (("temperature", ds.temperature, ds.temperature_weights),
             ("reasoning", ds.reasoning, ds.reasoning_weights))
    for name, values, weights in mixes:
        if isinstance(values, list) and not values:
            raise ConfigError(f"{label}: {name} = [] has nothing to draw from; give one value "
                              "or several")
        if weights is None:
            continue
        if not isinstance(values, list):
            raise ConfigError(f"{label}: {name}_weights needs {name} to be a list of values "
                              f"to draw from, e.g. {name} = [a, b] and {name}_weights = [3, 1]")
        if len(weights) != len(values):
            raise ConfigError(f"{label}: {name}_weights has {len(weights)} weight(s) for "
                              f"{len(values)} {name} value(s); give one weight per value")
        for i, w in enumerate(weights):
            if not w > 0:
                raise ConfigError(f"{label}: {name}_weights[{i}] must be > 0, got {w}")
    values = ds.reasoning if isinstance(ds.reasoning, list) else (
        [] if ds.reasoning is None else [ds.reasoning])
    for i, r in enumerate(values):
        key = f"reasoning[{i}]" if isinstance(ds.reasoning, list) else "reasoning"
        problem = check_reasoning(r, key)
        if problem:
            raise ConfigError(f"{label}: {problem}")


def _check_tool_results(value: str, label: str) -> None:
    from .planner import TOOL_RESULT_POLICIES

    if value not in TOOL_RESULT_POLICIES:
        raise ConfigError(f"{label}: tool_results must be one of "
                          f"{', '.join(map(repr, TOOL_RESULT_POLICIES))}, not {value!r}")


TOP_LEVEL_KEYS = {"run_dir", "target", "endpoint", "sampling", "budget", "engine", "sim",
                  "quality"}
SECRET_HEADERS = {"authorization", "x-api-key", "api-key", "proxy-authorization", "cookie"}


def _validate_target(cfg: RunConfig, base: Path, where: str) -> None:
    from .render import RENDERERS, RESERVED_TEMPLATE_KEYS

    if not cfg.target.model.strip():
        raise ConfigError(f"{where}: target.model must not be empty")
    if not cfg.target.renderer:
        cfg.target.renderer = default_renderer(cfg.target.model)
    if cfg.target.renderer not in RENDERERS:
        raise ConfigError(
            f"{where}: target.renderer {cfg.target.renderer!r} is unknown "
            f"(known: {', '.join(sorted(RENDERERS))})"
        )
    kwargs = cfg.target.chat_template_kwargs
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{where}: target.chat_template_kwargs must be a table of template "
                          f"switches, e.g. {{ thinking = false }}, not {type(kwargs).__name__}")
    reserved = sorted(RESERVED_TEMPLATE_KEYS & set(kwargs))
    if reserved:
        raise ConfigError(f"{where}: target.chat_template_kwargs cannot set {', '.join(reserved)} "
                          "(the server sets them from the request)")
    tok = cfg.target.tokenizer
    if tok != "demo" and not _looks_remote(tok):
        resolved = _resolve(base, tok)
        if not resolved.exists():
            raise ConfigError(
                f"{where}: target.tokenizer {str(resolved)!r} does not exist "
                "(a model dir, a hub id 'owner/name', or \"demo\")"
            )
        cfg.target.tokenizer = str(resolved)


def openrouter_dialect(ep: EndpointConfig) -> bool:
    """Whether requests certainly go out in the openrouter dialect (by setting or URL)."""
    return ep.dialect == "openrouter" or (ep.dialect == "auto" and (
        ep.is_sim or any(is_openrouter_url(u) for u in ep.base_url)))


def is_openrouter_url(base_url: str) -> bool:
    """Whether a base URL is OpenRouter's (openrouter.ai or a subdomain of it)."""
    host = (urlsplit(base_url).hostname or "").lower()
    return host == "openrouter.ai" or host.endswith(".openrouter.ai")


def _validate_endpoint(ep: EndpointConfig, where: str) -> None:
    if not ep.base_url:
        raise ConfigError(f"{where}: endpoint.base_url must not be empty")
    if "sim" in ep.base_url and len(ep.base_url) > 1:
        raise ConfigError(f"{where}: endpoint.base_url \"sim\" cannot be combined with URLs")
    for i, url in enumerate(ep.base_url):
        key = "endpoint.base_url" if len(ep.base_url) == 1 else f"endpoint.base_url[{i}]"
        _check_url_secrets(url, key, ep.api_key_env, where)
        if url != "sim" and not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"{where}: {key} {url!r} must start with http:// or https:// "
                "(or be \"sim\")"
            )
    for name in ep.headers:
        low = name.lower()
        if low in SECRET_HEADERS:
            raise ConfigError(
                f"{where}: endpoint.headers.{name}: secrets do not belong in the config file "
                "(it is copied into the run store); put the key in the environment variable "
                "named by endpoint.api_key_env"
            )
        if low.startswith(CACHE_HEADER_PREFIX):
            raise ConfigError(
                f"{where}: endpoint.headers.{name} turns on OpenRouter's response cache: "
                "identical prompts would get a replayed (cached) answer instead of a new "
                "sample from the model, so the training data would hold copies, not the "
                "model's own samples; remove the header"
            )
        if not isinstance(ep.headers[name], str):
            raise ConfigError(f"{where}: endpoint.headers.{name} must be a string")
    if ep.mode == "tokens":
        if any(is_openrouter_url(u) for u in ep.base_url) or ep.dialect == "openrouter":
            raise ConfigError(
                f"{where}: endpoint.mode = \"tokens\" sends token-id prompts, which only local "
                "engines take (vLLM /v1/completions, SGLang /generate); OpenRouter takes chat "
                "messages: use mode = \"chat\" there")
    for i, slug in enumerate(ep.accept_models):
        if not slug.strip():
            raise ConfigError(f"{where}: endpoint.accept_models[{i}] must not be empty")
    if ep.api_key_env is not None and not ep.api_key_env.strip():
        ep.api_key_env = None  # "" = send no key (local servers)
    elif ep.api_key_env is not None and not ENV_NAME.fullmatch(ep.api_key_env.strip()):
        raise ConfigError(  # the value is not shown: it may be the key itself
            f"{where}: endpoint.api_key_env must be the NAME of an environment variable "
            "(letters, digits, _), e.g. \"OPENROUTER_API_KEY\", not the key itself; export "
            "the key in that variable"
        )


# A query or fragment parameter with one of these names (or ending like one) holds a secret.
SECRET_PARAMS = {
    "key", "api_key", "apikey", "api-key", "token", "access_token", "auth", "auth_token",
    "secret", "client_secret", "password", "passwd", "pwd", "sig", "signature", "bearer",
    "credential", "credentials", "cred", "creds", "authorization", "session",
}
SECRET_PARAM_ENDINGS = ("_key", "-key", "apikey", "token", "secret", "password", "credential",
                        "credentials")
# A path segment that looks like a key: a known key prefix, or a long token of letters and
# digits (an API key pasted into the path, `/sk-or-v1-…/v1`).
SECRET_SEGMENT = re.compile(r"(?:sk|pk|rk)[-_].{8,}|(?:ghp|gho|ghs|hf|xox[abprs])_.{8,}"
                            r"|AKIA[0-9A-Z]{12,}|Bearer.*", re.IGNORECASE)
LONG_TOKEN = re.compile(r"[A-Za-z0-9_\-]{32,}")
CACHE_HEADER_PREFIX = "x-openrouter-cache"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _secret_param(name: str) -> bool:
    n = name.strip().lower()
    return n in SECRET_PARAMS or n.endswith(SECRET_PARAM_ENDINGS)


def _redact_params(text: str) -> tuple[str, bool]:
    """`a=1&key=s3cret` -> (`a=1&key=***`, True): the values of secret-like parameters hidden."""
    parts, found = [], False
    for part in re.split(r"([&;])", text):
        name, eq, _value = part.partition("=")
        if part not in ("&", ";") and _secret_param(name):
            found = True
            part = f"{name}{eq}***"
        parts.append(part)
    return "".join(parts), found


def _secret_segment(segment: str) -> bool:
    s = unquote(segment)
    if SECRET_SEGMENT.fullmatch(s):
        return True
    return bool(LONG_TOKEN.fullmatch(s)) and any(c.isdigit() for c in s) and any(
        c.isalpha() for c in s)


def _redact_path(path: str) -> tuple[str, bool]:
    """The path with key-like segments and secret `;name=value` parameters hidden."""
    out, found = [], False
    for segment in path.split("/"):
        head, semi, params = segment.partition(";")
        if _secret_segment(head):
            head, found = "***", True
        if semi:
            params, p_found = _redact_params(params)
            found = found or p_found
        out.append(head + semi + params)
    return "/".join(out), found


def redact_url(url: str) -> tuple[str, bool]:
    """The URL with any userinfo and secret-like query/fragment values replaced by `***`, and
    whether there was any. Never raises (a URL that cannot be parsed is hidden entirely)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***", "@" in url or "=" in url
    found = False
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
        found = True
    path, p_found = _redact_path(parts.path)
    query, q_found = _redact_params(parts.query) if parts.query else ("", False)
    fragment, f_found = _redact_params(parts.fragment) if parts.fragment else ("", False)
    found = found or p_found or q_found or f_found
    if not found:
        return url, False
    out = f"{parts.scheme}://{netloc}{path}" if parts.scheme else f"{netloc}{path}"
    if parts.query:
        out += "?" + query
    if parts.fragment:
        out += "#" + fragment
    return out, True


def _check_url_secrets(url: str, key: str, api_key_env: str | None, where: str) -> None:
    shown, secret = redact_url(url)
    if not secret:
        return
    env = api_key_env.strip() if api_key_env else ""
    named = f" ({env})" if ENV_NAME.fullmatch(env) else ""  # never echo a pasted key
    raise ConfigError(
        f"{where}: {key} {shown!r} carries credentials (a user:password@ part, a key-like "
        "path segment, or a key-like query or ;parameter); secrets do not belong in the config file (it is copied into the "
        "run store and its errors into logs): remove them from the URL and put the key in "
        f"the environment variable named by endpoint.api_key_env{named}"
    )


# [sampling] extra: keys that can never be overridden, and why each other refused key is
# refused (they would make the answers something other than this model's own samples).
PROTECTED_EXTRA = ("model", "messages", "tools")


def _validate_sampling(s: SamplingConfig, where: str) -> None:
    extra = s.extra
    for key in PROTECTED_EXTRA:
        if key in extra:
            what = {"model": "target.model", "messages": "the dataset's conversation",
                    "tools": "the dataset's tools"}[key]
            raise ConfigError(
                f"{where}: sampling.extra.{key} cannot be set: the request's {key!r} is "
                f"always {what} (remove it from [sampling] extra)"
            )
    if "models" in extra:
        raise ConfigError(
            f"{where}: sampling.extra.models turns on OpenRouter's fallback to other models: "
            "answers from another model would be stored as target.model's samples; remove "
            "it (provider fallback within the model is [endpoint.provider] allow_fallbacks; "
            "extra model slugs to accept are endpoint.accept_models)"
        )
    transforms = extra.get("transforms")
    if transforms is not None and transforms != []:
        raise ConfigError(
            f"{where}: sampling.extra.transforms = {transforms!r}: OpenRouter's transforms "
            "(e.g. \"middle-out\") compress the prompt, so the model would answer a prompt "
            "other than the one rendered into the training ids; remove it (or set it to [])"
        )
    plugins = extra.get("plugins")
    if isinstance(plugins, list):
        for i, plugin in enumerate(plugins):
            if isinstance(plugin, dict) and str(plugin.get("id", "")).lower() == "context-compression":
                raise ConfigError(
                    f"{where}: sampling.extra.plugins[{i}] is OpenRouter's "
                    "\"context-compression\" plugin: it shortens the prompt, so the model would "
                    "answer a prompt other than the one rendered into the training ids; remove it"
                )


def _check_sampling_values(s: SamplingConfig, where: str) -> None:
    if s.temperature is not None and not 0 <= s.temperature <= 2:
        raise ConfigError(f"{where}: sampling.temperature must be between 0 and 2, "
                          f"got {s.temperature}")
    if s.top_p is not None and not 0 < s.top_p <= 1:
        raise ConfigError(f"{where}: sampling.top_p must be in (0, 1], got {s.top_p}")
    problem = check_reasoning(s.reasoning, "sampling.reasoning")
    if problem:
        raise ConfigError(f"{where}: {problem}")


def _check_finite(value: Any, key: str, where: str) -> None:
    """NaN and +-inf are valid TOML but never a valid setting: refuse them at any depth."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where}: {key} must be a finite number, got {value!r}")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{key}.{k}" if key else str(k), where)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_finite(v, f"{key}[{i}]", where)


def _validate_numbers(cfg: RunConfig, where: str) -> None:
    ep, eng = cfg.endpoint, cfg.engine
    checks: list[tuple[str, float | int | None, float]] = [
        ("endpoint.concurrency", ep.concurrency, 1),
        ("endpoint.min_concurrency", ep.min_concurrency, 1),
        ("endpoint.max_attempts", ep.max_attempts, 1),
        ("endpoint.quarantine_retries", ep.quarantine_retries, 0),
        ("endpoint.retry_base_delay", ep.retry_base_delay, 0),
        ("endpoint.retry_max_delay", ep.retry_max_delay, 0),
        ("sampling.max_tokens", cfg.sampling.max_tokens, 1),
        ("budget.max_cost_usd", cfg.budget.max_cost_usd, 0),
        ("budget.prompt_price_per_m", cfg.budget.prompt_price_per_m, 0),
        ("budget.completion_price_per_m", cfg.budget.completion_price_per_m, 0),
        ("engine.commit_rows", eng.commit_rows, 1),
        ("engine.admit_window", eng.admit_window, 1),
        ("engine.drain_timeout", eng.drain_timeout, 0),
    ]
    for key, value, low in checks:
        if value is not None and value < low:
            raise ConfigError(f"{where}: {key} must be >= {low}, got {value}")
    for key in ("connect_timeout", "first_byte_timeout", "idle_timeout", "total_timeout"):
        if not getattr(ep, key) > 0:
            raise ConfigError(f"{where}: endpoint.{key} must be > 0 seconds")
    for key in ("commit_interval", "heartbeat_interval", "log_interval", "outage_timeout",
                "retry_after_cap", "store_error_timeout"):
        if not getattr(eng, key) > 0:
            raise ConfigError(f"{where}: engine.{key} must be > 0 seconds, got {getattr(eng, key)}")
    if not ep.outage_probe_max > 0:
        raise ConfigError(f"{where}: endpoint.outage_probe_max must be > 0 seconds, "
                          f"got {ep.outage_probe_max}")
    _check_proxy(ep.proxy, where)
    factor = cfg.budget.batch_price_factor  # checked in every mode: preview and reports use it
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, int | float)
                               or not 0.1 <= factor <= 1):
        raise ConfigError(f"{where}: budget.batch_price_factor must be between 0.1 and 1 (the "
                          f"batch price as a share of the live price), got {factor!r}")
    if not ep.stream_tick_ms >= 0:
        raise ConfigError(f"{where}: endpoint.stream_tick_ms must be >= 0 (0 = off), "
                          f"got {ep.stream_tick_ms}")
    if isinstance(ep.max_answer_bytes, bool) or not ep.max_answer_bytes > 0:
        raise ConfigError(f"{where}: endpoint.max_answer_bytes must be a number of bytes > 0, "
                          f"got {ep.max_answer_bytes!r}")
    if not eng.ballast_mb >= 0:
        raise ConfigError(f"{where}: engine.ballast_mb must be >= 0 (0 = none), "
                          f"got {eng.ballast_mb}")


def _looks_remote(spec: str) -> bool:
    """A hub id `owner/name` that is not an existing local path."""
    parts = spec.split("/")
    return len(parts) == 2 and not spec.startswith((".", "/", "~")) and not Path(spec).exists()


def _resolve(base: Path, value: str | Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p)


def _table(value: Any, name: str, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: [{name}] must be a table")
    return value


def _require(raw: dict[str, Any], key: str, typ: type, where: str) -> Any:
    if key not in raw:
        raise ConfigError(f"{where}: missing required key '{key}'")
    value = raw[key]
    if not isinstance(value, typ):
        raise ConfigError(f"{where}: '{key}' must be {typ.__name__}, got {type(value).__name__}")
    return value


def _check_provider(provider: Any, where: str) -> None:
    problem = provider_problem(provider)
    if problem:
        raise ConfigError(f"{where}: {problem}")


def _check_proxy(value: str | bool | None, where: str) -> None:
    """`endpoint.proxy`: an http:// URL without credentials (the config is copied into the
    run store), or a bool; unset: the environment's proxy variables, which must parse."""
    from specgen.proxy import ProxyChooser, ProxyError, parse_proxy
    if value is None:  # the environment's: a malformed HTTPS_PROXY is refused before a run
        try:
            ProxyChooser(None)
        except ProxyError as exc:
            raise ConfigError(f"{where}: the environment's proxy setting cannot be used: "
                              f"{exc} (fix or unset it, or set endpoint.proxy = false to go "
                              "direct)") from None
    if not isinstance(value, str):
        return
    try:
        proxy = parse_proxy(value, "endpoint.proxy")
    except ProxyError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if proxy.authorization:
        raise ConfigError(
            f"{where}: endpoint.proxy: credentials do not belong in the config file (it is "
            "copied into the run store); set HTTPS_PROXY / HTTP_PROXY with them in the "
            "environment instead and leave endpoint.proxy unset")


def did_you_mean(unknown, known) -> str:
    """" (did you mean `concurrency`?)" for mistyped keys close to a known one, else ""."""
    import difflib

    guesses = [f"`{m[0]}` for {k}" if len(unknown) > 1 else f"`{m[0]}`"
               for k in sorted(unknown)
               if (m := difflib.get_close_matches(k, list(known), n=1, cutoff=0.7))]
    return f" (did you mean {', '.join(guesses)}?)" if guesses else ""


def build_table(cls: type, raw: Any, name: str, where: str):
    """Instantiate dataclass `cls` from a TOML table, checking keys and types."""
    raw = _table(raw, name, where)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = set(raw) - set(fields)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) in [{name}]: {', '.join(sorted(unknown))}"
            f"{did_you_mean(unknown, fields)} (known: {', '.join(sorted(fields))})"
        )
    kwargs = {}
    for key, f in fields.items():
        if key not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{where}: missing required key '{name}.{key}'")
            continue
        kwargs[key] = _coerce(raw[key], hints[key], f"{name}.{key}", where)
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, key: str, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, where)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0] if len(errors) == 1 else ConfigError(
            f"{where}: '{key}' has the wrong type ({type(value).__name__}: {value!r})"
        )
    if origin is Literal:
        if value not in args:
            raise ConfigError(
                f"{where}: '{key}' must be one of {', '.join(map(repr, args))}, not {value!r}"
            )
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: '{key}' must be a list, got {type(value).__name__}")
        return [_coerce(v, args[0], f"{key}[{i}]", where) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: '{key}' must be a table, got {type(value).__name__}")
        return value
    if hint is Path:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: '{key}' must be a path string")
        return Path(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is Any:
        return value
    if hint in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{where}: '{key}' must be {hint.__name__}, got bool")
    if not isinstance(value, hint):
        raise ConfigError(
            f"{where}: '{key}' must be {hint.__name__}, got {type(value).__name__} ({value!r})"
        )
    return value


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj

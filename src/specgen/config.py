"""Run configuration: one TOML file, validated into typed dataclasses with clear errors.

Relative paths (run_dir, dataset paths, a sim config) are resolved against the directory of the
config file, so a config and its data can move together. docs/config.md documents every key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson


class ConfigError(ValueError):
    """The configuration is invalid; the message names the file and the key."""


PROVIDER_KEYS = {
    "order", "only", "ignore", "quantizations", "allow_fallbacks", "require_parameters",
    "data_collection", "sort", "max_price", "zdr", "enforce_distillable_text",
}
QUANTIZATIONS = {
    "int4", "int8", "fp4", "mxfp4", "nvfp4", "fp6", "fp8", "mxfp8", "fp16", "bf16", "fp32",
    "unknown",
}


@dataclass
class TargetConfig:
    model: str
    tokenizer: str
    renderer: str = ""  # default chosen from the model name, see default_renderer()


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
    return_token_ids: bool = False  # ask vLLM/SGLang/sim for the true prompt+completion ids
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

    @property
    def is_sim(self) -> bool:
        return self.base_url == ["sim"]


@dataclass
class SamplingConfig:
    temperature: float | None = 1.0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int = 16384
    reasoning: bool | dict[str, Any] = True
    seed: int | None = None
    stop: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # merged into the request body

    @property
    def thinking(self) -> bool:
        if isinstance(self.reasoning, dict):
            return bool(self.reasoning.get("enabled", True)) and not self.reasoning.get(
                "effort"
            ) == "none"
        return bool(self.reasoning)


@dataclass
class BudgetConfig:
    max_cost_usd: float | None = None
    # USD per million tokens; override (or stand in for) the prices the endpoint list gives.
    prompt_price_per_m: float | None = None
    completion_price_per_m: float | None = None


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
    split: str | None = None  # for HF datasets folders with several splits
    weight: float | None = None
    # Rewrite tool-call ids to the model's native form (functions.{name}:{k}); None = on for
    # the Kimi renderers (see specgen.sources.toolids).
    native_tool_ids: bool | None = None
    # The path as the config wrote it: what the result hash uses, so shards of one config run
    # from different directories or machines hash alike (and merge).
    path_as_written: str | None = field(default=None, init=False)


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
        sampling = {k: v for k, v in data["sampling"].items() if k != "max_tokens"}
        target = {k: v for k, v in data["target"].items() if k != "tokenizer"}
        return _hash({"target": target, "sampling": sampling})

    def dataset_result_hash(self, ds: DatasetConfig) -> str:
        """Hash of one dataset's settings that change its results (source, format, turns,
        effective max_tokens, on_length, split)."""
        d = _jsonable(dataclasses.asdict(ds))
        keep = {k: d[k] for k in RESULT_DATASET_KEYS}
        if ds.path_as_written is not None:
            keep["path"] = ds.path_as_written
        keep["max_tokens"] = self.max_tokens_for(ds)
        return _hash(keep)

    def result_hash(self) -> str:
        """Hash of everything that changes what a task's result would be (global settings and
        every dataset's). Stored in the run's meta as `config_hash`."""
        return _hash({
            "global": self.global_result_hash(),
            "datasets": {d.name: self.dataset_result_hash(d) for d in self.datasets},
        })


RESULT_DATASET_KEYS = ("path", "format", "max_tokens", "turns", "on_length", "split",
                       "native_tool_ids")


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


def parse_config(raw: dict[str, Any], path: Path) -> RunConfig:
    base = path.parent
    where = str(path)
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
            f"{where}: unknown top-level key(s): {', '.join(sorted(unknown))} "
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
        datasets=[
            build_table(DatasetConfig, d, f"dataset[{i}]", where) for i, d in enumerate(datasets_raw)
        ],
        source=path,
    )
    _validate_target(cfg, base, where)
    _validate_endpoint(cfg.endpoint, where)
    _validate_numbers(cfg, where)
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
        ds.path_as_written = str(ds.path)
        ds.path = _resolve(base, ds.path)
        if not ds.path.exists():
            raise ConfigError(f"{label}: path {str(ds.path)!r} does not exist")
        if ds.format != "auto":
            from .sources.formats import FORMATS

            if ds.format not in FORMATS:
                raise ConfigError(f"{label}: format {ds.format!r} is unknown (auto, "
                                  f"{', '.join(sorted(FORMATS))})")
        if ds.turns not in ("last", "all", "first"):
            raise ConfigError(f"{label}: turns must be 'last', 'all' or 'first', not {ds.turns!r}")
        if ds.on_length not in ("drop", "keep"):
            raise ConfigError(f"{label}: on_length must be 'drop' or 'keep', not {ds.on_length!r}")
        for key in ("max_tokens", "token_budget", "limit"):
            value = getattr(ds, key)
            if value is not None and value < (0 if key != "max_tokens" else 1):
                raise ConfigError(f"{label}: {key} must be positive, got {value}")
        if ds.weight is not None and not ds.weight > 0:
            raise ConfigError(f"{label}: weight must be > 0, got {ds.weight}")
    return cfg


TOP_LEVEL_KEYS = {"run_dir", "target", "endpoint", "sampling", "budget", "engine", "sim"}
SECRET_HEADERS = {"authorization", "x-api-key", "api-key", "proxy-authorization", "cookie"}


def _validate_target(cfg: RunConfig, base: Path, where: str) -> None:
    from .render import RENDERERS

    if not cfg.target.model.strip():
        raise ConfigError(f"{where}: target.model must not be empty")
    if not cfg.target.renderer:
        cfg.target.renderer = default_renderer(cfg.target.model)
    if cfg.target.renderer not in RENDERERS:
        raise ConfigError(
            f"{where}: target.renderer {cfg.target.renderer!r} is unknown "
            f"(known: {', '.join(sorted(RENDERERS))})"
        )
    tok = cfg.target.tokenizer
    if tok != "demo" and not _looks_remote(tok):
        resolved = _resolve(base, tok)
        if not resolved.exists():
            raise ConfigError(
                f"{where}: target.tokenizer {str(resolved)!r} does not exist "
                "(a model dir, a hub id 'owner/name', or \"demo\")"
            )
        cfg.target.tokenizer = str(resolved)


def _validate_endpoint(ep: EndpointConfig, where: str) -> None:
    if not ep.base_url:
        raise ConfigError(f"{where}: endpoint.base_url must not be empty")
    if "sim" in ep.base_url and len(ep.base_url) > 1:
        raise ConfigError(f"{where}: endpoint.base_url \"sim\" cannot be combined with URLs")
    for url in ep.base_url:
        if url != "sim" and not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"{where}: endpoint.base_url {url!r} must start with http:// or https:// "
                "(or be \"sim\")"
            )
    for name in ep.headers:
        if name.lower() in SECRET_HEADERS:
            raise ConfigError(
                f"{where}: endpoint.headers.{name}: secrets do not belong in the config file "
                "(it is copied into the run store); put the key in the environment variable "
                "named by endpoint.api_key_env"
            )
        if not isinstance(ep.headers[name], str):
            raise ConfigError(f"{where}: endpoint.headers.{name} must be a string")
    if ep.api_key_env is not None and not ep.api_key_env.strip():
        ep.api_key_env = None  # "" = send no key (local servers)


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
    for key in ("commit_interval", "heartbeat_interval", "log_interval"):
        if not getattr(eng, key) > 0:
            raise ConfigError(f"{where}: engine.{key} must be > 0 seconds")


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
    if not isinstance(provider, dict):
        raise ConfigError(f"{where}: [endpoint.provider] must be a table")
    unknown = set(provider) - PROVIDER_KEYS
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) in [endpoint.provider]: {', '.join(sorted(unknown))} "
            f"(OpenRouter accepts: {', '.join(sorted(PROVIDER_KEYS))})"
        )
    for key in ("order", "only", "ignore", "quantizations"):
        if key in provider and not (
            isinstance(provider[key], list) and all(isinstance(x, str) for x in provider[key])
        ):
            raise ConfigError(f"{where}: endpoint.provider.{key} must be a list of strings")
    bad = set(provider.get("quantizations", [])) - QUANTIZATIONS
    if bad:
        raise ConfigError(
            f"{where}: endpoint.provider.quantizations has unknown value(s) {sorted(bad)}; "
            f"known: {', '.join(sorted(QUANTIZATIONS))}"
        )


def build_table(cls: type, raw: Any, name: str, where: str):
    """Instantiate dataclass `cls` from a TOML table, checking keys and types."""
    raw = _table(raw, name, where)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = set(raw) - set(fields)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) in [{name}]: {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(fields))})"
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

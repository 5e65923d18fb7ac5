"""What a run would send, without sending anything: `specgen preview` (docs/datasets.md).

For each dataset: rows read and skipped (with reasons), whether tools were found, the planned
requests with their prompt-token counts, the worst-case cost from `max_tokens` and known
prices, and a few sample conversations with the exact request body and the token ids (prompt
loss mask 0, answer loss mask 1) the target would see.

Fully offline by default: no API call, no run directory. Token counts cover the first `scan`
rows; when the dataset is longer they are extrapolated by its row count (cheap for JSONL,
Parquet and Arrow; JSON is parsed to the end to count). Prices come from `[budget]`, else
from the simulator's providers (`base_url = "sim"`), else from the OpenRouter endpoint list
only when asked (`fetch_prices=True`, a free GET); otherwise the cost is unknown.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .client.tokens import token_url
from .config import SAMPLING_DATASET_KEYS, DatasetConfig, RunConfig
from .conversation import AssistantMessage, Conversation
from .planner import DEFAULT_TOOL_RESULTS, End, TurnRequest, next_request
from .render.base import Renderer, RenderError
from .request import build_request, build_token_request, request_dialect
from .sampling import SampleSettings, run_defaults, sample_settings
from .sources import (
    Row,
    SourceError,
    count_rows,
    detect_dataset_format,
    iter_rows,
    source_files,
)
from .sources.files import iter_records

DEFAULT_SCAN = 2000
SECRET_HEADER = re.compile(r"auth|key|token|secret|cookie|password", re.I)
_TOOL_DUMP = re.compile(r'"(name|parameters)"\s*:')



class UnknownDataset(LookupError):
    """`preview --dataset NAME` names no dataset of the config (the message lists them)."""

@dataclass
class SamplePreview:
    """One planned request of one conversation, with the sample it would make."""

    conversation_id: str
    row: int
    turn: int
    url: str
    headers: dict[str, str]
    body: dict[str, Any]
    input_ids: list[int]
    n_prompt: int
    answer: str  # "dataset" (the dataset's own answer stands in) or "model" (prompt only)
    sampling: dict[str, Any] = field(default_factory=dict)  # SampleSettings.to_json()


@dataclass
class DatasetPreview:
    name: str
    path: str
    format: str
    turns: str
    rows_scanned: int = 0
    rows_readable: int = 0
    rows_invalid: int = 0
    invalid_reasons: Counter = field(default_factory=Counter)
    invalid_examples: list[str] = field(default_factory=list)
    conversations_with_tools: int = 0
    tool_names: Counter = field(default_factory=Counter)
    dataset_tool_calls: int = 0
    requests: int = 0  # planned as if the model answered as the dataset did (the most)
    requests_min: int = 0  # if every conversation ended where a tool call could end it
    prompt_tokens: int = 0
    max_prompt_tokens: int = 0
    render_errors: int = 0
    total_rows: int | None = None  # all row indices of the dataset, when known
    complete: bool = True  # every row was scanned (no extrapolation)
    max_tokens: int = 0
    limit: int | None = None
    token_budget: int | None = None  # completion tokens the dataset may use
    warnings: list[str] = field(default_factory=list)
    samples: list[SamplePreview] = field(default_factory=list)
    error: str | None = None  # the dataset cannot be read at all
    skip_invalid: bool = False  # what the run does with an invalid row: skip it, or stop
    first_invalid: str | None = None  # where and why the first invalid row is invalid
    requests_before_invalid: int = 0  # this dataset's requests planned before that row
    requests_earlier: int | None = None  # the earlier datasets' (None: not previewed)
    n: int = 1  # samples per prompt (each its own request)
    sampling: dict[str, Any] = field(default_factory=dict)  # the dataset's own keys and mixes
    # a Hub dataset: its plan (commit, files with sizes and whether cached), and why its rows
    # are not shown yet (files not downloaded: `preview --download`)
    hub: dict[str, Any] | None = None
    hub_pending: str | None = None

    @property
    def scale(self) -> float:
        """Factor from the scanned rows to the whole dataset (and its `limit`)."""
        if self.rows_scanned == 0:
            return 0.0
        rows = self.rows_scanned if self.complete or self.total_rows is None else self.total_rows
        factor = rows / self.rows_scanned
        if self.limit is not None and self.rows_readable:
            factor = min(factor, self.limit / self.rows_readable)
        return factor

    @property
    def est_requests(self) -> int:
        return round(self.requests * self.scale * self.n)

    @property
    def est_requests_min(self) -> int:
        return round(self.requests_min * self.scale)

    @property
    def stops(self) -> bool:
        """The run stops at this dataset's first invalid row (skip_invalid = false)."""
        return self.rows_invalid > 0 and not self.skip_invalid

    @property
    def est_prompt_tokens(self) -> int:
        return round(self.prompt_tokens * self.scale * self.n)

    @property
    def worst_completion_tokens(self) -> int:
        """Every planned request answered with max_tokens (capped by the token budget)."""
        tokens = self.est_requests * self.max_tokens
        return tokens if self.token_budget is None else min(tokens, self.token_budget)

    def worst_case_cost(self, prices) -> float | None:
        return prices.cost(self.est_prompt_tokens, self.worst_completion_tokens)

    def to_json(self, prices) -> dict[str, Any]:
        return {
            "name": self.name, "path": self.path, "format": self.format, "turns": self.turns,
            "error": self.error,
            "rows_scanned": self.rows_scanned, "rows_readable": self.rows_readable,
            "rows_invalid": self.rows_invalid, "total_rows": self.total_rows,
            "complete": self.complete, "limit": self.limit,
            "invalid_reasons": dict(self.invalid_reasons.most_common()),
            "invalid_examples": self.invalid_examples,
            "tools_found": self.conversations_with_tools > 0,
            "conversations_with_tools": self.conversations_with_tools,
            "tool_names": dict(self.tool_names.most_common()),
            "dataset_tool_calls": self.dataset_tool_calls,
            "requests_scanned": self.requests, "prompt_tokens_scanned": self.prompt_tokens,
            "max_prompt_tokens": self.max_prompt_tokens, "render_errors": self.render_errors,
            "estimated_requests": self.est_requests,
            "estimated_requests_min": self.est_requests_min,
            "invalid_rows": "skip" if self.skip_invalid else "stop",
            "stops_at": None if not self.stops else {
                "row": self.first_invalid, "requests_before": self.requests_before_invalid,
                "requests_of_earlier_datasets": self.requests_earlier},
            "estimated_prompt_tokens": self.est_prompt_tokens,
            "max_tokens": self.max_tokens, "token_budget": self.token_budget,
            "worst_case_completion_tokens": self.worst_completion_tokens,
            "worst_case_cost_usd": self.worst_case_cost(prices),
            "warnings": self.warnings, "n": self.n, "sampling": self.sampling,
            "hub": self.hub, "hub_pending": self.hub_pending,
            "samples": [{
                "conversation_id": s.conversation_id, "row": s.row, "turn": s.turn,
                "url": s.url, "headers": s.headers, "body": s.body,
                "input_ids": s.input_ids,
                "loss_mask": [0] * s.n_prompt + [1] * (len(s.input_ids) - s.n_prompt),
                "answer": s.answer, "sampling": s.sampling,
            } for s in self.samples],
        }


@dataclass
class Preview:
    datasets: list[DatasetPreview]
    prices: Any  # specgen.engine.budget.Prices
    dialect: str
    price_origin: str = "unknown"  # where the prices came from, in words
    max_cost_usd: float | None = None  # the run's dollar cap ([budget] max_cost_usd)
    # run-wide temperature / top_p of a silent dataset: {key: (value, where it comes from)}
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    live_prices: Any = None  # mode = "batch": the live prices (`prices` are the batch's)

    def total_cost(self, prices: Any = None) -> float | None:
        """Worst case over the datasets, before the run's dollar cap."""
        prices = prices or self.prices
        costs = [d.worst_case_cost(prices) for d in self.datasets if d.error is None]
        return None if any(c is None for c in costs) else sum(costs)  # type: ignore[misc]


def preview(
    cfg: RunConfig, renderer: Renderer, *, n: int = 3, dataset: str | None = None,
    scan: int = DEFAULT_SCAN, fetch_prices: bool = False, renderer_for=None,
    download: bool = False,
) -> Preview:
    """Analyse the datasets of `cfg` (all, or the one named `dataset`); `scan` = 0 reads all.
    `renderer_for(thinking)`: the renderer of a sample's thinking mode (reasoning mixes).
    Hub datasets are resolved (the run's pinned commit when its store exists) and their
    files listed; rows are read only from files in the cache, or `download`ed first."""
    chosen = [d for d in cfg.datasets if dataset is None or d.name == dataset]
    if dataset is not None and not chosen:
        raise UnknownDataset(f"no dataset named {dataset!r} (the config has: "
                       f"{', '.join(d.name for d in cfg.datasets)})")
    out = [preview_dataset(cfg, d, renderer, n=n, scan=scan, renderer_for=renderer_for,
                           download=download) for d in chosen]
    complete = len(chosen) == len(cfg.datasets)
    earlier = 0
    for p in out:
        p.requests_earlier = earlier if complete and not any(
            d.weight is not None for d in cfg.datasets) else None
        earlier += p.est_requests
        if p.stops:
            p.warnings.append(_stop_warning(p))
    prices, origin = known_prices(cfg, fetch=fetch_prices)
    live = None
    if cfg.endpoint.mode == "batch" and prices.known:
        from .batch_config import price_factor
        from .batch_shape import batch_prices

        live, prices = prices, batch_prices(prices, cfg.budget)
        origin = f"{origin}; batch price = {price_factor(cfg.budget):g} x live"
    return Preview(out, prices, request_dialect(cfg), origin, cfg.budget.max_cost_usd,
                   sampling_defaults=run_defaults(cfg), live_prices=live)


def preview_dataset(cfg: RunConfig, ds: DatasetConfig, renderer: Renderer, *, n: int,
                    scan: int, renderer_for=None, download: bool = False) -> DatasetPreview:
    p = DatasetPreview(name=ds.name, path=str(ds.path), format=ds.format, turns=ds.turns,
                       max_tokens=cfg.max_tokens_for(ds), limit=ds.limit,
                       token_budget=ds.token_budget, skip_invalid=ds.skip_invalid, n=ds.n,
                       sampling={k: getattr(ds, k) for k in SAMPLING_DATASET_KEYS
                                 if getattr(ds, k) is not None and k != "n"})
    modes = renderer_for or (lambda _thinking: renderer)
    try:
        if ds.hub is not None and not _hub_ready(cfg, ds, p, download):
            return p
        if ds.format == "auto":
            p.format = f"{detect_dataset_format(ds)} (detected)"
        rows = iter_rows(ds, renderer=cfg.target.renderer)
        last_index = -1
        for row in rows:
            if scan and p.rows_scanned >= scan:
                p.complete = False
                break
            p.rows_scanned += 1
            last_index = row.index
            _count_row(cfg, ds, renderer, p, row, n, modes)
        if not p.complete:
            p.total_rows = count_rows(source_files(ds), ds.split)
            if p.total_rows is None:  # JSON: count the remaining rows by reading them
                p.total_rows = last_index + 1 + sum(1 for _ in iter_records(
                    source_files(ds), last_index + 1, ds.split))
            # rows of a JSONL file are line slots: blank lines count, so scale by slots
            p.total_rows = round(p.total_rows * p.rows_scanned / max(1, last_index + 1))
        else:
            p.total_rows = p.rows_scanned
    except SourceError as exc:
        p.error = str(exc)
        return p
    _warn(p, ds)
    return p


def _hub_ready(cfg: RunConfig, ds: DatasetConfig, p: DatasetPreview, download: bool) -> bool:
    """Resolve a Hub dataset for the preview (its run's pin when the run exists, else the
    revision now: metadata and the dataset card only); True when its files are local."""
    from .sources import hub

    p.path = ds.path_as_written or str(ds.path)
    plan = _run_pin(cfg, ds) or hub.plan_hub(ds.hub, ds.revision, ds.subset, ds.split, ds.name)
    missing = {f.path for f in hub.missing_files(plan)}
    p.hub = {**plan.to_json(), "describe": plan.describe(), "total_size": plan.total_size,
             "files": [{"path": f.path, "size": f.size, "cached": f.path not in missing}
                       for f in plan.files]}
    if missing and not download:
        size = sum(f.size or 0 for f in plan.files if f.path in missing)
        p.hub_pending = (f"{len(missing)} of {len(plan.files)} file(s), {_mb(size)}, not "
                         "downloaded yet: the run downloads them before its first request "
                         "(`specgen preview --download` does it now and shows the requests)")
        return False
    ds.files = hub.download_plan(plan, ds.name)
    return True


def _run_pin(cfg: RunConfig, ds: DatasetConfig):
    """The plan the run stored for `ds` at its first session (None: no run yet)."""
    from .sources.hub import HubPlan
    from .sources.pins import PIN_PREFIX
    from .store import STORE_FILE, Store

    if not (cfg.run_dir / STORE_FILE).is_file():
        return None
    try:
        with Store.open(cfg.run_dir) as store:
            stored = store.get_meta(PIN_PREFIX + ds.name)
    except Exception:  # noqa: BLE001 - an unreadable store: preview resolves afresh
        return None
    return HubPlan.from_json(json.loads(stored)) if stored else None


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 100_000 else f"{n:,} bytes"


def _count_row(cfg: RunConfig, ds: DatasetConfig, renderer: Renderer, p: DatasetPreview,
               row: Row, n: int, modes) -> None:
    if row.error is not None:
        if p.first_invalid is None:
            p.first_invalid = f"row {row.index} ({row.error.file}" + (
                f":{row.error.line})" if row.error.line is not None else ")")
            p.requests_before_invalid = p.requests
        p.rows_invalid += 1
        p.invalid_reasons[_reason_kind(row.error.reason)] += 1
        if len(p.invalid_examples) < 10:
            p.invalid_examples.append(str(row.error))
        return
    conv = row.conversation
    assert conv is not None
    p.rows_readable += 1
    if conv.tools:
        p.conversations_with_tools += 1
        p.tool_names.update(t["function"]["name"] for t in conv.tools)
    p.dataset_tool_calls += sum(len(m.get("tool_calls") or ()) for m in conv.messages)
    if conv.messages and conv.messages[0].get("role") == "system" and not conv.tools:
        text = conv.messages[0].get("content")
        if isinstance(text, str) and len(_TOOL_DUMP.findall(text)) >= 2:
            p.warnings.append(
                f"conversation {conv.id}: the system text looks like it holds tool definitions, "
                "but no tools were found; they would reach the model as plain text, not as "
                "the tools parameter (format = \"glaive\"? or give the row a `tools` field)")
    planned = planned_requests(conv, ds.turns, ds.tool_results)
    rendered = p.requests
    for req in planned:
        try:
            ids = renderer.prompt_ids(req.messages, req.tools)
        except RenderError:
            p.render_errors += 1
            continue
        p.requests += 1
        p.prompt_tokens += len(ids)
        p.max_prompt_tokens = max(p.max_prompt_tokens, len(ids))
        if len(p.samples) < n and (not p.samples or p.samples[-1].conversation_id != conv.id):
            st = sample_settings(cfg, ds, conv.id, req.turn)
            shown = modes(st.thinking)
            if shown is not renderer:
                ids = shown.prompt_ids(req.messages, req.tools)
            p.samples.append(_sample(cfg, ds, shown, conv, row.index, req, ids, st))
    p.requests_min += min(fewest_requests(conv, planned), p.requests - rendered)


def planned_requests(conv: Conversation, turns: str,
                     tool_results: str = DEFAULT_TOOL_RESULTS) -> list[TurnRequest]:
    """The requests a run would make if the model answered as the dataset did."""
    answers: dict[int, AssistantMessage] = {}
    out: list[TurnRequest] = []
    while True:
        step = next_request(conv, answers, turns, tool_results)
        if isinstance(step, End):
            return out
        out.append(step)
        if step.turn >= len(conv.messages):
            return out
        answers[step.turn] = AssistantMessage.from_openai(conv.messages[step.turn])


def fewest_requests(conv: Conversation, planned: list[TurnRequest]) -> int:
    """The requests of `planned` a run makes at least: a conversation ends early at the first
    answer whose tool calls differ from the dataset's (`planner`), which any answer can do
    when tools are declared (the model may call one), and an answer where the dataset
    called a tool can do without them (the model may not call it)."""
    for k, req in enumerate(planned, 1):
        if conv.tools or (req.turn < len(conv.messages)
                          and conv.messages[req.turn].get("tool_calls")):
            return k
    return len(planned)


def _stop_warning(p: DatasetPreview) -> str:
    """What the run does at the first invalid row when it does not skip them."""
    spent = f"up to {p.requests_before_invalid:,} request(s) of this dataset"
    if p.requests_earlier:
        spent = f"up to ~{p.requests_earlier:,} of the datasets before it and " + spent
    elif p.requests_earlier is None:
        spent += " and what the other datasets sent by then"
    return (f"{p.rows_invalid:,} invalid row(s) and skip_invalid = false: the run stops with an "
            f"error when it reaches the first one, {p.first_invalid}; by then {spent} are "
            "sent and paid for. Fix the rows, or set skip_invalid = true to skip and record "
            "them")


def _sample(cfg: RunConfig, ds: DatasetConfig, renderer: Renderer, conv: Conversation,
            row: int, req: TurnRequest, prompt_ids: list[int],
            settings: SampleSettings) -> SamplePreview:
    ep = cfg.endpoint
    base = ep.base_url[0]  # "sim" stands in as http://sim, then is named in words
    if ep.tokens_mode:
        body = build_token_request(cfg, ds, prompt_ids, renderer.stop_token_ids,
                                   settings=settings)
        url = token_url("http://sim" if base == "sim" else base, ep.token_api_name)
    else:
        body = build_request(cfg, ds, req, settings=settings)
        url = ("http://sim" if base == "sim" else base.rstrip("/")) + "/chat/completions"
    if ep.mode == "batch":  # one line of the batch, exactly as it is sent
        from .batch_config import fixed_sampling
        from .batch_shape import line

        body = line(f"{ds.name}:{conv.id}:{req.turn}", body, fixed_sampling(cfg), ep.batch_api)
        url = url.removesuffix("/chat/completions") + (
            f"/{ep.batch_batches_path} (an item of the batch's requests array)"
            if ep.batch_api == "openrouter" else
            f"/{ep.batch_files_path} (a line of the batch's JSONL)")
    if base == "sim":
        url = "(the built-in simulator)" + url.removeprefix("http://sim")
    completion: list[int] = []
    answer = "model"
    if req.turn < len(conv.messages):
        msg = conv.messages[req.turn]
        try:
            completion = renderer.completion_ids(msg, context=req.messages, tools=req.tools)
            answer = "dataset"
        except RenderError:
            completion = []
    return SamplePreview(conversation_id=conv.id, row=row, turn=req.turn, url=url,
                         headers=request_headers(cfg), body=body,
                         input_ids=[*prompt_ids, *completion], n_prompt=len(prompt_ids),
                         answer=answer, sampling=settings.to_json())


def request_headers(cfg: RunConfig) -> dict[str, str]:
    """The request headers with every secret redacted."""
    headers = {"Content-Type": "application/json"}
    env = cfg.endpoint.api_key_env
    if env and not cfg.endpoint.is_sim:
        state = "set" if os.environ.get(env) else "NOT SET"
        headers["Authorization"] = f"Bearer <redacted: ${env}, {state}>"
    for key, value in cfg.endpoint.headers.items():
        headers[key] = "<redacted>" if SECRET_HEADER.search(key) else value
    if cfg.endpoint.return_token_ids:
        headers.setdefault("X-Specgen-Return-Token-Ids", "1")
    return headers


NO_PRICES = ("unknown: run with --fetch-prices (one free GET of the endpoint list), or set "
             "[budget] prompt_price_per_m / completion_price_per_m")


def known_prices(cfg: RunConfig, *, fetch: bool = False):
    """(Prices, origin in words): [budget] first, then the simulator's providers, (fetch) the
    endpoint list, or the endpoint prices the run dir's last run recorded (cached), at the
    highest price of an endpoint the provider policy allows."""
    from .engine.budget import resolve_prices
    from .engine.policy import ProviderPolicy

    b = cfg.budget
    endpoints = []
    cached = None
    origin = "the endpoint list"
    if b.prompt_price_per_m is None or b.completion_price_per_m is None:
        if cfg.endpoint.is_sim:
            endpoints, origin = _sim_endpoints(cfg), "the simulator's providers"
        elif fetch:
            endpoints = _fetch_endpoints(cfg)
            if not endpoints:
                origin = "unknown: the endpoint list could not be fetched"
        if not endpoints and not cfg.endpoint.is_sim:
            cached = cached_prices(cfg.run_dir)
    policy = ProviderPolicy(cfg.endpoint.provider, endpoints)
    if cached is not None:
        found, origin = cached
    else:
        found = policy.max_prices() if endpoints else None
    prices = resolve_prices(b.prompt_price_per_m, b.completion_price_per_m, found)
    where = origin if cached else f"{origin}, highest allowed endpoint"
    words = {"config": "[budget]", "endpoints": where, "config+endpoints": f"[budget] and {where}"}
    unknown = origin if origin.startswith("unknown") else NO_PRICES
    return prices, words.get(prices.source, unknown)


def cached_prices(run_dir) -> tuple[tuple[float | None, float | None], str] | None:
    """The endpoint prices (USD per token) the last run in `run_dir` recorded, and their
    origin in words; None when there is no such run (read-only: preview writes nothing)."""
    import time as _time

    import orjson

    from .store import STORE_FILE, Store, StoreError

    if not (Path(run_dir) / STORE_FILE).exists():
        return None
    try:
        with Store.open(run_dir) as store:
            raw = store.get_meta("prices")
            sessions = store.sessions()
    except (StoreError, OSError, ValueError):
        return None
    try:
        p = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return None
    if "endpoints" not in str(p.get("source", "")):
        return None
    per_m = (p.get("prompt_per_m"), p.get("completion_per_m"))
    if None in per_m:
        return None
    when = ""
    if sessions and sessions[-1].get("started_at"):
        when = " at " + _time.strftime("%Y-%m-%d %H:%M",
                                       _time.localtime(sessions[-1]["started_at"]))
    origin = (f"the endpoint list cached in {os.path.normpath(run_dir)} by its last run{when}; "
              "--fetch-prices for today's")
    return (per_m[0] / 1e6, per_m[1] / 1e6), origin


def _sim_endpoints(cfg: RunConfig):
    from .engine.policy import Endpoint
    from .sim.config import SimConfig, load_sim_config

    sim = cfg.sim.config
    if not isinstance(sim, SimConfig):  # a path (a config object when built in code)
        sim = load_sim_config(sim) if sim else SimConfig()
    return [Endpoint(provider_name=p.name, tag=p.tag, quantization=p.quantization,
                     prompt_price=p.prompt_price(), completion_price=p.completion_price())
            for p in sim.providers if not p.models or _serves(p.models, cfg.target.model)]


def _serves(models: list[str], model: str) -> bool:
    return any(model == m or model.startswith(m + "-") for m in models)


def _fetch_endpoints(cfg: RunConfig):
    """GET {base}/models/{model}/endpoints (free, no key sent)."""
    from .engine.policy import parse_endpoints
    from .proxy import urlopen as proxied_urlopen

    url = f"{cfg.endpoint.base_url[0].rstrip('/')}/models/{quote(cfg.target.model, safe='/')}/endpoints"
    try:
        with proxied_urlopen(url, setting=cfg.endpoint.proxy,
                             headers={"User-Agent": "specgen-preview"}, timeout=20) as r:
            return parse_endpoints(json.loads(r.read()))
    except (urllib.error.URLError, OSError, ValueError):
        return []


def _reason_kind(reason: str) -> str:
    """A reason without its row-specific details, for counting."""
    reason = re.sub(r"^row \d+: ", "", reason)
    reason = re.sub(r"\[\d+\]", "[i]", reason)
    reason = re.sub(r"message \d+", "message i", reason)
    reason = re.sub(r"'[^']*'", "'…'", reason)
    reason = re.sub(r": line \d+ column \d+ \(char \d+\)", "", reason)
    reason = re.sub(r" at offset \d+ \(near .*\)$", "", reason)
    return reason[:160]


def _warn(p: DatasetPreview, ds: DatasetConfig) -> None:
    if len(p.warnings) > 3:
        more = len(p.warnings) - 3
        p.warnings = p.warnings[:3] + [f"... and {more} more such conversations"]
    if p.dataset_tool_calls and not p.conversations_with_tools:
        p.warnings.append("the dataset has tool calls but declares no tools")
    if p.render_errors:
        p.warnings.append(f"{p.render_errors} request(s) cannot be rendered by the target's chat "
                          "format (the run fails those conversations)")

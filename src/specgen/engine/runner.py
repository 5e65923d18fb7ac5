"""`specgen run`: put the pieces together and run one engine session.

Order of work: lock the run dir, load tokenizer and renderer, check the store against the
config (refuse, or move it aside with --force-new), start the simulator when `base_url = "sim"`,
fetch the endpoint list for the provider policy and prices, record the session, rebuild the
state from the store, and run until done, stopped or failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import orjson

from ..client.types import ApiError
from ..config import RunConfig
from ..display import path as tidy
from ..request import local_engines
from ..sources import SourceError
from ..store import STORE_FILE, Store, StoreError, check_writable, open_problem
from . import event_loop
from .ballast import Ballast
from .budget import Budget, cap_below_one_request, resolve_prices
from .control import RunLock, clear_control
from .hub_pin import pin_hub_sources
from .logfile import Printable, RunLogFile
from .outcome import EXIT_STOPPED, Outcome
from .policy import ProviderPolicy, parse_endpoints
from .resume import (
    IncompatibleRunError,
    meta_for,
    move_aside,
    pin_sampling_defaults,
    problems,
    refusal_message,
)
from .scheduler import Engine
from .shard import parse_shard
from .source_check import check_sources
from .stages import Stages, default_stages
from .store_guard import import_rescued

log = logging.getLogger("specgen.engine")
LOG_FILE = "specgen.log"
# Collector thresholds while a session runs (defaults: 700, 10, 10). Thousands of requests in
# flight keep ~10^5 containers alive, so the default young-generation threshold has the
# collector walk them several times a second (a fifth of the engine's CPU at 2,000 in flight).
RUN_GC_THRESHOLD = (50_000, 20, 100)


def running_batch_lines(store: Store) -> tuple[str, str] | None:
    """("N line(s) in M batch(es)", their ids) still running at the provider, or None."""
    try:
        rows = store.conn.execute(
            "SELECT b.id, b.provider_id, COUNT(bl.custom_id) FROM batches b JOIN batch_lines "
            "bl ON bl.batch = b.id WHERE b.state IN ('sending', 'validating', "
            "'in_progress', 'finalizing') AND bl.outcome IS NULL GROUP BY b.id").fetchall()
    except sqlite3.Error:
        return None
    if not rows:
        return None
    ids = ", ".join("".join(c if c.isprintable() else "?" for c in str(pid or bid))[:80]
                    for bid, pid, _ in rows[:5])
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    return f"{sum(n for *_, n in rows):,} line(s) in {len(rows)} batch(es)", ids + more


class RunError(RuntimeError):
    """The run cannot start; the message says why and what to do."""


class Unreachable(RuntimeError):
    """The API could not be reached at start-up for longer than outage_timeout."""


@dataclass
class RunOptions:
    shard: str | None = None
    force_new: bool = False
    drain_timeout: float | None = None
    retry_failed: bool = False
    ack_alarms: tuple[str, ...] = ()  # --ack-alarm NAME: standing alarms acknowledged
    live: bool | None = None  # None: a live view when stderr is a terminal
    argv: list[str] = field(default_factory=list)
    stages: Stages | None = None  # tests may pass their own; default: the real stages
    threaded_commits: bool | None = None  # None: [engine] commit_thread


def _is_local(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


def _fetch_endpoints_wanted(cfg: RunConfig) -> bool:
    """Whether to ask for the endpoint list: "auto" tries (OpenRouter and the simulator serve
    it; other servers answer 404, which is fine), true insists, false never asks."""
    return cfg.endpoint.fetch_endpoints is not False


class _Console(logging.StreamHandler):
    """Log lines on stderr: every line without the live view; with it, warnings before and
    after the view (while it shows, they print above its panel instead)."""


def _setup_logging(run_dir: Path, live: bool) -> list[logging.Handler]:
    logger = logging.getLogger("specgen")
    logger.setLevel(logging.INFO)
    handlers: list[logging.Handler] = []
    fh = RunLogFile(run_dir / LOG_FILE)  # degrades to the console on a full disk
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handlers.append(fh)
    sh = _Console(sys.stderr)
    sh.setLevel(logging.WARNING if live else logging.INFO)
    sh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    handlers.append(sh)
    for h in handlers:
        h.addFilter(Printable())
        logger.addHandler(h)
    return handlers


def run(cfg: RunConfig, opts: RunOptions | None = None) -> Outcome:
    """Run one session of `cfg`. Raises RunError when it cannot start."""
    opts = opts or RunOptions()
    run_dir = Path(cfg.run_dir)
    try:
        shard = parse_shard(opts.shard)
        event_loop.loop_factory(cfg.engine.event_loop)
    except (ValueError, event_loop.LoopUnavailable) as exc:
        raise RunError(str(exc)) from None
    key_env = cfg.endpoint.api_key_env  # before anything is written: a refusal leaves nothing
    _check_cap(cfg, resolve_prices(cfg.budget.prompt_price_per_m,
                                   cfg.budget.completion_price_per_m, None))
    if (not cfg.endpoint.is_sim and key_env and not os.environ.get(key_env)
            and not all(_is_local(u) for u in cfg.endpoint.base_url)):
        raise RunError(f"the API key is not set: export {key_env}=... (endpoint.api_key_env "
                       "names the variable; the key is never written anywhere)")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunError(f"cannot create the run dir {run_dir}: {exc.strerror or exc}") from None
    problem = check_writable(run_dir)
    if problem:
        raise RunError(problem)
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except RuntimeError as exc:
        raise RunError(str(exc)) from None
    live = sys.stderr.isatty() if opts.live is None else opts.live
    handlers = _setup_logging(run_dir, live)
    try:
        return _run_locked(cfg, opts, run_dir, shard, live)
    finally:
        logger = logging.getLogger("specgen")
        for h in handlers:
            logger.removeHandler(h)
            h.close()
        lock.release()


def _run_locked(cfg, opts, run_dir, shard, live) -> Outcome:
    from ..config import empty_datasets
    from ..render import target_renderer
    from ..tokenizer import load_tokenizer

    for ds in empty_datasets(cfg):
        log.warning("dataset %r: %s has no rows; nothing will be sent for it", ds.name, ds.path)
    try:
        tokenizer = load_tokenizer(cfg.target.tokenizer, cfg.target.encode)
        renderer = target_renderer(cfg, tokenizer)
    except Exception as exc:  # noqa: BLE001 - tokenizer/renderer errors name their cause
        raise RunError(f"cannot load the tokenizer/renderer: {exc}") from None
    shard_s = str(shard) if shard else ""
    fingerprint = tokenizer.fingerprint
    if (run_dir / STORE_FILE).exists():
        with Store.open(run_dir) as old:
            if pin_sampling_defaults(old, cfg):
                log.info("this run was made without model-card sampling defaults: it "
                         "resumes that way (silent temperature 1.0, no top_p); set [sampling] "
                         "model_defaults to decide")
            found = problems(old, cfg, tokenizer_fingerprint=fingerprint, shard=shard_s)
            running = running_batch_lines(old) if opts.force_new else None
        if found and not opts.force_new:
            raise RunError(refusal_message(run_dir, found)) from IncompatibleRunError()
        if opts.force_new:
            if running:
                log.warning("--force-new: %s of the previous store are still running at the "
                            "provider (%s): the new store does not know them, so their "
                            "tasks are submitted again and billed again; cancel them at the "
                            "provider (or rerun without --force-new to collect them)",
                            running[0], running[1])
            moved = move_aside(run_dir)
            if moved:
                log.warning("--force-new: a fresh store; the previous one and what was made "
                            "from it were moved aside (nothing deleted): %s", "; ".join(
                                f"{src.name} -> {tidy(dest)}" for src, dest in moved))
    stages = opts.stages or default_stages()
    try:
        store = Store.create(run_dir)
    except (StoreError, OSError, sqlite3.Error) as exc:
        raise RunError(open_problem(exc, run_dir)
                       or f"cannot open the run store in {run_dir}: {exc}") from None
    rescued = import_rescued(store, run_dir)  # a previous session's rescue file
    if rescued:
        log.warning("%s", rescued)
    for note in check_sources(store, cfg.datasets):  # a source changed before its cursor
        log.warning("%s", note)
    try:  # Hub datasets: pinned and fetched before the first request, never in the loop
        for note in pin_hub_sources(store, cfg.datasets):
            log.warning("%s", note)
    except SourceError as exc:
        store.close()
        raise RunError(str(exc)) from None
    reader = Store.open(run_dir)
    ballast = Ballast(run_dir, int(cfg.engine.ballast_mb * 2**20))
    if ballast.size and not ballast.create():
        log.warning("could not reserve %.0f MB in %s (ballast_mb): the disk is nearly full; "
                    "answers held when it fills may have no room to be committed",
                    cfg.engine.ballast_mb, run_dir)
    try:
        for k, v in meta_for(cfg, tokenizer_fingerprint=fingerprint, shard=shard_s).items():
            store.set_meta(k, v)
        drain = cfg.engine.drain_timeout if opts.drain_timeout is None else opts.drain_timeout
        store.set_meta("drain_timeout", repr(drain))  # for `specgen stop`
        clear_control(run_dir)  # a stop request left for an earlier session
        with _collector_tuned():
            return event_loop.run(_main(cfg, opts, store, reader, renderer, tokenizer,
                                        stages, shard, live, ballast), cfg.engine.event_loop)
    finally:
        ballast.release()  # the reserve is for a running session only
        reader.close()
        store.close()


@contextlib.contextmanager
def _collector_tuned():
    """Run with RUN_GC_THRESHOLD, and with what is loaded by now (modules, tokenizer,
    renderer) frozen out of the collector's walks; cycles are still collected. The previous
    settings come back afterwards (the engine also runs inside tests and benchmarks)."""
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*RUN_GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


async def _main(cfg, opts, store, reader, renderer, tokenizer, stages, shard, live,
                ballast=None) -> Outcome:
    from ..client import ChatClient
    from ..render import mode_renderers

    sim = None
    urls = None
    # a stop while starting (waiting for an unreachable API, say) ends this task: the engine
    # installs its own handlers once it runs
    task = asyncio.current_task()
    stopped_by: list[str] = []

    def stop_starting(why: str) -> None:
        if not stopped_by and task is not None:
            stopped_by.append(why)
            task.cancel()

    _on_stop_signals(stop_starting)
    session_id = store.start_session(os.getpid(), socket.gethostname(),
                                     orjson.dumps(opts.argv).decode(), time.time())
    try:
        if cfg.endpoint.is_sim:
            from .. import sim as simmod

            sim = await asyncio.to_thread(
                simmod.start_in_thread, cfg.sim.config, seed=cfg.sim.seed, tokenizer=tokenizer,
                renderer=cfg.target.renderer)
            urls = [sim.url]
            log.info("simulator listening on %s", sim.url)
        client = ChatClient.from_config(cfg.endpoint, base_urls=urls)
        log.info("network: %s", client.describe_proxies())
        async with client:
            policy, prices = await _policy_and_prices(cfg, client)
            live_factor = 1.0
            if cfg.endpoint.mode == "batch":
                from ..batch_config import price_factor
                from ..batch_shape import batch_prices

                prices = batch_prices(prices, cfg.budget)
                live_factor = 1.0 / price_factor(cfg.budget)
            _resolve_local_defaults(cfg, policy)
            if cfg.target.chat_template_kwargs and _dialect_url(cfg, policy) == OPENROUTER_URL:
                raise RunError("target.chat_template_kwargs is sent only to vLLM/SGLang-style "
                               "servers, but this endpoint lists providers (the openrouter "
                               "dialect); set [endpoint] dialect = \"openai\" or drop the key")
            _check_cap(cfg, prices)  # now with the endpoint list's prices too
            store.set_meta("prices", orjson.dumps(prices.to_json()).decode())
            if cfg.budget.max_cost_usd is not None and not prices.known:
                log.warning("no prices known (set [budget] prompt_price_per_m and "
                            "completion_price_per_m): the dollar cap uses the cost the API "
                            "reports, so it may be overshot by what is in flight")
            engine = Engine(cfg, store=store, reader=reader, client=client, renderer=renderer,
                            renderer_for=mode_renderers(renderer, cfg.target.chat_template_kwargs),
                            stages=stages, policy=policy, budget=Budget(
                                cfg.budget.max_cost_usd, prices, live_factor=live_factor),
                            session_id=session_id, shard=shard,
                            drain_timeout=opts.drain_timeout,
                            dialect_url=_dialect_url(cfg, policy),
                            threaded_commits=(cfg.engine.commit_thread
                                              if opts.threaded_commits is None
                                              else opts.threaded_commits),
                            ballast=ballast)
            t0 = time.monotonic()
            engine.load(retry_failed=opts.retry_failed, ack_alarms=opts.ack_alarms)
            log.info("session %d started: %s; resumed state in %.2fs (%d open conversations)",
                     session_id, ", ".join(f"{d.name} at row {d.rows_read}"
                                           for d in engine.datasets),
                     time.monotonic() - t0, engine.open_convs)
            if cfg.endpoint.mode != "batch":
                return await _run_engine(engine, cfg, live)
            from .batch_driver import attached

            async with attached(engine, cfg, base_url=(urls or cfg.endpoint.base_url)[0],
                                store=store, session_id=session_id, live=client):
                return await _run_engine(engine, cfg, live)
    except Unreachable as exc:
        _end_session(store, session_id, "stopped", str(exc))
        log.error("%s", exc)
        return Outcome("stopped", f"{exc}; work left pending, rerun to resume", EXIT_STOPPED)
    except (KeyboardInterrupt, asyncio.CancelledError):
        if not stopped_by:
            _end_session(store, session_id, "stopped", "interrupted while starting")
            raise
        reason = (f"stopped ({stopped_by[0]}) while starting, before any request was sent; "
                  "work left pending, rerun to resume")
        _end_session(store, session_id, "stopped", reason)
        log.warning("%s", reason)
        return Outcome("stopped", reason, EXIT_STOPPED)
    except BaseException as exc:
        reason = (str(exc) if isinstance(exc, RunError | ApiError)
                  else f"crashed: {exc!r}")
        _end_session(store, session_id, "failed", reason)
        raise
    finally:
        if sim is not None:
            await asyncio.to_thread(sim.stop)


OPENROUTER_URL = "https://openrouter.ai/api/v1"  # stands for the openrouter request dialect


def _dialect_url(cfg: RunConfig, policy: ProviderPolicy) -> str | None:
    """The base URL that makes specgen.request use the right dialect."""
    mode = cfg.endpoint.dialect
    if mode == "openrouter" or (mode == "auto" and (policy.endpoints or cfg.endpoint.is_sim)):
        return OPENROUTER_URL
    if mode == "openai":
        return "http://localhost/v1"
    return None


def _resolve_local_defaults(cfg: RunConfig, policy: ProviderPolicy) -> None:
    """The defaults that depend on whether the servers are local engines (every base URL a
    local host, no OpenRouter-like endpoint list, dialect not openrouter): `return_token_ids`
    unset is on for them (off otherwise), `target.serving = "auto"` is vllm for them
    (transformers otherwise)."""
    ep = cfg.endpoint
    local = (not ep.is_sim and not policy.endpoints and ep.dialect != "openrouter"
             and local_engines(ep.base_url))
    if ep.return_token_ids is None:
        ep.return_token_ids = local
        if local:
            log.info("return_token_ids on (local engines): the exported ids are the server's")
    if cfg.target.serving == "auto" and local:
        cfg.target.serving = "vllm"  # local engines parse history arguments (vLLM, SGLang)
        log.info("serving = vllm (local engines): history tool-call arguments as the server "
                 "renders them")


def _check_cap(cfg: RunConfig, prices) -> None:
    """Refuse a dollar cap that cannot pay for one request (nothing would be sent)."""
    problem = cap_below_one_request(cfg.budget.max_cost_usd, prices,
                                    {ds.name: cfg.max_tokens_for(ds) for ds in cfg.datasets})
    if problem:
        raise RunError(problem)


def _end_session(store: Store, session_id: int, state: str, reason: str) -> None:
    try:
        now = time.time()
        row = store.conn.execute("SELECT state FROM sessions WHERE id=?", (session_id,)).fetchone()
        if row and row[0] == "running":
            store.conn.execute("UPDATE sessions SET state=?, stop_reason=?, ended_at=?, "
                               "heartbeat_at=? WHERE id=?",
                               (state, reason, now, now, session_id))
    except Exception:  # noqa: BLE001 - best effort while already failing
        log.exception("could not record the end of the session")


async def _policy_and_prices(cfg: RunConfig, client) -> tuple[ProviderPolicy, Any]:
    endpoints = []
    if _fetch_endpoints_wanted(cfg):
        path = f"models/{quote(cfg.target.model, safe='/')}/endpoints"
        try:
            endpoints = parse_endpoints(await _reachable_get(cfg, client, path))
        except ApiError as err:
            if err.kind == "auth":
                raise RunError(f"the API refused the key while listing endpoints: {err}") from None
            if cfg.endpoint.fetch_endpoints is True:
                log.warning("could not fetch the endpoint list (%s): provider quantizations "
                            "and prices are unknown", err)
            else:
                log.info("no endpoint list from the server (%s): not OpenRouter-like; "
                         "quantizations and prices unknown", err)
    policy = ProviderPolicy(cfg.endpoint.provider, endpoints)
    if endpoints:
        log.info("endpoints of %s: %s", cfg.target.model, policy.describe())
        if policy.active and not policy.allowed_endpoints():
            raise RunError(
                f"no endpoint of {cfg.target.model} matches [endpoint.provider] "
                f"(endpoints: {policy.describe()}); relax the policy")
    b = cfg.budget
    prices = resolve_prices(b.prompt_price_per_m, b.completion_price_per_m,
                            policy.max_prices())
    if endpoints:
        await _check_key(cfg, client)
    return policy, prices


async def _reachable_get(cfg: RunConfig, client, path: str) -> Any:
    """GET `path`, waiting while the host cannot be reached at all (up to outage_timeout):
    an API that is down for a minute at start-up delays the run, it does not end it."""
    start = time.monotonic()
    since = time.strftime("%Y-%m-%d %H:%M:%S")
    wait = 1.0
    while True:
        try:
            return await client.get_json(path)
        except ApiError as err:
            if err.kind != "unreachable":
                raise
            left = cfg.engine.outage_timeout - (time.monotonic() - start)
            host = urlparse(err.base_url or "").hostname or err.base_url
            if left <= 0:
                raise Unreachable(f"endpoint unreachable since {since}: cannot reach {host} "
                                  f"({err.message}); outage_timeout of "
                                  f"{cfg.engine.outage_timeout:g}s reached") from None
            if wait == 1.0:
                log.warning("cannot reach %s (%s): waiting for it (the run stops if it stays "
                            "unreachable for %gs, outage_timeout)", host, err.message,
                            cfg.engine.outage_timeout)
            await asyncio.sleep(min(wait, left))
            wait = min(wait * 2, cfg.endpoint.outage_probe_max)


async def _check_key(cfg: RunConfig, client) -> None:
    """OpenRouter's GET /key: say how much the key may still spend (never fatal)."""
    try:
        info = await client.get_json("key")
    except ApiError as err:
        if err.kind == "auth":
            raise RunError(f"the API refused the key: {err}") from None
        return
    data = info.get("data", info) if isinstance(info, dict) else {}
    remaining = data.get("limit_remaining") if isinstance(data, dict) else None
    if isinstance(remaining, int | float):
        log.info("API key: $%.2f of its limit left", remaining)
        cap = cfg.budget.max_cost_usd
        if cap is not None and remaining < cap:
            log.warning("the API key has $%.2f left, less than max_cost_usd = $%g: the run will "
                        "stop with 402 (resumable) when it runs out", remaining, cap)


def _on_stop_signals(stop: Callable[[str], None]) -> list[int]:
    """SIGINT and SIGTERM call `stop("signal NAME")` (replacing earlier handlers); the
    signals installed (none off the main thread)."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop, f"signal {signal.Signals(sig).name}")
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    return installed


async def _run_engine(engine: Engine, cfg: RunConfig, live: bool) -> Outcome:
    from .live import LiveView, progress_line

    loop = asyncio.get_running_loop()
    installed = _on_stop_signals(engine.request_stop)
    interval = cfg.engine.log_interval
    last = [time.monotonic()]

    def plain_tick() -> None:
        if time.monotonic() - last[0] >= interval:
            last[0] = time.monotonic()
            log.info("%s", progress_line(engine))

    try:
        if live:
            logger = logging.getLogger("specgen")
            plain = [h for h in logger.handlers if isinstance(h, _Console)]
            with LiveView(engine) as view:
                from rich.logging import RichHandler

                console_log = RichHandler(level=logging.WARNING, console=view.console,
                                          show_path=False)
                console_log.addFilter(Printable())
                for h in plain:
                    logger.removeHandler(h)
                logger.addHandler(console_log)

                def tick() -> None:
                    view.update()
                    if time.monotonic() - last[0] >= interval:  # the log file still gets lines
                        last[0] = time.monotonic()
                        logging.getLogger("specgen.progress").info("%s", progress_line(engine))
                try:
                    outcome = await engine.run(on_tick=tick)
                finally:
                    logger.removeHandler(console_log)
                    for h in plain:
                        logger.addHandler(h)
        else:
            outcome = await engine.run(on_tick=plain_tick)
        log.info("%s", progress_line(engine))
        log.info("session ended: %s — %s", outcome.state, outcome.stop_reason)
        log.info("event loop: longest stall %.0f ms", engine.stats.loop_stall * 1000)
        return outcome
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)

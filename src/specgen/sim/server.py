"""The simulator's HTTP application: OpenRouter's chat API over simulated providers.

`Simulator` holds the state (config, tokenizer, renderers, the simulated model, counters) and
answers requests from `specgen.sim.http` (`handle`); `start` / `start_in_thread` (in
`specgen.sim`) run it. A non-streamed chat request is handled without a task: parsed, routed
and drawn at once, then parked on a shared timer wheel until its time to first token, and
answered from the timer callback. Streams (and the rare faults that write in several steps)
run as one task each.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, unquote

import orjson

from .. import jsonexact
from ..render import get_renderer
from ..render.base import RenderError
from ..render.kimi import KimiRenderer
from ..render.serving import history_as_served, reserialized_history
from ..tokenizer import Tokenizer, load_tokenizer
from .batch import BatchApi
from .budget import InFlightBudget, spend_limit_error
from .chat_request import ChatParser, ChatRequest
from .config import ProviderConfig, SimConfig
from .faults import (
    FALLBACK_FAULTS,
    HTTP_FAULTS,
    draw,
    error_body,
    fault_table,
    moderation_error,
    provider_error,
)
from .generate import Generated, GenRequest, Model
from .http import Request
from .pacing import DONE, send_stream
from .rand import HashRandom
from .routing import BadRequest, NoEndpoints, route
from .serving import Served, Server
from .stats import Stats
from .tokens import TokenEndpoints

log = logging.getLogger("specgen.sim")

KEEPALIVE = b": OPENROUTER PROCESSING\n\n"
IDS_HEADER = "x-specgen-return-token-ids"
_SEEN_LIMIT = 50_000  # distinct request bodies remembered for the occurrence counter (~5 MB)
GENERATION_LOG = 10_000  # completed generations kept for GET /generation
WHEEL_TICK = 0.002  # wake-ups are rounded up to this many seconds and share one timer
_STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                   "X-Accel-Buffering": "no"}


class Wheel:
    """Timers rounded up to `tick` seconds: the callbacks due in one tick share one event-loop
    timer, so thousands of parked requests with the same latency cost few wake-ups. Never
    early; at most one tick late."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float = WHEEL_TICK):
        self.loop = loop
        self.tick = tick
        self._slots: dict[int, list[tuple[Callable[[Any], None], Any]]] = {}

    def call_later(self, delay: float, fn: Callable[[Any], None], arg: Any) -> None:
        slot = math.ceil((self.loop.time() + delay) / self.tick)
        bucket = self._slots.get(slot)
        if bucket is None:
            bucket = self._slots[slot] = []
            self.loop.call_at(slot * self.tick, self._fire, slot)
        bucket.append((fn, arg))

    def _fire(self, slot: int) -> None:
        for fn, arg in self._slots.pop(slot, ()):
            fn(arg)

    def clear(self) -> None:
        self._slots.clear()


class _Endpoint:
    """What a request needs of one provider, computed once."""

    __slots__ = ("faults", "quirks", "prompt_price", "completion_price", "cache_price",
                 "counting", "alternate")

    def __init__(self, p: ProviderConfig):
        self.faults = fault_table(p.faults)
        self.quirks = tuple((q, rate) for q, rate in p.quirks.items() if rate > 0)
        self.prompt_price = p.prompt_price()
        self.completion_price = p.completion_price()
        self.cache_price = p.cache_read_price()
        # How the provider counts, when not exactly (docs/sim.md, "Usage counting"):
        # (added to prompt_tokens, added to completion_tokens, completion noise).
        self.alternate = False  # usage_alternating: the sign of the last answer's error
        self.counting = None if p.counts_exactly else (
            p.hidden_system_prompt_tokens + p.usage_prompt_offset, p.usage_completion_offset,
            float(p.usage_noise))


def _tools_rendering(p: ProviderConfig, tools: list | None) -> int:
    """The provider's own rendering of a tools block: a constant per block, in [-N, N], not 0
    (`tools_rendering_tokens` = N; 0 without tools)."""
    n = p.tools_rendering_tokens
    if not n or not tools:
        return 0
    digest = hashlib.blake2b(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS),
                             digest_size=8, key=p.name.encode()[:64]).digest()
    value = int.from_bytes(digest, "little") % (2 * n) - n  # in [-N, N - 1]
    return value + 1 if value >= 0 else value


_NO_QUIRKS: frozenset[str] = frozenset()
_WRONG_MODEL = frozenset({"wrong_model"})
_TOOLS_IGNORED = frozenset({"tools_ignored"})
# Platform rate-limit headers of every 429 (X-RateLimit-Reset is set when it is sent).
_RATE_LIMIT_HEADERS = {"X-RateLimit-Limit": "200", "X-RateLimit-Remaining": "0"}


class Simulator:
    """State of one simulator; `handle` answers its HTTP requests."""

    def __init__(self, cfg: SimConfig | None = None, *, seed: int | None = None,
                 tokenizer: Tokenizer | str | None = None, renderer: str | None = None):
        self.cfg = cfg = cfg or SimConfig()
        self.seed = cfg.seed if seed is None else seed
        tok = tokenizer if tokenizer is not None else cfg.tokenizer
        self.tok = load_tokenizer(tok) if isinstance(tok, str) else tok
        name = renderer or cfg.renderer
        self.renderers = {t: get_renderer(name, self.tok, thinking=t) for t in (True, False)}
        if not isinstance(self.renderers[True], KimiRenderer):
            raise RenderError(f"the simulator speaks the Kimi serving format; renderer {name!r} "
                              "is not a Kimi renderer (kimi-k2.5, kimi-k2-thinking, "
                              "kimi-k2-instruct)")
        self.model = Model(cfg, self.tok, self.renderers, seed=self.seed)
        self._stop_ids = self.renderers[True].stop_token_ids  # a property that builds a set
        self.serving = Server(self.tok)
        self._plain_ok = self._check_plain()
        self._parser = ChatParser(cfg)
        self._router_faults = fault_table(cfg.faults)
        self._endpoints = {id(p): _Endpoint(p) for p in cfg.providers}
        self.stats = Stats()
        self.spent = 0.0
        # Budgets (docs/sim.md, "Budgets"): checked only when configured.
        self._budget = (None if cfg.in_flight_budget_usd is None else InFlightBudget(
            cfg.in_flight_budget_usd, cfg.in_flight_retry_after_s, cfg.in_flight_linger_s))
        self._spend_limit = cfg.spend_limit_usd
        self._limits = cfg.credit_limit_usd is not None or cfg.spend_limit_usd is not None
        self.outage_active = False  # set by `outages.Outages`
        self.outages_started = 0
        self._seen: dict[bytes, int] = {}
        self._seed_key = hashlib.blake2b(str(self.seed).encode(), digest_size=16).digest()
        self.generations: OrderedDict[str, tuple] = OrderedDict()
        self.started_at = time.time()
        self._wheel: Wheel | None = None
        self._tasks: set[asyncio.Task] = set()
        self._routes: dict[str, tuple[str, Callable[[Request], None]]] = {
            "/sim/stats": ("GET", self.get_stats), "/sim/reset": ("POST", self.reset)}
        for prefix in ("/api/v1", "/v1"):
            self._routes.update({
                prefix + "/chat/completions": ("POST", self.chat),
                prefix + "/models": ("GET", self.models),
                prefix + "/key": ("GET", self.key),
                prefix + "/generation": ("GET", self.generation),
            })
        self.batch_api = BatchApi(self)  # /v1/files and /v1/batches (specgen.sim.batch)
        self._routes.update({"/sim/batches/hold": ("POST", self.batch_api.hold),
                             "/sim/batches/release": ("POST", self.batch_api.release)})
        self.tokens = TokenEndpoints(self)  # token-in: vLLM /v1/completions, SGLang /generate
        self._routes.update(self.tokens.routes())

    def _check_plain(self) -> bool:
        """The plain shortcut (`Server.serve_plain`) gives what `Server.serve` gives, on a few
        samples per thinking mode; otherwise it is not used."""
        rng = random.Random(11)
        for thinking in (True, False):
            for _ in range(4):
                gen = self.model.generate(GenRequest(messages=[], tools=None, thinking=thinking),
                                          rng)
                if gen.plain is None:
                    continue
                for exclude in (False, True):
                    full = self._serve(gen, max_tokens=len(gen.ids), has_tools=False,
                                       exclude_reasoning=exclude)
                    plain = self.serving.serve_plain(gen.ids, gen.plain, exclude_reasoning=exclude)
                    if (self.serving.fold(full) != self.serving.fold(plain)
                            or (full.finish_reason, full.native_finish_reason, full.reasoning_tokens,
                                full.ids, full.quirks) != (plain.finish_reason,
                                plain.native_finish_reason, plain.reasoning_tokens, plain.ids,
                                plain.quirks)):
                        return False
        return True

    def _serve(self, gen: Generated, **options: Any) -> Served:
        """`Server.serve` of a generated completion (the full path, pieces and all)."""
        return self.serving.serve(
            gen.ids, start_in_reasoning=gen.thinking and gen.renderer.prompt_opens_think,
            stop_ids=self._stop_ids, marks=gen.marks, known=gen.known, **options)

    # -- http -----------------------------------------------------------------------------
    def handle(self, request: Request) -> None:
        """Answer one HTTP request (now or later, through `request`)."""
        path = request.path
        target = self._routes.get(path)
        if target is None:
            if path.endswith("/endpoints") and path.startswith(("/api/v1/models/", "/v1/models/")):
                target = ("GET", self.endpoints)
            elif self.batch_api.handle(request):
                return
            else:
                _json(request, 404, error_body(404, f"Not Found: {path[:200]}"))
                return
        method, fn = target
        if request.method != method:
            request.respond(405, orjson.dumps(error_body(405, "Method Not Allowed")),
                            headers={"Allow": method})
            return
        fn(request)

    async def close(self) -> None:
        """Cancel what is still running (after the server stopped taking connections)."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._wheel is not None:
            self._wheel.clear()
        self.batch_api.files.close()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind the timers to the loop the server runs in."""
        self._wheel = Wheel(loop)

    # -- small endpoints ------------------------------------------------------------------
    def _auth(self, request: Request) -> dict | None:
        """The 401 body when keys are configured and the request has none of them."""
        if not self.cfg.api_keys:
            return None
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer ") or not header[7:].strip():
            return error_body(401, "No auth credentials found")
        if header[7:].strip() not in self.cfg.api_keys:
            return error_body(401, "User not found.")
        return None

    def models(self, request: Request) -> None:
        data = []
        for m in self.cfg.models:
            eps = self._endpoints_of(m)
            top = eps[0] if eps else None
            data.append({
                "id": m, "canonical_slug": self.cfg.dated(m), "name": m, "created": 1769472000,
                "description": "Simulated by specgen sim.",
                "context_length": max((p.context_length for p in eps), default=0),
                "architecture": _ARCH,
                "pricing": _pricing(top) if top else {},
                "top_provider": {"context_length": top.context_length if top else 0,
                                 "max_completion_tokens": top.max_completion_tokens if top else 0,
                                 "is_moderated": False},
                "supported_parameters": sorted({s for p in eps for s in p.supported_parameters}),
            })
        _json(request, 200, {"data": data})

    def _endpoints_of(self, model: str) -> list[ProviderConfig]:
        return [p for p in self.cfg.providers if not p.models or model in p.models]

    def endpoints(self, request: Request) -> None:
        # .../models/{author}/{slug}/endpoints
        parts = request.path.split("/models/", 1)[1][:-len("/endpoints")].split("/")
        if len(parts) != 2 or not all(parts):
            _json(request, 404, error_body(404, f"Not Found: {request.path[:200]}"))
            return
        slug = f"{unquote(parts[0])}/{unquote(parts[1])}"
        model = next((m for m in self.cfg.models if slug in (m, self.cfg.dated(m))), None)
        if model is None:
            _json(request, 404, error_body(404, f"No endpoints found for {slug}"))
            return
        eps = [{
            "name": f"{p.name} | {model}", "model_name": model, "context_length": p.context_length,
            "pricing": _pricing(p), "provider_name": p.name, "tag": p.tag,
            "quantization": p.quantization, "max_completion_tokens": p.max_completion_tokens,
            "max_prompt_tokens": None, "supported_parameters": list(p.supported_parameters),
            "status": 0, "uptime_last_30m": p.uptime,
            "supports_implicit_caching": p.cache_hit_rate > 0,
            "latency_last_30m": {"p50": p.latency_s * 1000},
            "throughput_last_30m": {"p50": p.tokens_per_second},
        } for p in self._endpoints_of(model)]
        _json(request, 200, {"data": {"id": model, "name": model, "created": 1769472000,
                                      "description": "Simulated by specgen sim.",
                                      "architecture": _ARCH, "endpoints": eps}})

    def key(self, request: Request) -> None:
        denied = self._auth(request)
        if denied:
            _json(request, 401, denied)
            return
        limit = self.cfg.credit_limit_usd
        _json(request, 200, {"data": {
            "label": "specgen-sim", "limit": limit, "usage": self.spent,
            "limit_remaining": None if limit is None else max(0.0, limit - self.spent),
            "is_free_tier": False, "is_provisioning_key": False,
            "rate_limit": {"requests": -1, "interval": "10s"},
        }})

    def generation(self, request: Request) -> None:
        gid = (parse_qs(request.query).get("id") or [""])[0]
        gen = self.generations.get(gid)
        if gen is None:
            _json(request, 404, error_body(404, f"Generation {gid} not found"))
            return
        (provider, cost, n_prompt, n_completion, n_reasoning, n_cached, model, created, finish,
         streamed, latency) = gen
        _json(request, 200, {"data": {
            "id": gid, "total_cost": cost, "provider_name": provider,
            "model": self.cfg.dated(model), "created_at": created,
            "tokens_prompt": n_prompt, "tokens_completion": n_completion,
            "native_tokens_prompt": n_prompt, "native_tokens_completion": n_completion,
            "native_tokens_reasoning": n_reasoning, "native_tokens_cached": n_cached,
            "finish_reason": finish, "native_finish_reason": finish,
            "streamed": streamed, "cancelled": False, "latency": int(latency * 1000),
        }})

    def stats_json(self) -> dict[str, Any]:
        """The GET /sim/stats answer."""
        cfg = self.cfg
        out = self.stats.to_json()
        out["spent_usd"] = self.spent
        out["credit_limit_usd"] = cfg.credit_limit_usd
        out["spend_limit_usd"] = cfg.spend_limit_usd
        budget = self._budget
        out["in_flight_budget_usd"] = cfg.in_flight_budget_usd
        out["in_flight_weight_usd"] = budget.running() if budget else 0.0
        out["in_flight_weight_peak_usd"] = budget.peak if budget else 0.0
        out["outage_active"] = self.outage_active
        out["outages_started"] = self.outages_started
        out["uptime_s"] = time.time() - self.started_at
        out["seed"] = self.seed
        out["batches"] = self.batch_api.stats()
        return out

    def get_stats(self, request: Request) -> None:
        _json(request, 200, self.stats_json())

    def reset(self, request: Request) -> None:
        """Zero the counters and the spend (tests)."""
        in_flight = self.stats.in_flight
        self.stats = Stats()
        self.stats.in_flight = in_flight  # the open requests still finish (and count down)
        self.spent = 0.0
        if self._budget is not None:  # the weight in flight stays: those requests still run
            self._budget.peak = self._budget.running()
        _json(request, 200, {"ok": True})

    # -- chat: bookkeeping ------------------------------------------------------------------
    def chat(self, request: Request) -> None:
        st = self.stats
        st.requests += 1
        st.in_flight += 1
        ctx = _Ctx(self, request)
        try:
            self._chat(ctx)
        except Exception:
            self._crashed(ctx)

    def _finish(self, ctx: _Ctx, outcome: str) -> None:
        """Count the request's outcome (once)."""
        if ctx.finished:
            return
        ctx.finished = True
        ctx.step = None
        if ctx.weight:
            self._budget.release(ctx.weight)
        st = self.stats
        st.in_flight -= 1
        if outcome == "completed":
            st.completed += 1
        else:
            st.failed[outcome] = st.failed.get(outcome, 0) + 1

    def _fail(self, ctx: _Ctx, status: int, body: dict, outcome: str,
              headers: dict[str, str] | None = None) -> None:
        self._finish(ctx, outcome)
        ctx.request.respond(status, orjson.dumps(body), headers=headers)

    def _crashed(self, ctx: _Ctx) -> None:
        """A bug while answering: log it, answer 500 if nothing was sent, count it."""
        log.exception("error while answering a chat request")
        self._finish(ctx, "internal_error")
        request = ctx.request
        if request._state == 0:
            request.keep_alive = False
            request.respond(500, orjson.dumps(error_body(500, "Internal Server Error")))
        elif request._state == 1:
            request.reset()

    def _park(self, ctx: _Ctx, delay: float, step: Callable[[_Ctx], None]) -> None:
        """Run `step(ctx)` after `delay` seconds unless the client leaves first."""
        ctx.step = step
        ctx.request.on_lost = ctx.lost
        self._wheel.call_later(delay, self._wake, ctx)

    def _wake(self, ctx: _Ctx) -> None:
        step = ctx.step
        if step is None:
            return  # the client went away
        ctx.step = None
        ctx.request.on_lost = None
        try:
            step(ctx)
        except Exception:
            self._crashed(ctx)

    def _lost(self, ctx: _Ctx) -> None:
        """The client went away while its request was parked or streaming."""
        if ctx.task is not None:
            ctx.task.cancel()  # the stream coroutine counts it
        else:
            self._finish(ctx, "cancelled")

    def _spawn(self, ctx: _Ctx, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        ctx.task = task
        ctx.request.on_lost = ctx.lost
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- chat: the request ----------------------------------------------------------------
    def _chat(self, ctx: _Ctx) -> None:
        cfg = self.cfg
        request = ctx.request
        raw = request.body
        if cfg.api_keys:
            denied = self._auth(request)
            if denied:
                return self._fail(ctx, 401, denied, "unauthorized")
        try:
            body = jsonexact.loads(raw)  # a server's JSON keeps integers beyond 64 bits
        except orjson.JSONDecodeError as exc:
            return self._fail(ctx, 400, error_body(
                400, f"request body is not valid JSON: {exc}"), "bad_request")
        try:
            req = self._parser.parse(body, ids_header=request.headers.get(IDS_HEADER) == "1")
        except BadRequest as exc:
            return self._fail(ctx, 400, error_body(400, str(exc)), "bad_request")
        del body
        rng, answer_key, content_key = self._rngs(raw, req.seed)
        request.body = raw = b""  # hold no body while waiting
        if self._limits:
            if cfg.credit_limit_usd is not None and self.spent >= cfg.credit_limit_usd:
                return self._fail(ctx, 402, error_body(
                    402, "This request requires more credits, or fewer max_tokens. You have "
                    f"spent ${self.spent:.6f} of your ${cfg.credit_limit_usd:g} limit.",
                    {"limit_source": "openrouter_credits"}), "credits")
            if self._spend_limit is not None and self.spent >= self._spend_limit:
                return self._fail(ctx, 403, spend_limit_error(cfg, self.spent), "spend_limit")
        try:
            candidates = route(cfg.providers, req.model, req.provider, params=req.params,
                               has_tools=bool(req.tools), rng=rng, sort=req.sort)
        except NoEndpoints as exc:
            return self._fail(ctx, 404, error_body(404, exc.message, availability={
                "code": exc.code, "retryable": False}), "no_endpoints")
        renderer = self.renderers[req.thinking]
        try:
            prompt_ids = array("I", renderer.prompt_ids(req.messages, req.tools))
        except (RenderError, NotImplementedError, TypeError, ValueError, KeyError,
                AttributeError) as exc:
            return self._fail(ctx, 400, error_body(
                400, f"messages could not be rendered: {exc}"), "bad_request")
        n_prompt = len(prompt_ids)
        fitting = [p for p in candidates if n_prompt < p.context_length]
        if not fitting:
            most = max(p.context_length for p in candidates)
            return self._fail(ctx, 400, error_body(
                400, f"This endpoint's maximum context length is {most} tokens. However, you "
                f"requested about {n_prompt} tokens. Please reduce the length of the "
                "messages."), "bad_request")
        if self._budget:
            # Weighed at the first pick's prices, before any fault or fallback.
            first = self._endpoints[id(fitting[0])]
            weight = (n_prompt * first.prompt_price + (req.max_tokens or fitting[0]
                      .max_completion_tokens) * first.completion_price)
            refused = self._budget.admit(weight)
            if refused is not None:
                status, body, headers, outcome = refused
                return self._fail(ctx, status, body, outcome, headers=headers)
            ctx.weight = weight

        endpoints = self._endpoints
        fault = draw(self._router_faults, rng)
        provider = fitting[0]
        if fault is None:
            for k, p in enumerate(fitting):
                provider = p
                fault = draw(endpoints[id(p)].faults, rng)
                if fault in FALLBACK_FAULTS and k + 1 < len(fitting):
                    self.stats.fallbacks += 1
                    self.stats.count_fault(fault, p.name)
                    continue
                break
        ps, latency = self._answering(provider, fault, rng)
        ctx.provider = provider
        if provider.rerenders_history or provider.serving:
            # its serving stack rebuilds the history (vLLM/SGLang: arguments parsed and
            # written back with tojson, list content joined, ...): the model sees that
            # history (docs/sim.md)
            alt = (history_as_served(req.messages, provider.serving,
                                     renderer.content_format(provider.serving))
                   if provider.serving else reserialized_history(req.messages))
            if alt is not None:
                prompt_ids = array("I", renderer.prompt_ids(alt, req.tools))
        req.call_rate = provider.tool_call_rate
        req.schema_violation_rate = provider.schema_violation_rate
        if fault in HTTP_FAULTS:
            ps["failed"] += 1
            ctx.fault = fault
            ctx.error = self._http_fault(fault, provider, req, rng)
            if latency > 0:
                return self._park(ctx, latency, self._send_error)
            return self._send_error(ctx)

        rates = endpoints[id(provider)].quirks
        model = cfg.dated(req.model)
        if rates:
            quirks = frozenset(q for q, rate in rates if rng.random() < rate)
            if "wrong_model" in quirks:  # not a serving quirk: only the name changes
                quirks = quirks - _WRONG_MODEL
                model = cfg.wrong_model_slug
                ctx.wrong_model = True
            if "tools_ignored" in quirks:
                quirks = quirks - _TOOLS_IGNORED
                if req.tools:  # the model sees no declaration; no tool parser runs
                    req.tools_ignored = True
                    history = (reserialized_history(req.messages) if provider.rerenders_history
                               else None) or req.messages
                    prompt_ids = array("I", renderer.prompt_ids(history, None))
        else:
            quirks = _NO_QUIRKS
        ctx.quantization = None
        if provider.actual_quantization:  # what really serves it: the declared one, or not
            rate = provider.actual_quantization_rate
            ctx.quantization = (provider.actual_quantization
                                if rate >= 1.0 or rng.random() < rate else provider.quantization)
        now = time.time()
        gen_id = f"gen-{int(now)}-{rng.getrandbits(64):016x}"
        del rng  # nothing more is drawn before the answer: hold no state while waiting
        ctx.world = self._world(provider, req)  # before the messages may be let go
        if self.model.fast:
            req.messages = []  # the answer needs only what parse_chat_request kept
        ctx.req, ctx.quirks, ctx.prompt_ids, ctx.gen_id = req, quirks, prompt_ids, gen_id
        ctx.model = model
        ctx.created, ctx.latency, ctx.fault = int(now), latency, fault
        ctx.answer_key, ctx.content_key = answer_key, content_key
        if req.stream:
            return self._spawn(ctx, self._stream(ctx))
        # The answer is sampled after the time to first token, so waiting requests are cheap.
        wait = latency + (cfg.slow_first_byte_s if fault == "slow_first_byte" else 0.0)
        if wait > 0:
            return self._park(ctx, wait, self._generated)
        return self._generated(ctx)

    def _answering(self, provider: ProviderConfig, fault: str | None, rng: random.Random
                   ) -> tuple[dict[str, Any], float]:
        """Count a request (and its fault) for the provider that answers it: its stats, and
        its time to first token for this request (jitter drawn from `rng`)."""
        ps = self.stats.provider(provider.name)
        ps["requests"] += 1
        if fault is not None:
            self.stats.count_fault(fault, provider.name)
        latency = provider.latency_s
        if provider.latency_jitter:
            latency *= 1.0 + provider.latency_jitter * (2.0 * rng.random() - 1.0)
        return ps, latency

    def _send_error(self, ctx: _Ctx) -> None:
        status, body, headers = ctx.error
        if status == 429:  # the reset time counts from when the 429 is sent
            headers["X-RateLimit-Reset"] = str(int((time.time() + self.cfg.retry_after_s)
                                                   * 1000))
        self._fail(ctx, status, body, ctx.fault, headers=headers)

    def _generated(self, ctx: _Ctx) -> None:
        """Time to first token is over: sample the answer; send it once "generated"."""
        self._answer(ctx)
        tps = ctx.provider.tokens_per_second
        if tps > 0:
            return self._park(ctx, len(ctx.served.ids) / tps, self._complete)
        return self._complete(ctx)

    def _answer(self, ctx: _Ctx) -> None:
        """Sample the completion and serve it: sets ctx.served, ctx.usage, ctx.resegmented
        and the draws the rest of the answer needs (ctx.draw)."""
        req, provider = ctx.req, ctx.provider
        rng = HashRandom(ctx.answer_key)
        content_rng = rng if ctx.content_key is None else HashRandom(ctx.content_key)
        if not req.tools and "tool_calls_in_content" in ctx.quirks:
            req.force_raw_tool_call = True
        gen = self.model.generate(req, content_rng)  # a ChatRequest has GenRequest's fields
        n_prompt = len(ctx.prompt_ids)
        max_tokens = min(req.max_tokens or provider.max_completion_tokens,
                         provider.max_completion_tokens, provider.context_length - n_prompt)
        if (gen.plain is not None and self._plain_ok and not req.stream and not ctx.quirks
                and not req.stop and len(gen.ids) <= max_tokens):
            ctx.served = self.serving.serve_plain(gen.ids, gen.plain,
                                                  exclude_reasoning=req.exclude_reasoning)
        else:
            ctx.served = self._serve(gen, max_tokens=max_tokens, stop=req.stop,
                                     has_tools=bool(req.tools) and not req.tools_ignored,
                                     quirks=ctx.quirks,
                                     exclude_reasoning=req.exclude_reasoning, rng=rng)
        ctx.resegmented = gen.resegmented
        if ctx.wrong_model:
            ctx.served.quirks = sorted([*ctx.served.quirks, "wrong_model"])
        if req.tools_ignored:
            ctx.served.quirks = sorted([*ctx.served.quirks, "tools_ignored"])
        ctx.usage = self._usage(provider, n_prompt, ctx.served, rng, req.tools,
                                world=ctx.world)
        ctx.draw = rng.random()  # where a failing answer breaks off, which error shape

    def _rngs(self, raw: bytes, seed: int | None) -> tuple[HashRandom, bytes, bytes | None]:
        """Randomness of one request, from the sim seed, the body and how many times this
        exact body was seen before (docs/sim.md, "Determinism"): (rng for routing, faults
        and quirks; key of the answer's rng; key of the content's rng when the request has a
        `seed`, else None)."""
        digest = hashlib.blake2b(raw, digest_size=16, key=self._seed_key).digest()
        seen = self._seen
        if len(seen) >= _SEEN_LIMIT:
            seen.clear()
        occurrence = seen.get(digest, 0)
        seen[digest] = occurrence + 1
        base = digest + occurrence.to_bytes(8, "little") if occurrence else digest
        content = None
        if seed is not None:
            content = b"c" + digest + (seed & ((1 << 128) - 1)).to_bytes(16, "little")
        return HashRandom(b"p" + base), b"a" + base, content

    def _world(self, p: ProviderConfig, req) -> int:
        """What a world-like provider adds to the prompt count for this request's history:
        `history_rendering_tokens` per earlier assistant or tool message, less the default
        system prompt under `omits_default_system` (docs/sim.md, "Usage counting")."""
        if not (p.history_rendering_tokens or p.omits_default_system):
            return 0
        messages = req.messages or []
        add = p.history_rendering_tokens * sum(
            isinstance(m, dict) and m.get("role") in ("assistant", "tool") for m in messages)
        if p.omits_default_system and not any(
                isinstance(m, dict) and m.get("role") == "system" for m in messages):
            renderer = self.renderers[req.thinking]
            bare = renderer.prompt_ids([{"role": "system", "content": ""}, *messages],
                                       req.tools)
            add -= max(0, len(renderer.prompt_ids(messages, req.tools)) - len(bare))
        return add

    def _usage(self, p: ProviderConfig, n_prompt: int, served: Served, rng: random.Random,
               tools: list | None = None, world: int = 0) -> dict[str, Any]:
        n_completion = len(served.ids)
        cached = 0
        if p.cache_hit_rate and rng.random() < p.cache_hit_rate:
            cached = int(n_prompt * rng.uniform(0.5, 1.0)) // 64 * 64
        ep = self._endpoints[id(p)]
        billed = p.billed_price_factor  # 1: as listed
        prompt_cost = ((n_prompt - cached) * ep.prompt_price + cached * ep.cache_price) * billed
        completion_cost = n_completion * ep.completion_price * billed
        cost = prompt_cost + completion_cost
        counting = ep.counting
        if counting is not None:  # the provider counts its own way; the cost stays true
            prompt_add, completion_add, noise = counting
            if noise:
                n_completion = round(n_completion * rng.uniform(1.0 - noise, 1.0 + noise))
            form = self.serving.form(served)
            completion_add = p.usage_completion_offsets.get(form, completion_add)
            if p.usage_alternating:
                ep.alternate = not ep.alternate
                completion_add += 1 if ep.alternate else -1
            n_completion = max(0, n_completion + completion_add)
            n_prompt = max(0, n_prompt + prompt_add + _tools_rendering(p, tools) + world)
            if p.prompt_drop_rate and rng.random() < p.prompt_drop_rate:
                n_prompt = max(0, n_prompt - 10 - int(n_prompt * rng.uniform(0.1, 0.5)))
            cached = min(cached, n_prompt)
        return {
            "prompt_tokens": n_prompt, "completion_tokens": n_completion,
            "total_tokens": n_prompt + n_completion, "cost": cost, "is_byok": False,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "cost_details": {"upstream_inference_cost": None,
                             "upstream_inference_prompt_cost": prompt_cost,
                             "upstream_inference_completions_cost": completion_cost},
            "completion_tokens_details": {"reasoning_tokens": served.reasoning_tokens,
                                          "image_tokens": 0},
        }

    def _http_fault(self, fault: str, p: ProviderConfig, req: ChatRequest, rng: random.Random
                    ) -> tuple[int, dict[str, Any], dict[str, str] | None]:
        """(status, body, headers) of an HTTP-status fault."""
        status = HTTP_FAULTS[fault]
        if fault == "moderation":
            last = req.messages[-1].get("content")
            return 403, moderation_error(p.name, req.model, last if isinstance(last, str) else ""), None
        body = provider_error(status, p.name, self.cfg.error_metadata, rng)
        headers = None
        if status == 429:
            retry_after = self.cfg.retry_after_s
            body["error"]["metadata"]["retry_after_seconds"] = retry_after
            headers = {"Retry-After": _retry_after(retry_after), **_RATE_LIMIT_HEADERS}
        return status, body, headers

    def _account(self, ctx: _Ctx) -> None:
        usage = ctx.usage
        cost = usage["cost"]
        served = ctx.served
        name = ctx.provider.name
        n_prompt, n_completion = usage["prompt_tokens"], usage["completion_tokens"]
        self.spent += cost
        # The stats count the true tokens (as the cost does); the generation log, like usage,
        # what the provider reported.
        self.stats.add_completion(name, len(ctx.prompt_ids), len(served.ids),
                                  served.reasoning_tokens, cost, served.quirks, ctx.resegmented)
        if ctx.quantization:
            served_by = self.stats.provider(name).setdefault("quantizations", {})
            served_by[ctx.quantization] = served_by.get(ctx.quantization, 0) + 1
        # Kept slim (the JSON is built only if someone asks): no messages, no ids.
        # Atomic values only: the garbage collector then stops tracking the tuple.
        generations = self.generations
        generations[ctx.gen_id] = (
            name, cost, n_prompt, n_completion, served.reasoning_tokens,
            usage["prompt_tokens_details"]["cached_tokens"], ctx.req.model, ctx.created,
            served.finish_reason, ctx.req.stream, ctx.latency)
        if len(generations) > GENERATION_LOG:
            generations.popitem(last=False)

    # -- non-stream -----------------------------------------------------------------------
    def _message(self, ctx: _Ctx, served: Served) -> dict[str, Any]:
        reasoning, content, calls = self.serving.fold(served)
        msg: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if reasoning is not None:
            if ctx.provider.reasoning_field == "reasoning":
                msg["reasoning"] = reasoning
                msg["reasoning_details"] = [{"type": "reasoning.text", "text": reasoning,
                                             "format": "unknown", "index": 0}]
            else:
                msg["reasoning_content"] = reasoning
        elif ctx.provider.reasoning_field == "reasoning":
            msg["reasoning"] = None
        if calls:
            msg["tool_calls"] = calls
        return msg

    def _body(self, ctx: _Ctx, served: Served, **choice_extra: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "logprobs": None, "finish_reason": served.finish_reason,
            "native_finish_reason": served.native_finish_reason, "index": 0,
            "message": self._message(ctx, served),
        }
        choice.update(choice_extra)
        body: dict[str, Any] = {
            "id": ctx.gen_id, "provider": ctx.provider.name, "model": ctx.model,
            "object": "chat.completion", "created": ctx.created, "choices": [choice],
            "system_fingerprint": None, "usage": ctx.usage,
        }
        if ctx.quantization and ctx.provider.reveal_quantization:
            body["quantization"] = ctx.quantization
        if ctx.req.want_ids:
            body["prompt_token_ids"] = ctx.prompt_ids.tolist()
            choice["token_ids"] = served.ids
            body["specgen_sim"] = self._sim_info(ctx, served)
        return body

    def _sim_info(self, ctx: _Ctx, served: Served) -> dict[str, Any]:
        return {"quirks": served.quirks, "resegmented": ctx.resegmented,
                "provider_tag": ctx.provider.tag, "fault": ctx.fault,
                "quantization": ctx.quantization or ctx.provider.quantization}

    def _complete(self, ctx: _Ctx) -> None:
        """Send the non-stream answer (or the fault that breaks it)."""
        fault = ctx.fault
        if fault in ("error_in_body", "mid_stream_error"):
            if fault == "error_in_body" and ctx.draw < 0.5:
                body = error_body(502, "Provider returned error", {
                    "provider_name": ctx.provider.name, "raw": "upstream connection closed"})
            else:
                partial = self._partial(ctx)
                body = self._body(ctx, partial, error={
                    "code": 502, "message": "Provider disconnected unexpectedly",
                    "metadata": {"provider_name": ctx.provider.name, "raw": "stream closed"}})
                body["choices"][0]["finish_reason"] = "error"
                body["choices"][0]["native_finish_reason"] = "error"
            self.stats.provider(ctx.provider.name)["failed"] += 1
            return self._fail(ctx, 200, body, fault)
        payload = orjson.dumps(self._body(ctx, ctx.served))
        self._send_payload(ctx, payload, fault, self._account)

    def _send_payload(self, ctx, payload: bytes, fault: str | None,
                      account: Callable[[Any], None]) -> None:
        """Send a non-stream 200 body, or break it as the fault says (`malformed_json`: half
        of it and garbage; `connection_reset`: half of it, then a TCP reset); `account`
        books a completed answer. `ctx` is a chat `_Ctx` or a token-in job."""
        request = ctx.request
        if fault == "malformed_json":
            self.stats.provider(ctx.provider.name)["failed"] += 1
            cut = payload[: max(1, len(payload) // 2)]
            self._finish(ctx, fault)
            return request.respond(200, cut + b"\x00\x00 <html>upstream")
        if fault == "connection_reset":
            # The status line, the headers and half the body; then a TCP reset.
            self.stats.provider(ctx.provider.name)["failed"] += 1
            request.write_raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(payload)
                              + payload[: len(payload) // 2])
            return self._park(ctx, 0.02, self._reset)
        account(ctx)
        self._finish(ctx, "completed")
        request.respond(200, payload)

    def _reset(self, ctx: _Ctx) -> None:
        self._finish(ctx, "connection_reset")
        ctx.request.reset()

    def _partial(self, ctx: _Ctx) -> Served:
        """The answer as it stood when generation failed part-way (about half of it)."""
        s = ctx.served
        half = max(1, len(s.ids) // 2)
        return self.serving.serve(s.ids, start_in_reasoning=ctx.req.thinking and self.renderers[
            ctx.req.thinking].prompt_opens_think, stop_ids=self._stop_ids,
            max_tokens=half, has_tools=bool(ctx.req.tools) and not ctx.req.tools_ignored)

    # -- stream ---------------------------------------------------------------------------
    async def _stream(self, ctx: _Ctx) -> None:
        outcome = "cancelled"
        try:
            outcome = await self._stream_body(ctx)
        except ConnectionResetError:
            pass  # the client went away while we waited for it to read
        except asyncio.CancelledError:
            raise  # the client went away (or the server stops): counted as cancelled
        except Exception:
            self._crashed(ctx)
        finally:
            self._finish(ctx, outcome)

    async def _stream_body(self, ctx: _Ctx) -> str:
        cfg = self.cfg
        request = ctx.request
        fault = ctx.fault
        if fault == "slow_first_byte":
            await asyncio.sleep(cfg.slow_first_byte_s)
        request.start_stream(200, _STREAM_HEADERS)
        if cfg.keepalive_initial:
            request.write(KEEPALIVE)
        # Waiting for the first token: keep-alive comments.
        if ctx.latency > 0:
            deadline = time.monotonic() + ctx.latency
            interval = cfg.keepalive_interval_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await asyncio.sleep(min(left, interval) if interval > 0 else left)
                if interval > 0 and deadline - time.monotonic() > 0:
                    request.write(KEEPALIVE)
                    await request.drain()
        if fault == "error_in_body":
            self.stats.provider(ctx.provider.name)["failed"] += 1
            request.write(_event(error_body(502, "Provider returned error", {
                "provider_name": ctx.provider.name, "raw": "upstream connection closed"})) + DONE)
            request.end_stream()
            return fault
        self._answer(ctx)
        return await send_stream(
            self, ctx, self._events(ctx), account=self._account,
            error_event=lambda: _event(self._chunk(ctx, {"content": ""}, None, finish="error") | {
                "error": {"code": 502, "message": "Provider disconnected unexpectedly",
                          "metadata": {"provider_name": ctx.provider.name,
                                       "raw": "stream closed"}}}),
            broken_event=lambda: b'data: {"id": "' + ctx.gen_id.encode()
            + b'", "choices": [{"delta"\n\n')

    def _chunk(self, ctx: _Ctx, delta: dict[str, Any] | None, token_ids: list[int] | None, *,
               finish: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish,
                                  "native_finish_reason": finish, "logprobs": None}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        chunk = {"id": ctx.gen_id, "provider": ctx.provider.name,
                 "model": ctx.model, "object": "chat.completion.chunk",
                 "created": ctx.created, "choices": [choice]}
        if ctx.quantization and ctx.provider.reveal_quantization:
            chunk["quantization"] = ctx.quantization
        return chunk

    def _events(self, ctx: _Ctx) -> list[tuple[bytes, int]]:
        """Every SSE event of the answer (after the keep-alives), with its token count."""
        want = ctx.req.want_ids
        served = ctx.served
        first = self._chunk(ctx, {"role": "assistant", "content": ""}, [] if want else None)
        if want:
            first["prompt_token_ids"] = ctx.prompt_ids.tolist()
        events = [(_event(first), 0)]
        pending: list[int] = []
        for delta, ids in self.serving.stream_deltas(served, self.cfg.stream_chunk_tokens,
                                                     ctx.provider.reasoning_field):
            if delta is None:
                pending = ids
                break
            events.append((_event(self._chunk(ctx, delta, ids if want else None)), len(ids)))
        if "duplicate_events" in ctx.quirks and not want:
            # a text event sent twice (a relay's retransmission): the text doubles, the ids
            # and the usage do not (never with true ids, which would double as well)
            texts = [k for k, (ev, n) in enumerate(events) if n and b'"content":"' in ev
                     or n and b'"reasoning' in ev]
            if texts:
                k = texts[len(texts) // 2]
                events.insert(k + 1, (events[k][0], 0))
                served.quirks = sorted({*served.quirks, "duplicate_events"})
        last = self._chunk(ctx, {"content": ""}, pending if want else None,
                           finish=served.finish_reason)
        last["choices"][0]["native_finish_reason"] = served.native_finish_reason
        events.append((_event(last), len(pending)))
        usage = {"id": ctx.gen_id, "provider": ctx.provider.name,
                 "model": ctx.model, "object": "chat.completion.chunk",
                 "created": ctx.created, "choices": [], "usage": ctx.usage}
        if ctx.quantization and ctx.provider.reveal_quantization:
            usage["quantization"] = ctx.quantization
        if want:
            usage["specgen_sim"] = self._sim_info(ctx, served)
        events.append((_event(usage), 0))
        return events


class _Ctx:
    """Everything about one chat request being answered."""

    __slots__ = ("sim", "request", "finished", "step", "task", "error", "req", "provider",
                 "quirks", "served", "usage", "world", "prompt_ids", "resegmented", "answer_key",
                 "content_key", "draw", "gen_id", "created", "latency", "fault", "model",
                 "weight", "wrong_model", "quantization")

    def __init__(self, sim: Simulator, request: Request):
        self.sim = sim
        self.request = request
        self.finished = False
        self.step: Callable[[_Ctx], None] | None = None  # what runs when a parked request wakes
        self.task: asyncio.Task | None = None  # a stream's coroutine
        self.error: tuple | None = None  # an HTTP fault's (status, body, headers)
        self.provider: ProviderConfig | None = None
        self.fault: str | None = None
        self.served: Served | None = None
        self.usage: dict[str, Any] = {}
        self.world = 0  # what a world-like provider adds to the prompt count (Simulator._world)
        self.resegmented = 0
        self.draw = 0.0
        self.weight = 0.0  # in-flight budget weight held (USD), released by _finish
        self.wrong_model = False
        self.quantization: str | None = None  # what served it, when not simply the declared

    def lost(self) -> None:
        self.sim._lost(self)


_ARCH = {"modality": "text->text", "input_modalities": ["text", "image"],
         "output_modalities": ["text"], "tokenizer": "Other", "instruct_type": None}


def _pricing(p: ProviderConfig) -> dict[str, str]:
    return {"prompt": _per_token(p.prompt_price()), "completion": _per_token(p.completion_price()),
            "request": "0", "image": "0", "web_search": "0", "internal_reasoning": "0",
            "input_cache_read": _per_token(p.cache_read_price())}


def _per_token(x: float) -> str:
    text = f"{x:.12f}".rstrip("0").rstrip(".")
    return text or "0"


def _retry_after(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


def _json(request: Request, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
    request.respond(status, orjson.dumps(obj), headers=headers)


def _event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"

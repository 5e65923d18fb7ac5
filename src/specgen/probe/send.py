"""Sending a probe: the endpoints to probe, the worst-case cost, the pinned canary requests.

Each endpoint the config's provider policy allows (from `GET /models/{model}/endpoints`,
narrowed by `--providers`) gets the same canaries, each pinned to it with
`provider: {only: [tag], allow_fallbacks: false}` (plus the config's data-policy filters), so
the answer can only come from that endpoint. The reference provider (`--reference`, default
the model author's own endpoint) is probed too, even when the policy leaves it out.

Before anything is sent the worst case is computed: every canary answered with `max_tokens`
at the endpoint's listed prices. Above `--max-cost` the probe refuses to start; while it runs
a request is sent only when what was billed plus the worst case of what is in flight still
fits, so the cap holds even when answers are retried; an endpoint that bills more than it
lists has its worst case counted at what it bills (`CostCap`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from ..client.retry import backoff_delay
from ..client.types import ACCOUNT_LIMITS, ApiError
from ..config import RunConfig
from ..engine.model_check import ModelCheck
from ..engine.policy import Endpoint, ProviderPolicy, parse_endpoints
from ..request import build_request, local_engines
from ..sampling import sample_settings
from .measure import SKIPPED, Observation, Thresholds, judge_witness, observe_answer
from .suite import Canary, canaries

# The config's provider keys a pinned canary keeps: data policies a run would also apply.
KEPT_FILTERS = ("require_parameters", "data_collection", "zdr", "enforce_distillable_text")
DEFAULT_MAX_TOKENS = 4096  # per canary, at most (the dataset's own when smaller)
RETRY_WAIT_CAP = 30.0  # seconds a probe waits for one retry at most


class ProbeError(Exception):
    """The probe cannot start (`code` 2) or stopped on a fatal error (`code` 1)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


@dataclass
class ProbeOptions:
    per_provider: int = 8
    providers: list[str] = field(default_factory=list)  # empty: every allowed endpoint
    reference: str | None = None  # None: the model author's own endpoint, when listed
    max_cost_usd: float = 1.0
    max_tokens: int | None = None  # None: min(the dataset's, DEFAULT_MAX_TOKENS)
    concurrency: int = 8
    suite: str = "auto"
    attempts: int = 3  # per canary and endpoint, for retryable errors
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass
class Target:
    """One endpoint to probe."""

    endpoint: Endpoint
    in_policy: bool  # the config's provider policy allows it (only these can be kept)
    reference: bool = False

    @property
    def tag(self) -> str:
        return self.endpoint.tag


@dataclass
class Plan:
    targets: list[Target]
    canaries: list[Canary]
    canary_source: str
    bodies: dict[tuple[str, str], dict[str, Any]]  # (tag, canary id) -> request body
    worst: dict[tuple[str, str], float]  # (tag, canary id) -> worst-case USD
    thinking: dict[str, bool]  # canary id -> reasoning asked
    left_out: list[str] = field(default_factory=list)  # listed endpoints not probed

    @property
    def estimate_usd(self) -> float:
        return sum(self.worst.values())

    @property
    def reference(self) -> Target | None:
        return next((t for t in self.targets if t.reference), None)


@dataclass
class ProbeResult:
    plan: Plan
    observations: dict[str, list[Observation]]  # tag -> its observations, canary order
    spent_usd: float = 0.0
    stopped: str | None = None  # why it stopped early (an account budget)
    capped: str | None = None  # what --max-cost left unmeasured (None: nothing)
    billed_rates: dict[str, float] = field(default_factory=dict)  # tag -> billed / listed


def _matches(name: str, ep: Endpoint) -> bool:
    return ProviderPolicy({"only": [name]}, [ep]).endpoint_allowed(ep)


def choose_targets(cfg: RunConfig, endpoints: list[Endpoint], opts: ProbeOptions
                   ) -> list[Target]:
    """The endpoints to probe: the policy's allowed ones (narrowed by `--providers`), and the
    reference."""
    policy = ProviderPolicy(cfg.endpoint.provider, endpoints)
    allowed = policy.allowed_endpoints()
    if opts.providers:
        unknown = [n for n in opts.providers if not any(_matches(n, ep) for ep in endpoints)]
        if unknown:
            raise ProbeError(f"--providers: {', '.join(unknown)} not in the endpoint list of "
                             f"{cfg.target.model} ({policy.describe()})")
        allowed = [ep for ep in allowed if any(_matches(n, ep) for n in opts.providers)]
    if not allowed:
        raise ProbeError(f"no endpoint of {cfg.target.model} to probe: the provider policy "
                         f"(and --providers) leave none of {policy.describe()}")
    targets = [Target(ep, in_policy=True) for ep in allowed]
    ref_name = opts.reference or cfg.target.model.split("/", 1)[0]
    ref = next((ep for ep in allowed if _matches(ref_name, ep)), None) or next(
        (ep for ep in endpoints if _matches(ref_name, ep)), None)
    if ref is None and opts.reference:
        raise ProbeError(f"--reference {opts.reference}: not in the endpoint list of "
                         f"{cfg.target.model} ({policy.describe()})")
    if ref is not None:
        found = next((t for t in targets if t.endpoint == ref), None)
        if found is None:
            found = Target(ref, in_policy=False)
            targets.insert(0, found)
        found.reference = True
    return targets


def pinned(provider: dict[str, Any], tag: str) -> dict[str, Any]:
    """The provider object of a canary pinned to one endpoint."""
    out = {k: provider[k] for k in KEPT_FILTERS if k in provider}
    out.update({"only": [tag], "allow_fallbacks": False})
    return out


def _prices(cfg: RunConfig, ep: Endpoint) -> tuple[float, float]:
    b = cfg.budget
    prompt = ep.prompt_price if b.prompt_price_per_m is None else b.prompt_price_per_m / 1e6
    completion = (ep.completion_price if b.completion_price_per_m is None
                  else b.completion_price_per_m / 1e6)
    if prompt is None or completion is None:
        raise ProbeError(f"no price for endpoint {ep.tag} in the endpoint list, so the probe "
                         "cannot bound its cost: set [budget] prompt_price_per_m and "
                         "completion_price_per_m")
    return prompt, completion


def make_plan(cfg: RunConfig, endpoints: list[Endpoint], opts: ProbeOptions,
              renderer_for) -> Plan:
    """Targets, canaries, the exact bodies and each one's worst-case cost."""
    targets = choose_targets(cfg, endpoints, opts)
    chosen, source = canaries(cfg, opts.per_provider, opts.suite)
    if not chosen:
        raise ProbeError("no canary requests: the datasets have no readable rows (check them "
                         "with `specgen preview`) — or use --suite builtin")
    bodies, worst, thinking = {}, {}, {}
    for c in chosen:
        st = sample_settings(cfg, c.ds, c.id, c.request.turn)
        thinking[c.id] = st.thinking
        n_prompt = len(renderer_for(st.thinking).prompt_ids(c.messages, c.tools))
        max_tokens = opts.max_tokens or min(cfg.max_tokens_for(c.ds), DEFAULT_MAX_TOKENS)
        base = build_request(cfg, c.ds, c.request, base_url="sim", settings=st)
        base.update(max_tokens=max_tokens, stream=True,
                    stream_options={"include_usage": True})
        for t in targets:
            prompt_price, completion_price = _prices(cfg, t.endpoint)
            bodies[(t.tag, c.id)] = {**base, "provider": pinned(cfg.endpoint.provider, t.tag)}
            worst[(t.tag, c.id)] = n_prompt * prompt_price + max_tokens * completion_price
    probed = {t.tag for t in targets}
    return Plan(targets, chosen, source, bodies, worst, thinking,
                left_out=[ep.tag for ep in endpoints if ep.tag not in probed])


class CostCap:
    """What was billed plus the worst case of everything in flight never passes the cap.

    The worst case of a request is its listed-price worst case times what its endpoint was
    seen to bill over its listed prices (`rate`: billed / listed for the tokens answered, the
    highest seen, at least 1): an endpoint that bills more than it lists is found out on its
    first answer, and until that first bill only one request at a time goes to it
    (`first_bill`), so no batch of under-priced requests is in flight at once."""

    def __init__(self, cap: float):
        self.cap = cap
        self.spent = 0.0  # billed (usage.cost; the listed price where none is reported)
        self.reserved = 0.0
        self.rate: dict[str, float] = {}  # endpoint tag -> billed / listed, once known
        self.reached = False  # a request did not fit
        self._locks: dict[str, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def first_bill(self, tag: str):
        """Held around a request to `tag` while its rate is unknown: one at a time."""
        if tag in self.rate:
            yield
            return
        lock = self._locks.setdefault(tag, asyncio.Lock())
        await lock.acquire()
        if tag in self.rate:
            lock.release()
            yield
            return
        try:
            yield
        finally:
            lock.release()

    def reserve(self, tag: str, listed_worst: float) -> float | None:
        """The amount reserved for one request to `tag`, or None: it does not fit."""
        worst = listed_worst * self.rate.get(tag, 1.0)
        if self.spent + self.reserved + worst > self.cap + 1e-12:
            self.reached = True
            return None
        self.reserved += worst
        return worst

    def settle(self, reserved: float, cost: float, tag: str | None = None,
               listed: float | None = None) -> None:
        """A request is over: `cost` billed; `listed` what its tokens cost at the listed
        prices (None: not known, the rate is not learned from it)."""
        self.reserved = max(0.0, self.reserved - reserved)
        self.spent += cost
        if tag is not None and listed is not None:
            rate = cost / listed if listed > 0 else (1.0 if cost <= 0 else math.inf)
            self.rate[tag] = max(1.0, self.rate.get(tag, 1.0), rate)

    def summary(self, observations: dict[str, list[Observation]]) -> str | None:
        """What the cap left unmeasured, in words (None: every canary was sent)."""
        unsent = {tag: sum(o.error == SKIPPED for o in obs) for tag, obs in observations.items()}
        total = sum(len(obs) for obs in observations.values())
        n = sum(unsent.values())
        if not n:
            return None
        over = [f"{tag} bills {r:.3g}x its listed price" for tag, r in self.rate.items()
                if r > 1.0 + 1e-9]
        return (f"stopped at the cost cap (--max-cost ${self.cap:g}, billed "
                f"${self.spent:.4f}{'; ' + ', '.join(over) if over else ''}): {n} of {total} "
                "canaries not sent, left unmeasured: "
                + ", ".join(f"{tag} {k}/{len(observations[tag])}"
                            for tag, k in unsent.items() if k))


class Stop(Exception):
    """An account budget is spent: nothing more can be sent."""


def check_can_start(cfg: RunConfig) -> None:
    """The probe pins providers through OpenRouter's provider object and needs the API key."""
    ep = cfg.endpoint
    if ep.dialect == "openai" or ep.tokens_mode:
        raise ProbeError("specgen probe pins providers through OpenRouter's provider object: "
                         "it needs an OpenRouter-like endpoint (or base_url = \"sim\")")
    key = ep.api_key_env
    if not ep.is_sim and key and not os.environ.get(key) and not local_engines(ep.base_url):
        raise ProbeError(f"the API key is not set: export {key}=... (endpoint.api_key_env "
                         "names the variable; the key is never written anywhere)")


async def fetch_endpoints(cfg: RunConfig, client) -> list[Endpoint]:
    path = f"models/{quote(cfg.target.model, safe='/')}/endpoints"
    try:
        endpoints = parse_endpoints(await client.get_json(path))
    except ApiError as err:
        if err.kind == "auth":
            raise ProbeError(f"the API refused the key while listing endpoints: {err}") from None
        raise ProbeError(f"no endpoint list from the server ({err}): specgen probe needs "
                         "OpenRouter's GET /models/{model}/endpoints (or the simulator's)"
                         ) from None
    if not endpoints:
        raise ProbeError(f"the endpoint list of {cfg.target.model} is empty: nothing to probe")
    return endpoints


async def send_plan(cfg: RunConfig, client, plan: Plan, opts: ProbeOptions, renderer_for,
                    stages, *, on_answer=None) -> ProbeResult:
    """Send every canary to every target; the observations, per endpoint."""
    cap = CostCap(opts.max_cost_usd)
    sem = asyncio.Semaphore(max(1, opts.concurrency))
    model_check = ModelCheck(cfg.target.model, cfg.endpoint.accept_models)
    endpoints = [t.endpoint for t in plan.targets]
    obs: dict[str, list[Observation]] = {t.tag: [] for t in plan.targets}
    jobs = []
    for c in plan.canaries:  # canary-major: a cap hit spares every endpoint alike
        for t in plan.targets:
            o = Observation(canary=c.id, endpoint=t.tag, has_tools=bool(c.tools),
                            thinking=plan.thinking[c.id])
            obs[t.tag].append(o)
            jobs.append((t, c, o))

    async def one(t: Target, c: Canary, o: Observation) -> None:
        body, worst = plan.bodies[(t.tag, c.id)], plan.worst[(t.tag, c.id)]
        check = ProviderPolicy({"only": [t.tag]}, endpoints)
        async with sem:
            for attempt in range(1, opts.attempts + 1):
                async with cap.first_bill(t.tag):
                    reserved = cap.reserve(t.tag, worst)
                    if reserved is None:
                        o.error, o.detail = SKIPPED, f"--max-cost ${cap.cap:g} reached"
                        return
                    try:
                        resp = await client.chat(body)
                    except ApiError as err:
                        cap.settle(reserved, err.cost_usd or 0.0)
                        resp = err
                    else:
                        p, q = _prices(cfg, t.endpoint)
                        listed = resp.prompt_tokens * p + resp.completion_tokens * q
                        # priced by the list when no cost is reported: bounded anyway
                        cost = listed if resp.cost_usd is None else resp.cost_usd
                        cap.settle(reserved, cost, t.tag, listed)
                if isinstance(resp, ApiError):
                    err = resp
                    if err.kind in ACCOUNT_LIMITS:
                        raise Stop(str(err)) from None
                    if err.kind == "auth":
                        raise ProbeError(f"the API refused the key: {err}", code=1) from None
                    if err.retryable and attempt < opts.attempts:
                        await asyncio.sleep(min(RETRY_WAIT_CAP, backoff_delay(
                            attempt, base=cfg.endpoint.retry_base_delay,
                            cap=cfg.endpoint.retry_max_delay, retry_after=err.retry_after)))
                        continue
                    o.error, o.detail = err.kind, str(err)[:300]
                    return
                why = check.rejection(resp.provider) or model_check.rejection(resp.model)
                if why is not None:
                    o.error = f"rejected:{why}"
                    o.detail = f"answered by {resp.provider!r} ({resp.model!r})"
                    o.cost_usd = cost
                    return
                observe_answer(o, resp, c.tools, renderer_for(o.thinking), c.messages,
                               stages.normalize, stages.quarantined)
                if on_answer is not None:
                    on_answer(t, o)
                return

    result = ProbeResult(plan, obs)
    tasks = [asyncio.ensure_future(one(*j)) for j in jobs]
    try:
        await asyncio.gather(*tasks)
    except Stop as exc:
        result.stopped = f"an account budget is spent: {exc}"
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for items in obs.values():
        judge_witness(items)
        for o in items:
            if result.stopped and not o.ok and o.error is None:
                o.error = "stopped"
    result.spent_usd = cap.spent
    result.capped = cap.summary(obs)
    result.billed_rates = {tag: round(r, 4) for tag, r in cap.rate.items()}
    return result

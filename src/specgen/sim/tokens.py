"""Token-in endpoints: the simulator as a local vLLM or SGLang server (docs/sim.md,
"Token-in endpoints (vLLM and SGLang shapes)").

`POST /v1/completions` (vLLM's shape, also under `/api/v1`) and `POST /generate` (SGLang's)
take prompt token ids and answer with the ids the simulated model sampled: no chat template,
no reasoning or tool parser, no serving quirks, exact usage. What to sample is read off the
ids, as the Kimi renderers write them: the generation prompt at the end says whether thinking
is on, the `tool_declare` message which tools exist, the `<|tool_call_begin|>` markers how many
calls the conversation made. Providers are picked as for chat (no preferences, no fallback)
and bring their latency, speed, context limits and faults.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import json
import re
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ..render.kimi import (
    CALL_ARG,
    CALL_BEGIN,
    END_THINK,
    IM_END,
    IM_MIDDLE,
    IM_SYSTEM,
    tool_name_from_id,
)
from .chat_request import body_and_model
from .faults import HTTP_FAULTS, draw
from .generate import GenRequest
from .pacing import DONE, send_stream
from .rand import HashRandom
from .routing import BadRequest, NoEndpoints, route

if TYPE_CHECKING:
    from .http import Request


class Simulator(Protocol):
    """What the token-in routes use of the simulator (sim/server.py's `Simulator`, which owns
    them); a protocol, so this module needs no import of its owner."""

    cfg: Any
    model: Any
    tok: Any
    renderers: Any
    stats: Any
    _endpoints: dict[int, Any]
    _router_faults: Any
    _seed_key: bytes
    _answering: Callable[..., Any]
    _auth: Callable[..., Any]
    _crashed: Callable[..., Any]
    _fail: Callable[..., Any]
    _finish: Callable[..., Any]
    _lost: Callable[..., Any]
    _park: Callable[..., Any]
    _rngs: Callable[..., Any]
    _send_payload: Callable[..., Any]
    _spawn: Callable[..., Any]

VLLM, SGLANG = "vllm", "sglang"
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's own default when max_new_tokens is absent
_NUMERIC = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
            "repetition_penalty")
_STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
# Status -> (vLLM-style error type, message) of the HTTP faults.
_FAULT_ERRORS = {
    429: ("RateLimitError", "Too many requests, please retry later"),
    408: ("TimeoutError", "Request timed out"),
    500: ("InternalServerError", "Internal server error"),
    502: ("BadGatewayError", "Bad gateway"),
    503: ("ServiceUnavailableError", "The engine is currently overloaded, please retry later"),
    403: ("ForbiddenError", "The request was refused by the content filter"),
}
_ERROR_TYPES = {400: "BadRequestError", 401: "UnauthorizedError", 404: "NotFoundError"}


class _Refused(Exception):
    """A request answered with an error before any sampling: (status, message, outcome)."""

    def __init__(self, status: int, message: str, outcome: str = "bad_request"):
        super().__init__(message)
        self.status, self.message, self.outcome = status, message, outcome


@dataclass(slots=True)
class TokenRequest:
    """A validated token-in request (either shape)."""

    api: str  # VLLM or SGLANG
    model: str  # as asked (vLLM), or the first served model (SGLang)
    served: str  # the served slug it names
    prompt: list[int]
    max_tokens: int | None  # None: the provider's max_completion_tokens
    stop_ids: frozenset[int]  # besides the renderer's own stop ids
    stream: bool = False
    include_usage: bool = False
    include_stop: bool = False  # vLLM include_stop_str_in_output; SGLang no_stop_trim (text)
    skip_special: bool = True
    want_ids: bool = False  # vLLM return_token_ids (SGLang always returns output_ids)
    seed: int | None = None


@dataclass(slots=True)
class PromptInfo:
    """What the prompt ids say about the request (the model's only input)."""

    thinking: bool
    tools: list[dict[str, Any]] | None
    prior_tool_calls: int
    history_tool: str | None


class _Job:
    """One token-in request being answered (what `Simulator._park` / `_finish` need)."""

    __slots__ = ("sim", "request", "finished", "step", "task", "weight", "api", "t0", "req",
                 "provider", "fault", "latency", "rng", "sampled", "finish", "matched",
                 "gen_id", "created", "draw", "counts")

    def __init__(self, sim: Simulator, request: Request, api: str):
        self.sim = sim
        self.request = request
        self.api = api
        self.finished = False
        self.step: Callable[[_Job], None] | None = None
        self.task: asyncio.Task | None = None
        self.weight = 0.0  # no in-flight budget here
        self.t0 = time.monotonic()
        self.fault: str | None = None

    def lost(self) -> None:
        self.sim._lost(self)


class TokenEndpoints:
    """The handlers of the token-in routes of one `Simulator`."""

    def __init__(self, sim: Simulator):
        self.sim = sim
        tok = sim.tok
        self.tok = tok
        self.vocab = tok.vocab_size
        self.specials = frozenset(tok.id_to_special)
        # Generation-prompt tails, thinking on first (a renderer without a thinking switch
        # has the same tail for both; then thinking "on" is what the model gets).
        self._tails = [(t, tuple(tok.encode(sim.renderers[t].generation_prompt())))
                       for t in (True, False)]
        self._stop_ids = frozenset(sim.renderers[True].stop_token_ids)
        special = tok.special_tokens
        self._id = {name: special.get(name) for name in (IM_SYSTEM, IM_MIDDLE, IM_END,
                                                          CALL_BEGIN, CALL_ARG, END_THINK)}
        self._served: dict[str, str] = {}
        for m in reversed(sim.cfg.models):
            self._served[sim.cfg.dated(m)] = m
            self._served[m] = m
        self._declarations: dict[str, list[dict[str, Any]] | None] = {}

    def routes(self) -> dict[str, tuple[str, Callable[[Request], None]]]:
        return {"/v1/completions": ("POST", self.completions),
                "/api/v1/completions": ("POST", self.completions),
                "/generate": ("POST", self.generate)}

    # -- http -----------------------------------------------------------------------------
    def completions(self, request: Request) -> None:
        self._handle(request, VLLM)

    def generate(self, request: Request) -> None:
        self._handle(request, SGLANG)

    def _handle(self, request: Request, api: str) -> None:
        sim = self.sim
        sim.stats.requests += 1
        sim.stats.in_flight += 1
        job = _Job(sim, request, api)
        try:
            self._start(job)
        except _Refused as exc:
            self._error(job, exc.status, exc.message, exc.outcome)
        except Exception:
            sim._crashed(job)

    def _error(self, job: _Job, status: int, message: str, outcome: str,
               headers: dict[str, str] | None = None, kind: str | None = None) -> None:
        if job.api == VLLM:
            body: dict[str, Any] = {"object": "error", "message": message,
                                    "type": kind or _ERROR_TYPES.get(status, "Error"),
                                    "param": None, "code": status}
        else:
            body = {"error": {"message": message}}
        self.sim._fail(job, status, body, outcome, headers=headers)

    def _start(self, job: _Job) -> None:
        sim, cfg, request = self.sim, self.sim.cfg, job.request
        raw = request.body
        request.body = b""
        if cfg.api_keys and sim._auth(request):
            raise _Refused(401, "Unauthorized", "unauthorized")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise _Refused(400, f"request body is not valid JSON: {exc}") from None
        try:
            req = self.parse_vllm(body) if job.api == VLLM else self.parse_sglang(body)
        except BadRequest as exc:
            raise _Refused(400, str(exc)) from None
        info = self.read_prompt(req.prompt)
        rng, answer_key, _ = sim._rngs(raw, None)
        try:
            candidates = route(cfg.providers, req.served, {}, params=set(), has_tools=False,
                               rng=rng)
        except NoEndpoints as exc:
            raise _Refused(404, exc.message, "no_endpoints") from None
        n_prompt = len(req.prompt)
        fitting = [p for p in candidates if n_prompt < p.context_length and (
            req.max_tokens is None or n_prompt + req.max_tokens <= p.context_length)]
        if not fitting:
            most = max(p.context_length for p in candidates)
            asked = n_prompt + (req.max_tokens or 0)
            detail = (f"{asked} tokens ({n_prompt} in the prompt, {req.max_tokens} in the "
                      "completion)" if req.max_tokens else f"{n_prompt} tokens in the prompt")
            raise _Refused(400, f"This model's maximum context length is {most} tokens. "
                           f"However, you requested {detail}. Please reduce the length of the "
                           "prompt or completion.")
        provider = fitting[0]  # a local engine does not fall back: its faults show
        fault = draw(sim._router_faults, rng) or draw(sim._endpoints[id(provider)].faults, rng)
        ps, latency = sim._answering(provider, fault, rng)
        if fault == "slow_first_byte":
            latency += cfg.slow_first_byte_s
        job.req, job.provider, job.fault, job.latency = req, provider, fault, latency
        if fault in HTTP_FAULTS:
            ps["failed"] += 1
            if latency > 0:
                return sim._park(job, latency, self._send_fault)
            return self._send_fault(job)
        # Sample now: the answer is known before its time to first token is over.
        answer = HashRandom(answer_key)
        content = answer if req.seed is None else HashRandom(self._content_key(req))
        gen = sim.model.generate(GenRequest(
            messages=[], tools=info.tools, thinking=info.thinking,
            prior_tool_calls=info.prior_tool_calls, history_tool=info.history_tool,
            call_rate=provider.tool_call_rate,
            schema_violation_rate=provider.schema_violation_rate), content)
        max_tokens = min(provider.max_completion_tokens if req.max_tokens is None
                         else req.max_tokens, provider.max_completion_tokens,
                         provider.context_length - n_prompt)
        job.sampled, job.finish, job.matched = self.cut(gen.ids, max_tokens, req.stop_ids)
        job.rng, job.draw = answer, answer.random()
        now = time.time()
        job.created = int(now)
        job.gen_id = f"{answer.getrandbits(128):032x}"
        self._count(job, gen.thinking, gen.resegmented)
        if req.stream:
            return sim._spawn(job, self._stream(job))
        tps = provider.tokens_per_second
        wait = latency + (len(job.sampled) / tps if tps > 0 else 0.0)
        if wait > 0:
            return sim._park(job, wait, self._respond)
        return self._respond(job)

    def _content_key(self, req: TokenRequest) -> bytes:
        """With a `seed`, the content depends on the model, the prompt ids and the seed only
        (not on stream, max_tokens, stop ids or anything else in the body)."""
        h = hashlib.blake2b(digest_size=16, key=self.sim._seed_key)
        h.update(req.served.encode() + b"\0")
        h.update(array("I", req.prompt).tobytes())
        return b"t" + h.digest() + (req.seed & ((1 << 128) - 1)).to_bytes(16, "little")

    # -- request bodies -------------------------------------------------------------------
    def parse_vllm(self, body: Any) -> TokenRequest:
        get, model = body_and_model(body)
        served = self._served.get(model)
        if served is None:
            raise _Refused(404, f"The model `{model}` does not exist.")
        prompt = get("prompt")
        if type(prompt) is list and len(prompt) == 1 and type(prompt[0]) is list:
            prompt = prompt[0]
        if type(prompt) is str:
            prompt = self.tok.encode(prompt)
        elif type(prompt) is list:
            self._check_ids(prompt, "prompt")
        else:
            raise BadRequest("prompt: required, a list of token ids (or a string)")
        if not prompt:
            raise BadRequest("prompt: must not be empty")
        max_tokens = _opt_int(get("max_tokens"), "max_tokens", 1)
        stream = _bool(body, "stream", False)
        options = get("stream_options")
        if options is not None and type(options) is not dict:
            raise BadRequest("stream_options: expected an object")
        include_usage = _bool(options or {}, "include_usage", False, "stream_options.")
        _check_numbers(body)
        seed = get("seed")
        if seed is not None and type(seed) is not int:
            raise BadRequest("seed: expected an integer")
        return TokenRequest(
            VLLM, model, served, prompt, max_tokens, self._stop_list(get("stop_token_ids"),
                                                                     "stop_token_ids"),
            stream=stream, include_usage=include_usage,
            include_stop=_bool(body, "include_stop_str_in_output", False),
            skip_special=_bool(body, "skip_special_tokens", True),
            want_ids=_bool(body, "return_token_ids", False), seed=seed)

    def parse_sglang(self, body: Any) -> TokenRequest:
        if type(body) is not dict:
            raise BadRequest("request body must be a JSON object")
        get = body.get
        if _bool(body, "stream", False):
            raise BadRequest("streaming /generate is not simulated")
        ids = get("input_ids")
        if ids is None:
            text = get("text")
            if type(text) is not str or not text:
                raise BadRequest("input_ids: required (or text)")
            ids = self.tok.encode(text)
        elif type(ids) is not list:
            raise BadRequest("input_ids: expected a list of token ids")
        elif ids and type(ids[0]) is list:
            raise BadRequest("input_ids: batches (a list of lists) are not simulated")
        else:
            self._check_ids(ids, "input_ids")
        if not ids:
            raise BadRequest("input_ids: must not be empty")
        sp = get("sampling_params")
        if sp is None:
            sp = {}
        elif type(sp) is not dict:
            raise BadRequest("sampling_params: expected an object")
        max_new = _opt_int(sp.get("max_new_tokens"), "sampling_params.max_new_tokens", 0)
        _check_numbers(sp, "sampling_params.")
        seed = sp.get("sampling_seed")
        if seed is not None and type(seed) is not int:
            raise BadRequest("sampling_params.sampling_seed: expected an integer")
        model = self.sim.cfg.models[0]
        return TokenRequest(
            SGLANG, model, model, ids,
            SGLANG_DEFAULT_MAX_NEW_TOKENS if max_new is None else max_new,
            self._stop_list(sp.get("stop_token_ids"), "sampling_params.stop_token_ids"),
            include_stop=_bool(sp, "no_stop_trim", False, "sampling_params."),
            skip_special=_bool(sp, "skip_special_tokens", True, "sampling_params."), seed=seed)

    def _check_ids(self, ids: list[Any], field: str) -> None:
        vocab = self.vocab
        for i, t in enumerate(ids):
            if type(t) is not int:
                raise BadRequest(f"{field}[{i}]: expected an integer token id")
            if not 0 <= t < vocab:
                raise BadRequest(f"{field}[{i}]: token id {t} is out of vocabulary "
                                 f"(vocabulary size {vocab})")

    def _stop_list(self, value: Any, field: str) -> frozenset[int]:
        if value is None:
            return frozenset()
        if type(value) is not list or not all(type(t) is int and t >= 0 for t in value):
            raise BadRequest(f"{field}: expected a list of token ids")
        return frozenset(value)

    # -- the prompt -----------------------------------------------------------------------
    def read_prompt(self, ids: list[int]) -> PromptInfo:
        """Thinking mode, declared tools and tool-call history, from the prompt ids."""
        thinking = None
        for t, tail in self._tails:
            if len(ids) >= len(tail) and tuple(ids[len(ids) - len(tail):]) == tail:
                thinking = t
                break
        if thinking is None:
            raise _Refused(400, "prompt does not end with the assistant generation prompt")
        begin = self._id[CALL_BEGIN]
        prior = ids.count(begin) if begin is not None else 0
        history = None
        if prior:
            b = len(ids) - 1 - list(reversed(ids)).index(begin)
            arg = self._id[CALL_ARG]
            end = next((j for j in range(b + 1, len(ids)) if ids[j] == arg), None)
            if end is not None:
                history = tool_name_from_id(self.tok.decode(ids[b + 1:end])) or None
        return PromptInfo(thinking, self._tools(ids), prior, history)

    def _tools(self, ids: list[int]) -> list[dict[str, Any]] | None:
        """The tools of the prompt's `tool_declare` message (None without one)."""
        system, middle, end = self._id[IM_SYSTEM], self._id[IM_MIDDLE], self._id[IM_END]
        n = len(ids)
        i = -1
        for _ in range(4):  # the renderers write it first; a few system messages are checked
            try:
                i = ids.index(system, i + 1)
            except ValueError:
                return None
            j = next((k for k in range(i + 1, min(n, i + 16)) if ids[k] == middle), None)
            if j is None or self.tok.decode(ids[i + 1:j]) != "tool_declare":
                continue
            try:
                k = ids.index(end, j + 1)
            except ValueError:
                k = n
            text = self.tok.decode(ids[j + 1:k])
            if text not in self._declarations:
                if len(self._declarations) > 256:
                    self._declarations.clear()
                self._declarations[text] = parse_declaration(text)
            return self._declarations[text]
        return None

    # -- the answer -----------------------------------------------------------------------
    def cut(self, ids: list[int], max_tokens: int, stop_ids: frozenset[int]
            ) -> tuple[list[int], str, int | None]:
        """(sampled ids, finish reason, matched stop id): the completion up to its first stop
        id (included), or its first `max_tokens` ids."""
        stops = self._stop_ids | stop_ids if stop_ids else self._stop_ids
        for i, t in enumerate(ids[:max_tokens]):
            if t in stops:
                return ids[:i + 1], "stop", t
        if len(ids) < max_tokens:  # ended without a stop id (not sampled by this model)
            return list(ids), "stop", None
        return ids[:max_tokens], "length", None

    def _returned(self, job: _Job) -> list[int]:
        """The ids the answer shows: without the matched stop id unless asked for (vLLM)."""
        ids = job.sampled
        if job.matched is not None and (job.api == SGLANG or not job.req.include_stop):
            return ids[:-1]
        return ids

    def _text_ids(self, job: _Job, ids: list[int]) -> list[int]:
        if job.api == SGLANG and job.req.include_stop and job.matched is not None:
            ids = job.sampled  # no_stop_trim: the stop token's text stays in the text
        if job.req.skip_special:
            specials = self.specials
            return [i for i in ids if i not in specials]
        return ids

    def _count(self, job: _Job, thinking: bool, resegmented: int) -> None:
        """What the stats count once the answer is sent: the true counts, the cost at the
        provider's prices (counted in `cost_usd`, not spent: no budgets here)."""
        ep = self.sim._endpoints[id(job.provider)]
        n_prompt, n_completion = len(job.req.prompt), len(job.sampled)
        reasoning = 0
        if thinking:  # the ids before </think> (all of them when cut before it)
            end = self._id[END_THINK]
            reasoning = job.sampled.index(end) if end in job.sampled else n_completion
        job.counts = (n_prompt, n_completion, reasoning,
                      n_prompt * ep.prompt_price + n_completion * ep.completion_price,
                      resegmented)

    def _account(self, job: _Job) -> None:
        n_prompt, n_completion, reasoning, cost, resegmented = job.counts
        self.sim.stats.add_completion(job.provider.name, n_prompt, n_completion, reasoning, cost,
                                      [], resegmented)

    def _usage(self, job: _Job) -> dict[str, int]:
        p, c = len(job.req.prompt), len(job.sampled)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _vllm_body(self, job: _Job) -> dict[str, Any]:
        ids = self._returned(job)
        choice: dict[str, Any] = {
            "index": 0, "text": self.tok.decode(self._text_ids(job, ids)), "logprobs": None,
            "finish_reason": job.finish, "stop_reason": job.matched}
        body: dict[str, Any] = {"id": "cmpl-" + job.gen_id, "object": "text_completion",
                                "created": job.created, "model": job.req.model,
                                "choices": [choice]}
        if job.req.want_ids:
            choice["token_ids"] = ids
            body["prompt_token_ids"] = job.req.prompt
        body["usage"] = self._usage(job)
        return body

    def _sglang_body(self, job: _Job) -> dict[str, Any]:
        ids = self._returned(job)
        finish: dict[str, Any] = (
            {"type": "stop", "matched": job.matched} if job.finish == "stop"
            else {"type": "length", "length": len(job.sampled)})
        return {"text": self.tok.decode(self._text_ids(job, ids)), "output_ids": ids,
                "meta_info": {"id": job.gen_id, "finish_reason": finish,
                              "prompt_tokens": len(job.req.prompt),
                              "completion_tokens": len(job.sampled), "cached_tokens": 0,
                              "e2e_latency": time.monotonic() - job.t0}}

    # -- sending --------------------------------------------------------------------------
    def _send_fault(self, job: _Job) -> None:
        status = HTTP_FAULTS[job.fault]
        kind, message = _FAULT_ERRORS[status]
        headers = None
        if status == 429:
            retry = self.sim.cfg.retry_after_s
            headers = {"Retry-After": str(int(retry)) if float(retry).is_integer()
                       else f"{retry:g}"}
        self._error(job, status, message, job.fault, headers=headers, kind=kind)

    def _broken_body(self, job: _Job) -> dict[str, Any]:
        """A 200 whose body says generation failed (fault error_in_body / mid_stream_error)."""
        if job.api == VLLM:
            return {"object": "error", "message": "engine error while generating",
                    "type": "InternalServerError", "param": None, "code": 500}
        half = self._returned(job)[: len(job.sampled) // 2]
        return {"text": self.tok.decode(self._text_ids(job, half)), "output_ids": half,
                "meta_info": {"id": job.gen_id, "finish_reason": {
                    "type": "abort", "message": "engine error while generating"},
                    "prompt_tokens": len(job.req.prompt), "completion_tokens": len(half),
                    "cached_tokens": 0, "e2e_latency": time.monotonic() - job.t0}}

    def _respond(self, job: _Job) -> None:
        sim, fault = self.sim, job.fault
        if fault in ("error_in_body", "mid_stream_error"):
            sim.stats.provider(job.provider.name)["failed"] += 1
            return sim._fail(job, 200, self._broken_body(job), fault)
        body = self._vllm_body(job) if job.api == VLLM else self._sglang_body(job)
        sim._send_payload(job, orjson.dumps(body), fault, self._account)

    async def _stream(self, job: _Job) -> None:
        outcome = "cancelled"
        try:
            outcome = await self._stream_body(job)
        except ConnectionResetError:
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            self.sim._crashed(job)
        finally:
            self.sim._finish(job, outcome)

    def _events(self, job: _Job) -> list[tuple[bytes, int]]:
        """Every SSE event of a vLLM stream with the tokens it stands for (paced by them)."""
        req, rng = job.req, job.rng
        ids = self._returned(job)
        head = {"id": "cmpl-" + job.gen_id, "object": "text_completion",
                "created": job.created, "model": req.model}
        pieces: list[list[int]] = []
        i = 0
        while i < len(ids) or not pieces:
            n = rng.randint(1, 4)
            pieces.append(ids[i:i + n])
            i += n
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        events = []
        for k, piece in enumerate(pieces):
            last = k == len(pieces) - 1
            text = decoder.decode(self.tok.decode_bytes(self._text_ids(job, piece)), final=last)
            choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None,
                                      "finish_reason": job.finish if last else None,
                                      "stop_reason": job.matched if last else None}
            if req.want_ids:
                choice["token_ids"] = piece
            chunk = {**head, "choices": [choice]}
            if k == 0 and req.want_ids:
                chunk["prompt_token_ids"] = req.prompt
            n_tokens = len(piece) + (len(job.sampled) - len(ids) if last else 0)
            events.append((_event(chunk), n_tokens))
        if req.include_usage:
            events.append((_event({**head, "choices": [], "usage": self._usage(job)}), 0))
        return events

    async def _stream_body(self, job: _Job) -> str:
        request, fault = job.request, job.fault
        if job.latency > 0:
            await asyncio.sleep(job.latency)
        request.start_stream(200, _STREAM_HEADERS)
        if fault == "error_in_body":
            self.sim.stats.provider(job.provider.name)["failed"] += 1
            request.write(_event({"error": self._broken_body(job)}) + DONE)
            request.end_stream()
            return fault
        return await send_stream(
            self.sim, job, self._events(job), account=self._account,
            error_event=lambda: _event({"error": self._broken_body(job)}) + DONE,
            broken_event=lambda: b'data: {"id": "cmpl-' + job.gen_id.encode()
            + b'", "choices": [{"te\n\n')


# -- tool declarations ------------------------------------------------------------------------
_DEFAULT_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def parse_declaration(text: str) -> list[dict[str, Any]] | None:
    """OpenAI-format tools from the body of a Kimi `tool_declare` message: the JSON the
    K2-Thinking / K2-Instruct renderers (and K2.5's fallback) write, or K2.5's TypeScript
    namespace, read back into JSON schemas (`number` becomes `integer`, which the encoder
    writes the same way; a function whose parameters cannot be read gets an empty object
    schema). None when nothing is recognised."""
    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
        if isinstance(data, dict):
            data = [data]
        if isinstance(data, list):
            tools = [t for t in data if isinstance(t, dict) and isinstance(t.get("function"), dict)
                     and isinstance(t["function"].get("name"), str) and t["function"]["name"]]
            for t in tools:
                if not isinstance(t["function"].get("parameters"), dict):
                    t["function"]["parameters"] = dict(_DEFAULT_PARAMETERS)
            return tools or None
    if _NAMESPACE not in text:
        return None
    try:
        start = text.index(_NAMESPACE) + len(_NAMESPACE)
        functions = _TypeScript(text[start:]).functions()
    except (ValueError, IndexError):
        functions = [{"name": m, "parameters": dict(_DEFAULT_PARAMETERS)}
                     for m in _TYPE_LINE.findall(text)]
    return [{"type": "function", "function": fn} for fn in functions] or None


_NAMESPACE = "namespace functions {"
_TYPE_LINE = re.compile(r"^type (\S+) = \(_: ", re.M)
_IDENT = re.compile(r"[A-Za-z_$][\w$.-]*")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")
_FIELD = re.compile(r"([^\n:?]+?)(\?)?: ")
_CONSTRAINTS = {"maxLength", "minLength", "pattern", "maximum", "minimum", "maxItems",
                "minItems"}
_SCALARS = {"string": {"type": "string"}, "number": {"type": "integer"},
            "boolean": {"type": "boolean"}, "null": {"type": "null"}, "any": {}}
_LITERALS = {"true": True, "false": False, "True": True, "False": False, "None": None}


class _TypeScript:
    """A reader for the TypeScript `kimi_k25_tool_declaration` writes: the inverse of its
    encoder for the shapes it produces (comments become descriptions, `// k: v` constraint
    lines and `// Default:` lines schema keys). Raises ValueError on anything else."""

    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.comments: list[str] = []  # comment lines read since the last schema took them

    def functions(self) -> list[dict[str, Any]]:
        out = []
        defs: dict[str, Any] = {}
        while True:
            self.comments = []
            self.ws()
            if self.s.startswith("}", self.i):
                return out
            if self.take("interface "):
                name = self.ident()
                comments = self.comments
                self.ws()
                defs[name] = _annotate(self.type(), comments)
            elif self.take("type "):
                comments = self.comments
                name = self.s[self.i:self.s.index(" = (_: ", self.i)]
                self.i += len(name) + len(" = (_: ")
                self.ws()
                if self.take("parameters"):  # a self-referencing root: `interface parameters`
                    params = defs.pop("parameters", dict(_DEFAULT_PARAMETERS))
                else:
                    params = self.type()
                self.ws()
                self.expect(") => any;")
                if defs:
                    params["$defs"] = defs
                fn: dict[str, Any] = {"name": name}
                if comments:
                    fn["description"] = "\n".join(comments)
                fn["parameters"] = params
                out.append(fn)
                defs = {}
            else:
                raise ValueError(f"unexpected text at {self.i}")

    # -- lexing ---------------------------------------------------------------------------
    def ws(self) -> None:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\n\r":
                self.i += 1
            elif s.startswith("//", self.i):
                end = s.find("\n", self.i)
                end = len(s) if end < 0 else end
                line = s[self.i + 2:end]
                self.comments.append(line[1:] if line.startswith(" ") else line)
                self.i = end
            else:
                return

    def take(self, word: str) -> bool:
        if self.s.startswith(word, self.i):
            self.i += len(word)
            return True
        return False

    def expect(self, word: str) -> None:
        if not self.take(word):
            raise ValueError(f"expected {word!r} at {self.i}")

    def ident(self) -> str:
        m = _IDENT.match(self.s, self.i)
        if not m:
            raise ValueError(f"expected a name at {self.i}")
        self.i = m.end()
        return m.group()

    # -- types ----------------------------------------------------------------------------
    def annotated(self) -> dict[str, Any]:
        """A type with the comment lines before it."""
        self.comments = []
        self.ws()
        comments = self.comments
        return _annotate(self.type(), comments)

    def type(self) -> dict[str, Any]:
        members = [self.member()]
        while True:
            save = self.i
            self.ws()
            if not self.take("| "):
                self.i = save
                break
            members.append(self.member())
        if len(members) == 1:
            return members[0]
        if all("const" in m for m in members):
            return {"enum": [m["const"] for m in members]}
        return {"anyOf": [{"enum": [m["const"]]} if "const" in m else m for m in members]}

    def member(self) -> dict[str, Any]:
        self.ws()
        s, i = self.s, self.i
        if s.startswith("{", i):
            return self.object()
        if s.startswith('"', i):
            end = s.index('"', i + 1)
            self.i = end + 1
            return {"const": s[i + 1:end]}
        if s.startswith("Array<", i):
            self.i += 6
            item = self.annotated()
            self.ws()
            self.expect(">")
            return {"type": "array", "items": item}
        m = _NUMBER.match(s, i)
        if m:
            self.i = m.end()
            return {"const": _number(m)}
        name = self.ident()
        if name in _SCALARS:
            return dict(_SCALARS[name])
        if name in _LITERALS:
            return {"const": _LITERALS[name]}
        if name == "never":
            return {"not": {}}
        return {"$ref": "#" if name == "parameters" else f"#/$defs/{name}"}

    def object(self) -> dict[str, Any]:
        self.expect("{")
        props: dict[str, Any] = {}
        required: list[str] = []
        extra: Any = None
        while True:
            self.comments = []
            self.ws()
            if self.take("}"):
                break
            if self.take("[k: string]: "):
                extra = self.type()
                if extra == {"not": {}}:
                    extra = False
            else:
                m = _FIELD.match(self.s, self.i)
                if not m:
                    raise ValueError(f"expected a field at {self.i}")
                comments = self.comments
                self.i = m.end()
                name = m.group(1)
                props[name] = _annotate(self.type(), comments)
                if not m.group(2):
                    required.append(name)
            self.ws()
            self.take(",")
        out: dict[str, Any] = {"type": "object", "properties": props}
        if required:
            out["required"] = required
        if extra is not None:
            out["additionalProperties"] = extra
        return out


def _number(m: re.Match) -> int | float:
    text = m.group()
    return float(text) if m.group(1) or m.group(2) else int(text)


def _annotate(schema: dict[str, Any], comments: list[str]) -> dict[str, Any]:
    """Comment lines into the schema: `Default: X`, a `k: v, ...` line of constraint keys,
    and the rest (in order) as the description."""
    description = []
    for line in comments:
        if line.startswith("Default: "):
            value = line[9:]
            try:
                schema["default"] = json.loads(value)
            except ValueError:
                schema["default"] = _LITERALS.get(value, value)
            continue
        pairs = [p.partition(": ") for p in line.split(", ")]
        if all(k in _CONSTRAINTS and sep for k, sep, _ in pairs):
            for k, _, v in pairs:
                m = _NUMBER.fullmatch(v)
                schema[k] = _number(m) if m else v
            continue
        description.append(line)
    if description:
        schema["description"] = "\n".join(description)
    return schema


# -- small helpers ----------------------------------------------------------------------------
def _event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _bool(obj: dict[str, Any], key: str, default: bool, prefix: str = "") -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if type(value) is not bool:
        raise BadRequest(f"{prefix}{key}: expected a boolean")
    return value


def _opt_int(value: Any, field: str, least: int) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < least:
        raise BadRequest(f"{field}: expected an integer >= {least}")
    return value


def _check_numbers(obj: dict[str, Any], prefix: str = "") -> None:
    for key in _NUMERIC:
        value = obj.get(key)
        if value is not None and type(value) is not int and type(value) is not float:
            raise BadRequest(f"{prefix}{key}: expected a number")


__all__ = ["PromptInfo", "TokenEndpoints", "TokenRequest", "parse_declaration"]

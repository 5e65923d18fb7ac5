"""The simulated target model: a request in, the token ids it "sampled" out.

The sampler decides an AssistantMessage-shaped answer (reasoning when thinking is on, content,
sometimes tool calls with arguments valid for the declared schema) and turns it into ids with
the configured renderer. Text comes from a precomputed `TextBank`, so the ids are the canonical
encoding without encoding the text again. In `raw` text mode a share of completions is then
re-segmented (a few tokens split into smaller tokens of the same bytes), so those sequences do
not re-tokenise to themselves, as arbitrary sampled ids may not.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..conversation import AssistantMessage, ToolCall
from ..render.base import Renderer
from ..render.kimi import KimiRenderer
from .config import SimConfig
from .plant import planted
from .schema import ArgumentGenerator, violate
from .text import TextBank

if TYPE_CHECKING:
    from .chat_request import ChatRequest

# Private-use sentinels marking where reasoning and content go in a completion template.
_R = "\ue000R\ue001"
_C = "\ue000C\ue001"
_SPLIT = re.compile(f"({re.escape(_R)}|{re.escape(_C)})")

EFFORT_FACTOR = {"none": 0.0, "minimal": 0.25, "low": 0.5, "medium": 1.0, "high": 1.6,
                 "xhigh": 2.0}


@dataclass(slots=True)
class GenRequest:
    """What the model sees of a request (already validated)."""

    messages: list[dict[str, Any]]  # needed only when ids are encoded from text (not `fast`)
    tools: list[dict[str, Any]] | None
    thinking: bool
    prior_tool_calls: int = 0  # tool calls earlier in the conversation
    history_tool: str | None = None  # the last tool called earlier in the conversation
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    effort: str | None = None
    reasoning_max_tokens: int | None = None
    force_raw_tool_call: bool = False  # quirk tool_calls_in_content (request has no tools)
    after_tool_result: bool = False  # the last message is a tool result
    # The answering provider's model (docs/sim.md, "Provider quality"): its P(tool calls) when
    # tools are offered (None: [tool_calls]) and the share of calls that break their schema.
    call_rate: float | None = None
    schema_violation_rate: float = 0.0
    planted: tuple[str, str] | None = None  # a `[[sim:...]]` directive (sim.plant)


@dataclass(slots=True)
class Generated:
    """The sampled completion: canonical ids, possibly re-segmented in raw mode."""

    ids: list[int]
    thinking: bool
    renderer: Renderer
    resegmented: int = 0  # tokens split by raw mode (0 = canonical)
    tool_calls: int = 0  # tool calls the model wrote
    marks: list[int] | None = None  # positions of the special tokens in ids, when known
    known: dict[int, tuple[int, str]] | None = None  # start -> (end, text) of text runs
    # (reasoning text or None, content text, reasoning ids) when the ids are just the
    # template's markers around one reasoning run and one content run (no tool calls, not
    # re-segmented): what a plain serve of them gives, known without parsing them.
    plain: tuple[str | None, str, int] | None = None


class Model:
    """Samples completions for requests with one renderer (thinking on and off)."""

    def __init__(self, cfg: SimConfig, tokenizer, renderers: dict[bool, Renderer], *, seed: int):
        self.cfg = cfg
        self.tok = tokenizer
        self.renderers = renderers
        self.bank = TextBank(tokenizer.encode, seed=seed)
        self.args = ArgumentGenerator(self.bank.words, optional_rate=cfg.tool_calls.optional_rate)
        self._template_cache: dict[tuple[bool, bool], list[tuple[int, list[int]]]] = {}
        # Per thinking mode: the call-less template holds nothing but markers outside the runs.
        self._plain_template: dict[bool, bool] = {}
        self._by_bytes: dict[bytes, int] | None = None
        self._special_ids = frozenset(tokenizer.id_to_special)
        self.fast = self.bank.exact and all(self._check_template(t) for t in (True, False))
        # Whether each renderer's completions open with reasoning (K2-Instruct never thinks).
        self._thinks = {t: bool(r.thinking and getattr(r, "has_thinking", True))
                        for t, r in renderers.items()}

    # -- sampling -------------------------------------------------------------------------
    def sample_length(self, rng: random.Random) -> int:
        ln = self.cfg.length
        if ln.distribution == "fixed":
            n = ln.tokens
        elif ln.distribution == "uniform":
            n = rng.randint(ln.min, ln.max)
        else:
            n = int(ln.tokens * math.exp(rng.gauss(0.0, ln.sigma)))
        return max(ln.min, min(ln.max, n))

    def generate(self, req: GenRequest | ChatRequest, rng: random.Random) -> Generated:
        renderer = self.renderers[req.thinking]
        thinking = self._thinks[req.thinking]
        total = self.sample_length(rng)
        plant = req.planted if req.planted is not None else planted(req.messages)
        if plant is not None and plant[0] == "long" and plant[1].strip().isdigit():
            total = max(1, int(plant[1]))
        elif plant is not None:
            return self._planted(req, renderer, thinking, rng, *plant)
        calls = self._tool_calls(req, rng) if req.tools or req.force_raw_tool_call else []
        reasoning_n = 0
        if thinking:
            share = self.cfg.length.reasoning_share * EFFORT_FACTOR.get(req.effort or "medium", 1.0)
            reasoning_n = max(1, int(total * min(share, 0.95)))
            if req.reasoning_max_tokens is not None:
                reasoning_n = max(1, min(reasoning_n, req.reasoning_max_tokens))
        if calls:
            content_n = 12 if rng.random() < self.cfg.tool_calls.content_rate else 0
            if thinking:
                reasoning_n = max(1, reasoning_n // 2)
        else:
            content_n = max(1, total - reasoning_n)
        r_text, r_ids = self.bank.text(rng, reasoning_n) if thinking else ("", [])
        c_text, c_ids = self.bank.text(rng, content_n)
        marks: list[int] | None = None
        known: dict[int, tuple[int, str]] | None = None
        if self.fast:
            ids, marks, spans = self._assemble(renderer, thinking, r_ids, c_ids, calls)
            known = {}
            if r_ids:
                known[spans[0]] = (spans[0] + len(r_ids), r_text)
            if c_ids:
                known[spans[1]] = (spans[1] + len(c_ids), c_text)
        else:
            msg = AssistantMessage(content=c_text, reasoning=r_text if thinking else None,
                                   tool_calls=tuple(calls))
            ids = renderer.completion_ids(msg, context=req.messages, tools=req.tools)
        out = Generated(ids=ids, thinking=thinking, renderer=renderer, tool_calls=len(calls),
                        marks=marks, known=known)
        if self.cfg.text_mode == "raw" and rng.random() < self.cfg.raw_rate:
            out.resegmented = self.resegment(ids, rng, rng.randint(1, self.cfg.raw_max_splits))
            out.marks = out.known = None  # positions moved
        elif known is not None and not calls and self._plain_template.get(thinking):
            out.plain = (r_text if r_ids else None, c_text, len(r_ids))
        return out

    def _planted(self, req, renderer, thinking: bool, rng: random.Random, kind: str,
                 arg: str) -> Generated:
        """A planted answer: no reasoning, no tool call, the content the directive says."""
        if kind == "repeat":
            sentence, ids = self.bank.text(rng, 6)
            want = int(arg) if arg.strip().isdigit() else 200
            text = " ".join([sentence.strip()] * max(2, -(-want // max(1, len(ids)))))
        else:
            text = arg
        msg = AssistantMessage(content=text, reasoning="" if thinking else None)
        ids = renderer.completion_ids(msg, context=req.messages, tools=req.tools)
        return Generated(ids=ids, thinking=thinking, renderer=renderer, tool_calls=0)

    def _tool_calls(self, req: GenRequest, rng: random.Random) -> list[ToolCall]:
        k = req.prior_tool_calls
        compact = rng.random() < self.cfg.tool_calls.compact_arguments_rate
        seps = (",", ":") if compact else (", ", ": ")
        if not req.tools:
            if not req.force_raw_tool_call:
                return []
            name = req.history_tool or "search"
            args = {"query": self.bank.words(rng, 3)}
            return [ToolCall(id=f"functions.{name}:{k}", name=name,
                             arguments=json.dumps(args, ensure_ascii=False, separators=seps))]
        functions = [t.get("function") for t in req.tools
                     if isinstance(t, dict) and isinstance(t.get("function"), dict)
                     and isinstance(t["function"].get("name"), str)]
        choice = req.tool_choice
        if not functions or choice == "none":
            return []
        forced = None
        if isinstance(choice, dict):
            want = (choice.get("function") or {}).get("name")
            forced = next((f for f in functions if f["name"] == want), None)
        if forced is None and choice != "required" and rng.random() >= self._call_rate(req):
            return []
        most = 1 if (forced is not None or not req.parallel_tool_calls) else self.cfg.tool_calls.max_parallel
        calls = []
        broken = req.schema_violation_rate
        for j in range(self._call_count(most, rng)):
            fn = forced or rng.choice(functions)
            args = self.args.arguments(fn.get("parameters"), rng)
            if broken and rng.random() < broken:
                wrong = violate(fn.get("parameters"), args, rng)
                if wrong is not None:
                    args = wrong[0]
            calls.append(ToolCall(id=f"functions.{fn['name']}:{k + j}", name=fn["name"],
                                  arguments=json.dumps(args, ensure_ascii=False, separators=seps)))
        return calls

    def _call_rate(self, req: GenRequest | ChatRequest) -> float:
        """P(tool calls) for this request: `rate_after_result` right after tool results."""
        if req.call_rate is not None:  # the answering provider's own trigger rate
            return req.call_rate
        tc = self.cfg.tool_calls
        if req.after_tool_result and tc.rate_after_result is not None:
            return tc.rate_after_result
        return tc.rate

    def _call_count(self, most: int, rng: random.Random) -> int:
        """How many calls an answer makes: 1..most uniformly, or `parallel_rate` for >1."""
        share = self.cfg.tool_calls.parallel_rate
        if share is None:
            return rng.randint(1, most)
        return 1 if most == 1 or rng.random() >= share else rng.randint(2, most)

    # -- ids ------------------------------------------------------------------------------
    def _template(self, renderer: Renderer, thinking: bool, calls: Sequence[ToolCall]
                  ) -> list[tuple[int, list[int], list[int]]] | None:
        """The completion template split at the sentinels: (0, ids, special positions in
        them) for template text, (1, [], []) for the reasoning, (2, [], []) for the content."""
        key = (thinking, bool(calls))
        if not calls and key in self._template_cache:
            return self._template_cache[key]
        msg = AssistantMessage(content=_C, reasoning=_R if thinking else None,
                               tool_calls=tuple(calls))
        text = renderer.completion_text(msg)
        parts = _SPLIT.split(text)
        if parts.count(_C) != 1 or parts.count(_R) != (1 if thinking else 0):
            return None
        special = self._special_ids
        out = []
        for p in parts:
            if p == _R or p == _C:
                out.append((1 if p == _R else 2, [], []))
            elif p:
                ids = self.tok.encode(p)
                out.append((0, ids, [i for i, t in enumerate(ids) if t in special]))
        if not calls:
            self._template_cache[key] = out
            self._plain_template[thinking] = all(len(rel) == len(ids) for _, ids, rel in out)
        return out

    def _assemble(self, renderer, thinking, r_ids, c_ids, calls
                  ) -> tuple[list[int], list[int] | None, list[int]]:
        """(ids, positions of their special tokens, [reasoning start, content start]);
        bank text holds no special tokens."""
        parts = self._template(renderer, thinking, calls)
        if parts is None:  # the template moved the sentinels: fall back to a full encode
            msg = AssistantMessage(content=self.tok.decode(c_ids),
                                   reasoning=self.tok.decode(r_ids) if thinking else None,
                                   tool_calls=tuple(calls))
            return self.tok.encode(renderer.completion_text(msg)), None, [-1, -1]
        ids: list[int] = []
        marks: list[int] = []
        starts = [-1, -1]
        for kind, piece, rel in parts:
            if kind == 0:
                if rel:
                    n = len(ids)
                    marks += [n + r for r in rel]
                ids += piece
            else:
                starts[kind - 1] = len(ids)
                ids += r_ids if kind == 1 else c_ids
        return ids, marks, starts

    def _check_template(self, thinking: bool) -> bool:
        """Assembled ids equal the renderer's own completion_ids (with and without calls)."""
        renderer = self.renderers[thinking]
        if not isinstance(renderer, KimiRenderer):
            return False  # other templates may render an answer differently after history
        reference_encode = getattr(self.tok, "wrapped", self.tok).encode
        on = bool(renderer.thinking and getattr(renderer, "has_thinking", True))
        rng = random.Random(7)
        for calls in ((), (ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}'),)):
            for n_r, n_c in ((40, 30), (1, 0), (0, 5)):
                r_text, r_ids = self.bank.text(rng, n_r) if on else ("", [])
                c_text, c_ids = self.bank.text(rng, n_c)
                msg = AssistantMessage(content=c_text, reasoning=r_text if on else None,
                                       tool_calls=calls)
                want = reference_encode(renderer.completion_text(msg))
                ids, marks, _ = self._assemble(renderer, on, r_ids, c_ids, list(calls))
                if ids != want or marks != [i for i, t in enumerate(ids)
                                            if t in self._special_ids]:
                    return False
        return True

    def resegment(self, ids: list[int], rng: random.Random, n: int) -> int:
        """Split up to `n` multi-byte tokens in place into smaller tokens of the same bytes.
        Returns how many were split (the sequence then no longer re-tokenises to itself)."""
        table = self._bytes_table()
        tb = self.tok.token_bytes
        candidates = [i for i, t in enumerate(ids) if t not in self._special_ids]
        rng.shuffle(candidates)
        chosen: list[tuple[int, list[int]]] = []
        for i in candidates:
            b = tb(ids[i])
            if len(b) < 2:
                continue
            cuts = [k for k in range(1, len(b)) if b[:k] in table and b[k:] in table]
            if cuts:
                k = rng.choice(cuts)
                chosen.append((i, [table[b[:k]], table[b[k:]]]))
            elif all(bytes([x]) in table for x in b):
                chosen.append((i, [table[bytes([x])] for x in b]))
            if len(chosen) >= n:
                break
        for i, parts in sorted(chosen, reverse=True):
            ids[i:i + 1] = parts
        return len(chosen)

    def _bytes_table(self) -> dict[bytes, int]:
        if self._by_bytes is None:
            tb = self.tok.token_bytes
            table: dict[bytes, int] = {}
            for i in range(self.tok.vocab_size):
                if i in self._special_ids:
                    continue
                try:
                    b = tb(i)
                except (KeyError, ValueError):
                    continue
                table.setdefault(b, i)
            self._by_bytes = table
        return self._by_bytes



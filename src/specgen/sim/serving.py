"""Sampled ids -> API fields, the way a serving stack with Kimi parsers does, plus quirks.

`Server.serve` cuts the ids at `max_tokens` and at `stop` strings, splits them into spans
(reasoning, `</think>`, content, the tool-call section, the stop token) with the same state
machine as `KimiRenderer.parse_completion`, and maps every span to an output piece: text of
one field, the head of a tool call, its arguments, or hidden. Quirks change that mapping (text
moves to another field, markers stay as text, ids and arguments are rewritten) but never the
ids: every sampled id belongs to exactly one piece, so a stream can attach the true ids to
the chunk that carries their text. `fold` gives the non-stream message; `stream_deltas` the
chunk deltas.

Truncated tool calls (no `<|tool_call_end|>`) are dropped, as a serving stack's tool parser
drops them; the rest of the answer is kept.
"""

from __future__ import annotations

import codecs
import json
import random
import string
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..render.kimi import (
    CALL_ARG,
    CALL_BEGIN,
    CALL_END,
    END_THINK,
    IM_END,
    SECTION_BEGIN,
    SECTION_END,
    THINK,
    tool_name_from_id,
)

_MARKERS = {THINK: "think", END_THINK: "end_think", SECTION_BEGIN: "section_begin",
            SECTION_END: "section_end", CALL_BEGIN: "call_begin", CALL_ARG: "arg_begin",
            CALL_END: "call_end"}
_TEXT_KIND = {"reasoning": "reasoning", "content": "content", "call_id": "call_id",
              "args": "args", "section": "stray", "after": "stray", "done": "stray"}
_SECTION_KINDS = frozenset({"section_begin", "call_begin", "call_id", "arg_begin", "args",
                            "call_end", "section_end", "section_stray"})
_ALNUM = string.ascii_letters + string.digits


@dataclass(slots=True)
class Piece:
    """One output piece covering ids[start:end]."""

    kind: str  # "text" | "call" | "args" | "hidden"
    start: int
    end: int
    field: str = ""  # "reasoning" | "content" for text pieces
    text: str | None = None  # explicit text; None = decode the ids
    prefix: str = ""  # prepended to the text (spaces_around_special)
    marker: bool = False  # the text is a special marker written out
    index: int = -1  # tool-call index within the answer
    call_id: str = ""
    name: str = ""
    whole: bool = False  # stream in one fragment (rewritten text)


@dataclass(slots=True)
class Served:
    pieces: list[Piece]
    ids: list[int]  # the completion ids after truncation (what the model sampled)
    finish_reason: str
    native_finish_reason: str
    reasoning_tokens: int
    quirks: list[str] = field(default_factory=list)
    known: dict[int, tuple[int, str]] | None = None  # start -> (end, text) known to the caller
    folded: tuple[str | None, str] | None = None  # (reasoning, content) known without pieces


class Server:
    """The serving stack of one sim: parsers over the tokenizer's Kimi markers."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.decode = tokenizer.decode
        self.token_bytes = tokenizer.token_bytes
        self.marker_of: dict[int, str] = {}
        self.marker_text: dict[int, str] = dict(tokenizer.id_to_special)
        for tid, name in tokenizer.id_to_special.items():
            self.marker_of[tid] = _MARKERS.get(name, "special")
        self.stop_ids: frozenset[int] = frozenset()
        self.im_end_text = IM_END

    # -- spans ----------------------------------------------------------------------------
    def spans(self, ids: Sequence[int], start_in_reasoning: bool, stop_ids: frozenset[int],
              marks: Sequence[int] | None = None) -> list[tuple[str, int, int]]:
        """(kind, start, end) spans; kinds: reasoning, content, think, end_think,
        section_begin, call_begin, call_id, arg_begin, args, call_end, section_end, stop,
        special:<field>, stray, section_stray. `marks` (positions of the special tokens, when
        the caller knows them) saves the scan."""
        marker_of = self.marker_of
        if marks is None:
            marks = [i for i, t in enumerate(ids) if t in marker_of]
        out: list[tuple[str, int, int]] = []
        state = "reasoning" if start_in_reasoning else "content"
        seen = start_in_reasoning
        run = 0
        for i in marks:
            t = ids[i]
            m = marker_of[t]
            if run < i:
                kind = _TEXT_KIND[state]
                out.append(("section_stray" if kind == "stray" and state == "section" else kind,
                            run, i))
                seen = True
            run = i + 1
            if t in stop_ids and state in ("reasoning", "content", "after"):
                out.append(("stop", i, i + 1))
                state = "done"
            elif m == "think" and state == "content" and not seen:
                out.append(("think", i, i + 1))
                state, seen = "reasoning", True
            elif m == "end_think" and state == "reasoning":
                out.append(("end_think", i, i + 1))
                state = "content"
            elif m == "section_begin" and state == "content":
                out.append(("section_begin", i, i + 1))
                state = "section"
            elif m == "call_begin" and state == "section":
                out.append(("call_begin", i, i + 1))
                state = "call_id"
            elif m == "arg_begin" and state == "call_id":
                out.append(("arg_begin", i, i + 1))
                state = "args"
            elif m == "call_end" and state == "args":
                out.append(("call_end", i, i + 1))
                state = "section"
            elif m == "section_end" and state == "section":
                out.append(("section_end", i, i + 1))
                state = "after"
            elif state in ("reasoning", "content"):
                out.append(("special:" + state, i, i + 1))
            elif state == "args":
                out.append(("args", i, i + 1))  # arguments are free text up to the call end
            else:
                out.append(("section_stray" if state == "section" else "stray", i, i + 1))
        if run < len(ids):
            kind = _TEXT_KIND[state]
            out.append(("section_stray" if kind == "stray" and state == "section" else kind,
                        run, len(ids)))
        return out

    # -- serve ----------------------------------------------------------------------------
    def serve(self, ids: list[int], *, start_in_reasoning: bool, stop_ids: frozenset[int],
              max_tokens: int, stop: Sequence[str] = (), has_tools: bool,
              marks: Sequence[int] | None = None,
              known: dict[int, tuple[int, str]] | None = None,
              quirks: frozenset[str] = frozenset(), exclude_reasoning: bool = False,
              rng: random.Random | None = None) -> Served:
        truncated = len(ids) > max_tokens
        if truncated:
            ids = ids[:max_tokens]
            if marks is not None:
                marks = marks[:bisect_left(marks, max_tokens)]
        spans = self.spans(ids, start_in_reasoning, stop_ids, marks)
        reasoning_tokens = sum(e - s for k, s, e in spans if k == "reasoning")
        cut_text: dict[int, str] = {}
        stopped = False
        if stop:
            spans, cut_text, stopped = self._apply_stop(ids, spans, stop)
            if stopped:
                ids = ids[:spans[-1][2]] if spans else []
                reasoning_tokens = sum(e - s for k, s, e in spans if k == "reasoning")
        applied: list[str] = []
        pieces = self._pieces(ids, spans, cut_text, has_tools, quirks, exclude_reasoning,
                              rng, applied)
        if stopped:
            finish = "stop"
        elif truncated:
            finish = "length"
        elif any(p.kind == "call" for p in pieces):
            finish = "tool_calls"
        else:
            finish = "stop"
        return Served(pieces=pieces, ids=ids, finish_reason=finish, native_finish_reason=finish,
                      reasoning_tokens=reasoning_tokens, quirks=applied, known=known)

    def _apply_stop(self, ids, spans, stop):
        """Cut at the first stop string inside a reasoning or content run. The token that
        completes the stop string is kept in the ids; the text ends before the string."""
        for n, (kind, s, e) in enumerate(spans):
            if kind not in ("reasoning", "content"):
                continue
            text = self.decode(ids[s:e])
            hits = [(text.find(st), st) for st in stop if st and st in text]
            if not hits:
                continue
            pos, st = min(hits)
            need = len(text[:pos + len(st)].encode("utf-8"))
            acc, j = 0, s
            while j < e:
                acc += len(self.token_bytes(ids[j]))
                j += 1
                if acc >= need:
                    break
            return spans[:n] + [(kind, s, j)], {n: text[:pos]}, True
        return spans, {}, False

    def _pieces(self, ids, spans, cut_text, has_tools, quirks, exclude_reasoning, rng, applied
                ) -> list[Piece]:
        marker_text = self.marker_text
        think_in_content = "think_in_content" in quirks
        drop_end_think = "drop_end_think" in quirks and not think_in_content
        has_end_think = drop_end_think and any(k == "end_think" for k, _, _ in spans)
        as_text = not has_tools or "tool_calls_as_text" in quirks
        pieces: list[Piece] = []
        call_index = 0
        n = len(spans)
        j = 0
        effective: set[str] = set()
        while j < n:
            kind, s, e = spans[j]
            if kind == "reasoning":
                if think_in_content:
                    effective.add("think_in_content")
                fld = "content" if think_in_content else "reasoning"
                pieces.append(Piece("text", s, e, fld, cut_text.get(j)))
            elif kind == "content":
                if drop_end_think and has_end_think:
                    effective.add("drop_end_think")
                    pieces.append(Piece("text", s, e, "reasoning", cut_text.get(j)))
                else:
                    pieces.append(Piece("text", s, e, "content", cut_text.get(j)))
            elif kind in ("think", "end_think"):
                if think_in_content:
                    effective.add("think_in_content")
                    pieces.append(Piece("text", s, e, "content", marker_text[ids[s]], marker=True))
                else:
                    pieces.append(Piece("hidden", s, e))
            elif kind.startswith("special:"):
                fld = kind[8:]
                if fld == "reasoning" and think_in_content:
                    fld = "content"
                pieces.append(Piece("text", s, e, fld, marker_text[ids[s]], marker=True))
            elif kind == "stop":
                if "im_end_in_content" in quirks:
                    effective.add("im_end_in_content")
                    pieces.append(Piece("text", s, e, "content", marker_text[ids[s]], marker=True))
                else:
                    pieces.append(Piece("hidden", s, e))
            elif kind in _SECTION_KINDS:
                if as_text:
                    if has_tools:
                        effective.add("tool_calls_as_text")
                    elif kind == "section_begin" and "tool_calls_in_content" in quirks:
                        effective.add("tool_calls_in_content")
                    if kind in ("call_id", "args", "section_stray"):
                        pieces.append(Piece("text", s, e, "content"))
                    else:
                        pieces.append(Piece("text", s, e, "content", marker_text[ids[s]],
                                            marker=True))
                elif kind == "call_begin":
                    j = self._call(ids, spans, j, call_index, pieces)
                    call_index += 1
                    continue
                else:
                    pieces.append(Piece("hidden", s, e))
            else:
                pieces.append(Piece("hidden", s, e))
            j += 1
        calls = [p for p in pieces if p.kind == "call"]
        if calls:
            self._rewrite_calls(ids, pieces, calls, quirks, rng, effective)
        if "empty_content" in quirks:
            for p in pieces:
                if p.kind in ("call", "args") or (p.kind == "text" and p.field == "content"):
                    effective.add("empty_content")
                    p.kind = "hidden"
        if exclude_reasoning:
            for p in pieces:
                if p.kind == "text" and p.field == "reasoning":
                    p.kind = "hidden"
        if "spaces_around_special" in quirks and self._space_markers(pieces):
            effective.add("spaces_around_special")
        if "pad_whitespace" in quirks and "empty_content" not in effective and self._pad(
                pieces, any(k == "reasoning" and e > s for k, s, e in spans)):
            effective.add("pad_whitespace")
        if "relay_extra_token" in quirks and self._relay_word(pieces):
            effective.add("relay_extra_token")
        applied.extend(q for q in sorted(quirks) if q in effective)
        return pieces

    @staticmethod
    def _relay_word(pieces: list[Piece]) -> bool:
        """`relay_extra_token`: a relay adds " Indeed" (one token) after the content's last
        piece, as a piece of its own that covers no ids (the usage stays the model's)."""
        content = [n for n, p in enumerate(pieces) if p.kind == "text" and p.field == "content"]
        if not content:
            return False
        at = content[-1]
        pos = pieces[at].end
        pieces.insert(at + 1, Piece("text", pos, pos, "content", " Indeed"))
        return True

    @staticmethod
    def form(served: Served) -> str:
        """The answer form (quality.forms) of what the model sampled: reasoning, tool calls,
        both or neither."""
        reasoning = served.reasoning_tokens > 0
        calls = any(p.kind in ("call", "args") for p in served.pieces)
        return ("reasoning+tools" if calls else "reasoning") if reasoning else (
            "tools" if calls else "plain")

    def _call(self, ids, spans, j, index, pieces) -> int:
        """One tool call starting at spans[j] (call_begin). Returns the next span index."""
        n = len(spans)
        k = j + 1
        id_end = spans[j][2]
        while k < n and spans[k][0] == "call_id":
            id_end = spans[k][2]
            k += 1
        if k < n and spans[k][0] == "arg_begin":
            head_end = spans[k][2]
            k += 1
            a_start = head_end
            while k < n and spans[k][0] == "args":
                k += 1
            if k < n and spans[k][0] == "call_end":
                a_end = spans[k][1]
                call_id = self.decode(ids[spans[j][2]:id_end]) if id_end > spans[j][2] else ""
                pieces.append(Piece("call", spans[j][1], head_end, index=index, call_id=call_id,
                                    name=tool_name_from_id(call_id)))
                if a_end > a_start:
                    pieces.append(Piece("args", a_start, a_end, index=index))
                pieces.append(Piece("hidden", spans[k][1], spans[k][2]))
                return k + 1
        # Incomplete call (truncated): the tool parser drops it.
        end = spans[k - 1][2] if k > j else spans[j][2]
        while k < n and spans[k][0] in _SECTION_KINDS:
            end = spans[k][2]
            k += 1
        pieces.append(Piece("hidden", spans[j][1], end))
        return k

    def _rewrite_calls(self, ids, pieces, calls, quirks, rng, effective) -> None:
        for p in calls:
            if "openai_tool_call_ids" in quirks:
                rng = rng or random.Random(p.index)
                p.call_id = "call_" + "".join(rng.choices(_ALNUM, k=24))
                effective.add("openai_tool_call_ids")
            elif "renumber_tool_call_ids" in quirks:
                new = f"functions.{p.name}:{p.index}"
                if new != p.call_id:
                    p.call_id = new
                    effective.add("renumber_tool_call_ids")
        if "reserialize_arguments" not in quirks:
            return
        for p in pieces:
            if p.kind != "args":
                continue
            raw = p.text if p.text is not None else self.decode(ids[p.start:p.end])
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            spaced = json.dumps(obj, ensure_ascii=False)
            new = spaced if spaced != raw else json.dumps(obj, ensure_ascii=False,
                                                          separators=(",", ":"))
            if new != raw:
                p.text, p.whole = new, True
                effective.add("reserialize_arguments")

    def _space_markers(self, pieces) -> bool:
        """Spaces around markers written as text, per field, as `spaces_between_special_tokens`
        decoding joins them: ' <think> ok </think> 1'."""
        changed = False
        after_marker: dict[str, bool] = {}
        for p in pieces:
            if p.kind != "text":
                continue
            if p.marker:
                p.prefix = " "
                after_marker[p.field] = True
                changed = True
            elif after_marker.get(p.field):
                p.prefix = " "
                after_marker[p.field] = False
        return changed

    @staticmethod
    def _pad(pieces: list[Piece], has_reasoning: bool) -> bool:
        """`pad_whitespace`: "\n\n" leads the content when the answer has reasoning, "\n"
        trails it when the answer has tool calls, as pieces of their own that cover no ids (a
        stream sends each as a content delta: the first / the last one)."""
        calls = [n for n, p in enumerate(pieces) if p.kind == "call"]
        if not has_reasoning and not calls:
            return False
        content = [n for n, p in enumerate(pieces) if p.kind == "text" and p.field == "content"]
        first = content[0] if content else (calls[0] if calls else len(pieces))
        if calls:
            at = content[-1] + 1 if content else calls[0]
            pos = pieces[at].start if at < len(pieces) else pieces[-1].end if pieces else 0
            pieces.insert(at, Piece("text", pos, pos, "content", "\n"))
        if has_reasoning:
            pos = pieces[first].start if first < len(pieces) else pieces[-1].end if pieces else 0
            pieces.insert(first, Piece("text", pos, pos, "content", "\n\n"))
        return True

    @staticmethod
    def serve_plain(ids: list[int], plain: tuple[str | None, str, int], *,
                    exclude_reasoning: bool = False) -> Served:
        """`serve` for a plain completion (`Generated.plain`) that is neither cut (max_tokens,
        stop) nor changed by a quirk: the message is the two runs' texts, nothing to parse.
        It has no pieces, so it cannot be streamed (`stream_deltas` needs `serve`)."""
        reasoning, content, n_reasoning = plain
        return Served(pieces=[], ids=ids, finish_reason="stop", native_finish_reason="stop",
                      reasoning_tokens=n_reasoning,
                      folded=(None if exclude_reasoning else reasoning, content))

    # -- output ---------------------------------------------------------------------------
    def fold(self, served: Served) -> tuple[str | None, str, list[dict[str, Any]]]:
        """(reasoning, content, tool_calls) of the non-stream message."""
        if served.folded is not None:
            return served.folded[0], served.folded[1], []
        ids = served.ids
        known = served.known or {}
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[dict[str, Any]] = []
        has_reasoning = False
        for p in served.pieces:
            k = p.kind
            if k == "text":
                text = p.text
                if text is None:
                    hit = known.get(p.start)
                    text = hit[1] if hit is not None and hit[0] == p.end else self.decode(
                        ids[p.start:p.end])
                if p.field == "reasoning":
                    has_reasoning = True
                    reasoning.append(p.prefix + text)
                else:
                    content.append(p.prefix + text)
            elif k == "call":
                calls.append({"index": p.index, "id": p.call_id, "type": "function",
                              "function": {"name": p.name, "arguments": ""}})
            elif k == "args":
                text = p.text if p.text is not None else self.decode(ids[p.start:p.end])
                calls[-1]["function"]["arguments"] += text
        return ("".join(reasoning) if has_reasoning else None), "".join(content), calls

    def stream_deltas(self, served: Served, chunk_tokens: int, reasoning_field: str
                      ) -> Iterator[tuple[dict[str, Any] | None, list[int]]]:
        """(delta, token_ids) per chunk, in order; ids of hidden pieces ride on the next chunk.
        The last item is (None, ids still pending): they go on the finish chunk."""
        ids = served.ids
        pending: list[int] = []
        tb = self.token_bytes
        for p in served.pieces:
            span = ids[p.start:p.end]
            if p.kind == "hidden":
                pending += span
                continue
            if p.kind == "call":
                yield {"tool_calls": [{"index": p.index, "id": p.call_id, "type": "function",
                                       "function": {"name": p.name, "arguments": ""}}]}, pending + span
                pending = []
                continue
            if p.text is not None or p.whole:
                text = p.prefix + (p.text if p.text is not None else self.decode(span))
                yield self._delta(p, text, reasoning_field), pending + span
                pending = []
                continue
            dec = codecs.getincrementaldecoder("utf-8")("replace")
            prefix = p.prefix
            for g in range(0, len(span), chunk_tokens):
                group = span[g:g + chunk_tokens]
                text = dec.decode(b"".join(tb(t) for t in group), final=g + chunk_tokens >= len(span))
                if not text and not prefix:
                    pending += group  # bytes of a character still incomplete
                    continue
                yield self._delta(p, prefix + text, reasoning_field), pending + group
                prefix = ""
                pending = []
        yield None, pending

    @staticmethod
    def _delta(p: Piece, text: str, reasoning_field: str) -> dict[str, Any]:
        if p.kind == "args":
            return {"tool_calls": [{"index": p.index, "function": {"arguments": text}}]}
        if p.field == "reasoning":
            if reasoning_field == "reasoning":
                return {"reasoning": text, "reasoning_details": [
                    {"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]}
            return {"reasoning_content": text}
        return {"content": text}

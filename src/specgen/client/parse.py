"""Response bodies → `ChatResponse`: the non-stream JSON body and the SSE stream.

Both parsers are defensive: anything that is not the documented shape raises
`ApiError("invalid_response")` with a short message naming the field, and an error reported
inside a 200 becomes `error_in_body` (non-stream) or `stream_error` (stream), keeping any usage
the server reported so a failed-but-billed attempt is still counted.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable, Iterator
from operator import eq
from typing import Any

import orjson

from . import frames as _frames
from .errors import describe_error, snippet
from .types import ApiError, ChatResponse, RawToolCall
from .usage import clean_usage

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError

MAX_LINE = 16 * 1024 * 1024  # an SSE line longer than this is not a chat chunk
# what one sampled token id counts for against `max_answer_bytes` (a token-in answer holds
# ids, no text; ~4 bytes of text a token, so 4 MiB is still about a million tokens)
BYTES_PER_ID = 4
RUN_EVENTS = 4  # a block shorter than this many of the newest frame's events: the event loop


def _invalid(message: str) -> ApiError:
    return ApiError("invalid_response", message)


def _ids(value: Any, where: str) -> array:
    if not isinstance(value, list):
        raise _invalid(f"{where} must be a list of token ids, got {type(value).__name__}")
    out = array("I")
    try:
        out.extend(value)
    except (TypeError, OverflowError):
        raise _invalid(f"{where} must hold non-negative integer token ids") from None
    return out


def _text(value: Any, where: str) -> str | None:
    """A text field: a string, null, or (some servers) a list of `{"text": ...}` parts."""
    if value is None or value.__class__ is str:
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise _invalid(f"{where} has a part that is not text")
        return "".join(parts)
    raise _invalid(f"{where} must be a string, got {type(value).__name__}")


def _arguments(value: Any, where: str) -> str:
    if value is None:
        return ""
    if value.__class__ is str:
        return value
    if isinstance(value, dict | list):  # some servers send parsed arguments
        return orjson.dumps(value).decode()
    raise _invalid(f"{where} must be a string, got {type(value).__name__}")


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _model(value: Any) -> str | None:
    """The answer's `model` (or revealed `quantization`): a string as sent; any other value
    but null as its JSON text (`123` -> "123"), so the check sees it and refuses it instead
    of skipping it."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value, default=str).decode()


def _dict(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid(f"{where} must be an object, got {type(value).__name__}")
    return value


def _failure(kind: str, err: Any, usage: Any, provider: str | None) -> ApiError:
    message, err_provider = describe_error(err) if err not in (None, True) else (
        "finish_reason is 'error'", None)
    return ApiError(
        kind,  # type: ignore[arg-type]
        message,
        provider=err_provider or provider,
        body=err if isinstance(err, dict | str) else None,
        usage=clean_usage(usage)[0] or None,
        code=err.get("code") if isinstance(err, dict) else None,
    )


def parse_completion(data: bytes) -> ChatResponse:
    """A non-stream `/chat/completions` body."""
    if not data or not data.strip():
        raise _invalid("empty response body")
    try:
        obj = _loads(data)
    except _JSONDecodeError:
        raise _invalid(f"response body is not valid JSON: {snippet(data, 120)}") from None
    if not isinstance(obj, dict):
        raise _invalid(f"response body must be a JSON object, got {type(obj).__name__}")
    provider = _opt_str(obj.get("provider"))
    usage, usage_warnings = clean_usage(obj.get("usage"))
    if obj.get("error"):
        raise _failure("error_in_body", obj["error"], usage, provider)
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _invalid("response has no choices" if not choices else
                       f"choices must be a list, got {type(choices).__name__}")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise _invalid("choices[0] must be an object")
    finish = _opt_str(choice.get("finish_reason"))
    if choice.get("error") or finish == "error":
        raise _failure("error_in_body", choice.get("error") or True, usage, provider)
    msg = _dict(choice.get("message"), "choices[0].message")
    if "message" not in choice:
        raise _invalid("choices[0] has no message")
    reasoning, field = msg.get("reasoning"), "reasoning"
    if not reasoning:
        alt = msg.get("reasoning_content")
        if alt:
            reasoning, field = alt, "reasoning_content"
    reasoning = _text(reasoning, f"choices[0].message.{field}")
    calls = msg.get("tool_calls")
    tool_calls: list[RawToolCall] = []
    if calls:
        if not isinstance(calls, list):
            raise _invalid("choices[0].message.tool_calls must be a list")
        for i, call in enumerate(calls):
            where = f"choices[0].message.tool_calls[{i}]"
            call = _dict(call, where)
            fn = _dict(call.get("function"), f"{where}.function")
            name = fn.get("name")
            if not isinstance(name, str):
                raise _invalid(f"{where}.function.name must be a string")
            index = call.get("index")
            tool_calls.append(RawToolCall(
                index=index if isinstance(index, int) else i,
                id=_opt_str(call.get("id")) or "",
                name=name,
                arguments=_arguments(fn.get("arguments"), f"{where}.function.arguments"),
            ))
    prompt_ids = obj.get("prompt_token_ids")
    if prompt_ids is None:
        prompt_ids = choice.get("prompt_token_ids")
    completion_ids = choice.get("token_ids")
    return ChatResponse(
        content=_text(msg.get("content"), "choices[0].message.content"),
        reasoning=reasoning or None,
        reasoning_field=field if reasoning else None,
        tool_calls=tool_calls,
        finish_reason=finish,
        native_finish_reason=_opt_str(choice.get("native_finish_reason")),
        provider=provider,
        quantization=_model(obj.get("quantization")),
        model=_model(obj.get("model")),
        id=_opt_str(obj.get("id")),
        usage=usage,
        prompt_token_ids=None if prompt_ids is None
        else _ids(prompt_ids, "prompt_token_ids").tolist(),
        completion_token_ids=None if completion_ids is None
        else _ids(completion_ids, "choices[0].token_ids").tolist(),
        stream=False,
        usage_warnings=usage_warnings,
    )


class _ToolAcc:
    __slots__ = ("index", "id", "name", "args")

    def __init__(self, index: int):
        self.index = index
        self.id = ""
        self.name = ""
        self.args: list[str] = []


class StreamParser:
    """Incremental SSE parser: `feed()` raw bytes as they arrive, then `finish()`.

    SSE framing: lines end in LF or CRLF; an event ends at a blank line and its `data:` lines
    are joined with "\\n"; `:` comment lines (`: OPENROUTER PROCESSING`) and other fields
    (`event:`, `id:`, `retry:`) are skipped; `data: [DONE]` ends the stream.
    """

    __slots__ = (
        "_buf", "_content", "_reasoning", "reasoning_field", "_tools", "_last_tool",
        "finish_reason", "native_finish_reason", "provider", "model", "id", "usage",
        "_prompt_ids", "_completion_ids", "_seen_choices", "error", "done", "events",
        "_frames", "_learns", "stop_reason", "_prev", "_dups", "quantization", "_top",
        "first_output_at", "usage_warnings", "max_text", "oversize", "_size", "_sized",
    )

    FAST = True  # use frames (see frames.py); tests turn it off to compare with the full path
    MAX_FRAMES = 4
    MAX_LEARNS = 16  # frames learnt per stream at most (a server whose chunks never repeat)

    def __init__(self, max_text: int | None = None) -> None:
        self._buf = b""
        # the most text (content + reasoning + tool-call arguments) the answer may hold: past
        # it the stream ends (`done`) with `oversize` set to the size seen
        self.max_text = max_text
        self.oversize: int | None = None
        self._size = 0  # the text counted so far (pieces counted: `_sized`)
        self._sized = (0, 0)
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self.reasoning_field: str | None = None
        self._tools: dict[int, _ToolAcc] = {}
        self._last_tool: _ToolAcc | None = None
        self.finish_reason: str | None = None
        self.native_finish_reason: str | None = None
        self.provider: str | None = None
        self.quantization: str | None = None  # revealed by the answer, when it says
        self.first_output_at: float | None = None  # wall time the model's output began
        self.model: str | None = None
        self.id: str | None = None
        self.usage: dict[str, Any] | None = None
        self.usage_warnings: list[str] = []  # what clean_usage left out of the last usage
        self._prompt_ids: array | None = None
        self._completion_ids: array | None = None
        self._seen_choices = False
        self.error: Any = None  # a top-level error chunk or choices[0].error; raised at finish
        self.done = False  # saw [DONE]
        self.events = 0  # JSON chunks seen
        self._frames: list[_frames.Frame] = []
        self._top: _frames.Frame | None = None  # the newest frame when it has one text slot
        self._learns = 0
        self.stop_reason: Any = None  # vLLM completions: the matched stop id or string
        self._prev = b""  # the last event's bytes
        # (field, its pieces before) of each event that repeated the one before byte for
        # byte: a relay's retransmission, or a model writing the same text twice
        self._dups: list[tuple[str, int]] | None = None

    def feed(self, block: bytes) -> None:
        """Consume the next bytes of the body (any split: mid-line, mid-CRLF, many events)."""
        if self._buf:
            block = self._buf + block
        if b"\r" in block:
            block = block.replace(b"\r\n", b"\n")
        if self._top is not None and len(block) >= RUN_EVENTS * self._top.event_size:
            block = self._run_of_frames(block, self._top)
            if not block:  # all of it was the newest frame's events
                self._buf = b""
                if self.first_output_at is None:
                    self.first_output_at = time.time()
                if self.max_text is not None:
                    self._check_size()
                return
        top = self._top
        events = block.split(b"\n\n")
        self._buf = events.pop()
        if len(self._buf) > MAX_LINE:
            raise _invalid(f"stream event longer than {MAX_LINE} bytes")
        frames = self._frames
        prev = self._prev
        repeat = None  # (content, reasoning) pieces before an event that repeated the last
        for ev in events:
            if repeat is not None:
                self._note_repeat(repeat)
                repeat = None
            if ev == prev and ev[:1] == b"d":
                repeat = (len(self._content), len(self._reasoning))
            prev = ev
            if top is not None and ev.startswith(top.prefix) and ev.endswith(top.suffix):
                # the newest frame, inlined (Frame.match of a one-slot frame)
                end = len(ev) - top.tail
                if end >= top.at + 2:
                    try:
                        text = _loads(ev[top.at:end])
                    except _JSONDecodeError:
                        pass
                    else:
                        if text:
                            top.into.append(text)  # type: ignore[union-attr]
                        self.events += 1
                        continue
            if frames:
                for frame in frames:
                    hit = frame.match(ev)
                    if hit is None:
                        continue
                    text, ids = hit
                    if ids and not self._add_ids(ids):
                        continue  # bad ids: the full parser reports them
                    if text:
                        frame.into.append(text)  # type: ignore[union-attr]
                    self.events += 1
                    break
                else:
                    hit = None
                if hit is not None:
                    continue
            simple = ev[:6] == b"data: " and b"\n" not in ev  # the common form: one data line
            if simple:
                payload = ev[6:]
            elif not ev:
                continue
            else:
                payload = self._slow_event(ev)
                if payload is None:
                    continue
            if payload == b"[DONE]":
                self.done = True
                break
            if payload:
                self._full(payload, ev if simple else None)
                if self.done:
                    break
                top = self._top
        if repeat is not None:
            self._note_repeat(repeat)
        self._prev = prev
        if self.first_output_at is None and self.has_output:
            self.first_output_at = time.time()
        if self.max_text is not None:
            self._check_size()

    def _check_size(self) -> None:
        """Count the pieces added since the last read (each piece once: linear); past
        `max_text` (text, or BYTES_PER_ID a sampled id when that is more), end the stream as
        cut."""
        content, reasoning = self._content, self._reasoning
        nc, nr = self._sized
        if len(content) > nc:
            self._size += sum(map(len, content[nc:]))
        if len(reasoning) > nr:
            self._size += sum(map(len, reasoning[nr:]))
        self._sized = (len(content), len(reasoning))
        size = max(self._size, BYTES_PER_ID * len(self._completion_ids or ()))
        if size > self.max_text:  # type: ignore[operator]
            self.oversize = size
            self.done = True
            self._buf = b""

    def _note_repeat(self, before: tuple[int, int]) -> None:
        """Note the field a repeated event added its piece to (`before`: the pieces of
        content and reasoning before it); a repeat that added nothing is not noted."""
        if self._dups is None:
            self._dups = []
        for field, pieces, k in (("content", self._content, before[0]),
                                 ("reasoning", self._reasoning, before[1])):
            if len(pieces) > k:
                self._dups.append((field, k))

    def _run_of_frames(self, block: bytes, frame: _frames.Frame) -> bytes:
        """Take the leading events of `block` that are the newest frame at once (the common
        case: a tick's worth of token chunks); what is left for the event loop. Their texts
        are kept as one piece (a stream in flight holds a piece per read, not per token); a
        run with a repeated event is left to the loop, which notes the repeat."""
        run = frame.take_run(block)
        if run is None:
            return block
        texts, slots, end = run
        if len(slots) > 1 and any(map(eq, slots, slots[1:])):
            return block
        lp, ls = frame._lp, frame._ls
        first = block[:lp + len(slots[0]) + ls]
        if first == self._prev:
            return block
        text = "".join(texts)
        if text:
            frame.into.append(text)  # type: ignore[union-attr]
        self.events += len(texts)
        self._prev = block[end - 2 - ls - len(slots[-1]) - lp:end - 2]
        return block[end:]

    def _full(self, payload: bytes, event: bytes | None) -> None:
        """Decode and apply one payload; learn a frame from it when it is a plain token chunk
        (`event`: its whole SSE event when that is the simple one-line form)."""
        try:
            chunk = _loads(payload)
        except _JSONDecodeError:
            self._apply(self._decoded([payload]))  # lenient forms, else the error
            return
        self._apply((chunk,))
        if (event is not None and self.FAST and self._learns < self.MAX_LEARNS
                and self._seen_choices):
            frame = _frames.learn(event, chunk)
            if frame is not None:
                frame.into = self._content if frame.field == "content" else self._reasoning
                self._learns += 1
                self._frames.insert(0, frame)
                del self._frames[self.MAX_FRAMES:]
                # the newest frame when it has one text slot: matched inline by `feed`
                self._top = frame if frame.simple else None

    def _add_ids(self, ids: list[Any]) -> bool:
        """Append a frame's token ids; False (nothing changed) when they are not valid ids."""
        try:
            checked = array("I", ids)
        except (TypeError, OverflowError):
            return False
        if self._completion_ids is None:
            self._completion_ids = checked
        else:
            self._completion_ids.extend(checked)
        return True

    def _slow_event(self, ev: bytes) -> bytes | None:
        """The data of an event that is more than one `data: ...` line (comments, other
        fields, multi-line data); None when it carries no data."""
        data = None
        for line in ev.split(b"\n"):
            if line[-1:] == b"\r":
                line = line[:-1]
            if line[:5] == b"data:":
                value = line[5:]
                if value[:1] == b" ":
                    value = value[1:]
                data = value if data is None else data + b"\n" + value
            # ':' comments and other SSE fields are skipped
        return data

    def _decoded(self, payloads: list[bytes]) -> Iterator[Any]:
        """The JSON chunks of `payloads`, decoded one at a time: each is dropped once handled,
        so a big read does not hold hundreds of fresh dicts (which would make the garbage
        collector scan the whole heap far more often)."""
        for data in payloads:
            try:
                yield _loads(data)
            except _JSONDecodeError:
                if b"\n" not in data:
                    raise _invalid(
                        f"stream chunk is not valid JSON: {snippet(data, 120)}") from None
                # a server that omits the blank line between events: one chunk per line
                for part in data.split(b"\n"):
                    if part == b"[DONE]":
                        self.done = True
                        return
                    if part:
                        try:
                            obj = _loads(part)
                        except _JSONDecodeError:
                            raise _invalid("stream chunk is not valid JSON: "
                                           f"{snippet(part, 120)}") from None
                        yield obj

    def _apply(self, chunks: Iterable[Any]) -> None:
        head = self.id is None  # id and model: from the first chunk that has an id
        provider = self.provider is None  # from any chunk
        want_pids = self._prompt_ids is None and not self._seen_choices  # the first chunk
        content = self._content
        for chunk in chunks:
            if chunk.__class__ is not dict:
                raise _invalid(f"stream chunk must be a JSON object, got {type(chunk).__name__}")
            self.events += 1
            get = chunk.get
            if head:
                value = get("id")
                if value is not None:
                    self.id = _opt_str(value)
                    self.model = _model(get("model"))
                    head = False
            if provider:
                value = get("provider")
                if value:
                    self.provider = _opt_str(value)
                    provider = self.provider is None
                    self.quantization = _model(get("quantization"))
            if want_pids:
                value = get("prompt_token_ids")
                if value is not None:
                    self._prompt_ids = _ids(value, "prompt_token_ids")
                    want_pids = False
            err = get("error")
            if err:
                self.error = err
            value = get("usage")
            if value:
                self.usage, self.usage_warnings = clean_usage(value)
            choices = get("choices")
            if not choices:
                continue
            if choices.__class__ is not list:
                raise _invalid(f"choices must be a list, got {type(choices).__name__}")
            choice = choices[0]
            if choice.__class__ is not dict:
                raise _invalid("choices[0] must be an object")
            cget = choice.get
            if want_pids:
                value = cget("prompt_token_ids")
                if value is not None:
                    self._prompt_ids = _ids(value, "choices[0].prompt_token_ids")
                want_pids = False
                self._seen_choices = True
            delta = cget("delta")
            if delta:
                if delta.__class__ is not dict:
                    raise _invalid("choices[0].delta must be an object")
                text = delta.get("content")
                if text:
                    if text.__class__ is not str:
                        text = _text(text, "choices[0].delta.content")
                    content.append(text)
                text = delta.get("reasoning")
                if text:
                    self._reasoning_piece(text, "reasoning")
                else:
                    text = delta.get("reasoning_content")
                    if text:
                        self._reasoning_piece(text, "reasoning_content")
                calls = delta.get("tool_calls")
                if calls:
                    self._tool_deltas(calls)
            finish = cget("finish_reason")
            if finish:
                self.finish_reason = _opt_str(finish)
                native = cget("native_finish_reason")
                if native:
                    self.native_finish_reason = _opt_str(native)
                stop = cget("stop_reason")
                if stop is not None:
                    self.stop_reason = stop
            tids = cget("token_ids")
            if tids:
                self._extend_ids(tids)
            cerr = cget("error")
            if cerr:
                self.error = cerr

    def _reasoning_piece(self, text: Any, field: str) -> None:
        if text.__class__ is not str:
            text = _text(text, f"choices[0].delta.{field}")
        self._reasoning.append(text)
        if self.reasoning_field is None:
            self.reasoning_field = field

    def _extend_ids(self, ids: Any) -> None:
        if self._completion_ids is None:
            self._completion_ids = _ids(ids, "choices[0].token_ids")
            return
        if ids.__class__ is not list:
            raise _invalid("choices[0].token_ids must be a list of token ids")
        try:
            self._completion_ids.extend(ids)
        except (TypeError, OverflowError):
            raise _invalid("choices[0].token_ids must hold non-negative integer token ids"
                           ) from None

    def _tool_deltas(self, calls: Any) -> None:
        if calls.__class__ is not list:
            raise _invalid("choices[0].delta.tool_calls must be a list")
        for frag in calls:
            if frag.__class__ is not dict:
                raise _invalid("choices[0].delta.tool_calls[] must be objects")
            fn = frag.get("function")
            if fn is None:
                fn = {}
            elif fn.__class__ is not dict:
                raise _invalid("choices[0].delta.tool_calls[].function must be an object")
            call_id = frag.get("id")
            index = frag.get("index")
            if index.__class__ is not int:
                # No index: a fragment with a new id starts a call, others continue the last.
                last = self._last_tool
                if last is not None and (not call_id or call_id == last.id):
                    index = last.index
                else:
                    index = len(self._tools)
                    while index in self._tools:
                        index += 1
            acc = self._tools.get(index)
            if acc is None:
                acc = self._tools[index] = _ToolAcc(index)
            self._last_tool = acc
            if call_id and not acc.id and call_id.__class__ is str:
                acc.id = call_id
            name = fn.get("name")
            if name:
                if name.__class__ is not str:
                    raise _invalid("choices[0].delta.tool_calls[].function.name must be a string")
                if not acc.name:
                    acc.name = name
                elif name != acc.name:
                    acc.name += name  # a server streaming the name in pieces
            args = fn.get("arguments")
            if args:
                args = _arguments(args, "choices[0].delta.tool_calls[].function.arguments")
                acc.args.append(args)
                self._size += len(args)

    def finish(self) -> ChatResponse:
        """The response after the body ended (at [DONE] or EOF); raises for a failed stream."""
        if not self.done:
            tail = self._buf.rstrip(b"\r\n")
            self._buf = b""
            if tail:
                self.feed(tail + b"\n\n")
        if self.error is not None or self.finish_reason == "error":
            raise self.failure()
        if not self.done and self.finish_reason is None:
            raise ApiError(
                "connection",
                "stream ended before [DONE] and without a finish_reason "
                f"({self.events} chunks received)",
                provider=self.provider,
                usage=self.usage,
            )
        tools = [
            RawToolCall(index=t.index, id=t.id, name=t.name, arguments="".join(t.args))
            for t in sorted(self._tools.values(), key=lambda t: t.index)
        ]
        reasoning = "".join(self._reasoning)
        return ChatResponse(
            content="".join(self._content) if self._content else None,
            reasoning=reasoning or None,
            reasoning_field=self.reasoning_field if reasoning else None,
            tool_calls=tools,
            finish_reason=self.finish_reason,
            native_finish_reason=self.native_finish_reason,
            provider=self.provider,
            quantization=self.quantization,
            model=self.model,
            id=self.id,
            usage=self.usage or {},
            prompt_token_ids=None if self._prompt_ids is None else self._prompt_ids.tolist(),
            completion_token_ids=None if self._completion_ids is None
            else self._completion_ids.tolist(),
            stream=True,
            stop_reason=self.stop_reason if isinstance(self.stop_reason, int | str)
            and not isinstance(self.stop_reason, bool) else None,
            duplicates=self._duplicates() if self._dups else [],
            oversize=self.oversize,
            usage_warnings=self.usage_warnings,
        )

    def _duplicates(self) -> list[tuple[str, int, int]]:
        """(field, offset, length) of the text each repeated event added to its field: the
        piece it appended repeats the end of the piece before it in the same field (that
        piece may hold a whole run of events, the repeated one last). One pass over each
        field's pieces: a run of repeated events costs its length, not its square."""
        out = []
        dups = self._dups or ()
        for field, pieces in (("content", self._content), ("reasoning", self._reasoning)):
            wanted = sorted({k for noted, k in dups if noted == field and 0 < k < len(pieces)})
            if not wanted:
                continue
            offset, at = 0, 0  # the text before pieces[at]
            for k in wanted:
                while at < k:
                    offset += len(pieces[at])
                    at += 1
                piece = pieces[k]
                if pieces[k - 1].endswith(piece):
                    out.append((field, offset, len(piece)))
        return out

    def failure(self) -> ApiError:
        """The `stream_error` for an error chunk (or finish_reason "error") seen so far."""
        return _failure("stream_error", self.error if self.error is not None else True,
                        self.usage, self.provider)

    @property
    def failed(self) -> bool:
        return self.error is not None or self.finish_reason == "error"

    @property
    def has_output(self) -> bool:
        """Whether the model's output has begun: content, reasoning, a tool call or an id."""
        return bool(self._content or self._reasoning or self._tools or self._completion_ids)

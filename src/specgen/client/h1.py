"""One keep-alive HTTP/1.1 connection that reads a streamed answer in batches.

The protocol parses the response head, undoes the body framing (chunked, `Content-Length` or
read-to-close) and any `gzip`/`deflate` coding, and hands the body to a sink: a
`StreamParser` for an SSE answer (events are parsed right in `data_received`, so no task
wakes up until the answer is complete) or a byte list for anything else (an error body, a
JSON answer). While an SSE body is read, the connection is held by a `ReadTicker`, which
reads it once per tick: the bytes a provider wrote one token at a time meanwhile are parsed
together.

The request coroutine waits on two futures: `head` (the status line and headers) and `end`
(the answer is complete: `[DONE]`, the body's end, or an error).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING, Any

from multidict import CIMultiDict

from .parse import StreamParser
from .types import ApiError

if TYPE_CHECKING:
    from .deadline import Deadline
    from .ticker import ReadTicker

MAX_HEAD = 64 * 1024  # status line + headers
MAX_CHUNK_LINE = 4096  # a chunk-size line (with extensions) or a trailer line
BULK_CHUNKS = 4  # a read of fewer chunks than this (by the last one's size): the chunk loop
_NO_BODY = frozenset((204, 304))


class HttpProtocolError(Exception):
    """The server spoke broken HTTP (mapped to `invalid_response`)."""


class Disconnected(ConnectionError):
    """The connection ended where the response was not over."""


class Response:
    """Status, headers and framing of one response head."""

    __slots__ = ("status", "headers", "chunked", "length", "keep_alive", "content_type",
                 "encoding")

    def __init__(self, status: int, headers: CIMultiDict[str], chunked: bool,
                 length: int | None, keep_alive: bool):
        self.status = status
        self.headers = headers
        self.chunked = chunked
        self.length = length  # None: to the end of the connection (when not chunked)
        self.keep_alive = keep_alive
        ctype = headers.get("Content-Type", "")
        self.content_type = ctype.split(";", 1)[0].strip().lower()
        self.encoding = headers.get("Content-Encoding", "identity").strip().lower()


def parse_head(raw: bytes) -> Response:
    """The response head (without its blank line); `HttpProtocolError` if malformed."""
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HttpProtocolError(f"bad status line {lines[0][:80]!r}")
    status = int(parts[1])
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise HttpProtocolError(f"bad header line {line[:80]!r}")
        headers.add(name.decode("latin-1"), value.strip().decode("latin-1"))
    conn = headers.get("Connection", "").lower()
    keep_alive = parts[0] == b"HTTP/1.1" and "close" not in conn
    te = headers.get("Transfer-Encoding", "").lower()
    chunked = te.rsplit(",", 1)[-1].strip() == "chunked"
    length: int | None = None
    if status in _NO_BODY or 100 <= status < 200:
        length = 0
    elif not chunked:
        if te:
            keep_alive = False  # a coding without chunked: the body ends with the connection
        elif "Content-Length" in headers:
            values = {v.strip() for v in headers.getall("Content-Length")}
            value = values.pop()
            if values or not value.isdigit():
                raise HttpProtocolError("bad Content-Length")
            length = int(value)
        else:
            keep_alive = False
    return Response(status, headers, chunked, length, keep_alive)


_X = (b"x", b"X")  # a size with a 0x prefix is not HTTP
# the size lines of chunks under 2 KiB (a token's chunk is a few hundred bytes), both cases
_SIZES = {form % n: n for n in range(1, 2048) for form in (b"%x", b"%X")}


def _chunk_size(line: bytes) -> int:
    """The size on a chunk-size line (extensions after `;` ignored)."""
    size = line if line.isalnum() else line.split(b";", 1)[0].strip(b" \t")
    if size.isalnum() and size[1:2] not in _X:  # int() refuses letters past f
        try:
            return int(size, 16)
        except ValueError:
            pass
    raise HttpProtocolError(f"bad chunk size {line[:40]!r}")


class Dechunker:
    """Undoes chunked framing incrementally; `done` once the last chunk and trailers came.

    A read of several whole chunks is taken in one pass (`_whole_chunks`); otherwise each chunk
    costs one `find`, one `int` and one slice; a chunk cut by the read is finished on the next
    `feed`."""

    __slots__ = ("_left", "_crlf", "_trailers", "_tail", "done", "_size")
    BULK = True  # tests turn it off to compare with the chunk-by-chunk loop

    def __init__(self) -> None:
        self._left = 0  # data bytes of a cut chunk still to come
        self._crlf = 0  # bytes of its closing CRLF still to come
        self._trailers = False
        self._tail = b""  # an unfinished chunk-size or trailer line
        self.done = False
        self._size = 0  # the last chunk's size: a read shorter than a few is left to the loop

    def feed(self, data: bytes) -> list[bytes]:
        """The body bytes in `data`; any bytes after the body's end are ignored."""
        out: list[bytes] = []
        pos = 0
        if (not (self._left or self._crlf or self._tail or self._trailers) and self.BULK
                and len(data) >= BULK_CHUNKS * self._size):
            pos = self._whole_chunks(data, out)
            if pos == len(data):
                return out
        elif self._left or self._crlf:
            pos = self._finish_cut(data, out)
            if self._left or self._crlf:
                return out
        if self._tail:
            buf = self._tail + data[pos:]
            self._tail = b""
            pos = 0
        else:
            buf = data
        end = len(buf)
        find = buf.find
        while pos < end:
            nl = find(b"\r\n", pos)
            if nl < 0:
                if end - pos > MAX_CHUNK_LINE:
                    raise HttpProtocolError("chunk-size line too long")
                self._tail = buf[pos:]
                break
            if self._trailers:
                if nl == pos:
                    self.done = True
                    break
                pos = nl + 2
                continue
            line = buf[pos:nl]
            if line.isalnum() and line[1:2] not in _X:  # bare hex digits (int() refuses g-z)
                try:
                    n = int(line, 16)
                except ValueError:
                    n = _chunk_size(line)
            else:
                n = _chunk_size(line)
            self._size = n
            if n == 0:
                self._trailers = True
                pos = nl + 2
                continue
            start = nl + 2
            stop = start + n
            if stop + 2 <= end:
                if not buf.startswith(b"\r\n", stop):
                    raise HttpProtocolError("chunk data not followed by CRLF")
                out.append(buf[start:stop])
                pos = stop + 2
                continue
            if start < end:  # the chunk goes on in the next read
                out.append(buf[start:stop])
            self._left = max(0, stop - end)
            self._crlf = 2
            if stop < end:
                self._check_crlf(buf[stop:end])
            break
        return out

    def _whole_chunks(self, data: bytes, out: list[bytes]) -> int:
        """Take the whole chunks at the start of `data` (which starts at a chunk-size line) in
        a few C-level passes; the bytes taken. A stream sends one small chunk per token, so
        this is most chunks.

        `data` is split at every CRLF into (size line, data) pairs; a pair is one whole chunk
        exactly when its size line (read as the loop reads it) names its data's length. Checked from
        the first pair on, that is the true framing: where a chunk's data held a CRLF, its
        piece comes out shorter than its size, and nothing is taken (the loop reads it). The
        last chunk (size 0) and what follows it are left to the loop too.
        """
        parts = data.split(b"\r\n")
        pairs = (len(parts) - 1) // 2  # each pair's data is followed by a CRLF
        if pairs < 2:
            return 0
        size_lines = parts[0:2 * pairs:2]
        pieces = parts[1:2 * pairs:2]
        sizes = list(map(_SIZES.get, size_lines))  # a token's chunk: a size seen before
        if None in sizes:
            try:
                sizes = list(map(_chunk_size, size_lines))
            except HttpProtocolError:
                return 0  # the loop reports it where it is
        if 0 in sizes:  # the last chunk: trailers follow, the loop reads them
            pairs = sizes.index(0)
            del sizes[pairs:], pieces[pairs:], size_lines[pairs:]
        if sizes != list(map(len, pieces)):
            return 0  # a CRLF inside some chunk's data
        out.extend(pieces)
        if sizes:
            self._size = sizes[-1]
        return sum(sizes) + sum(map(len, size_lines)) + 4 * pairs

    def _finish_cut(self, data: bytes, out: list[bytes]) -> int:
        pos = 0
        if self._left:
            pos = min(self._left, len(data))
            out.append(data[:pos])
            self._left -= pos
            if self._left:
                return pos
        return pos + self._check_crlf(data[pos:pos + self._crlf])

    def _check_crlf(self, have: bytes) -> int:
        """Take the start of the closing CRLF from `have`; how many bytes it was."""
        want = b"\r\n"[2 - self._crlf:][:len(have)]
        if have[:len(want)] != want:
            raise HttpProtocolError("chunk data not followed by CRLF")
        self._crlf -= len(want)
        return len(want)


def _decoder(encoding: str) -> zlib._Decompress | None:
    if encoding in ("identity", ""):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj(zlib.MAX_WBITS)
    raise HttpProtocolError(f"unsupported Content-Encoding {encoding!r}")


class H1Connection(asyncio.Protocol):
    """A pooled connection; `start()` sends one request and reads its response."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ticker: ReadTicker | None):
        self.loop = loop
        self.ticker = ticker
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False  # a request's response is being read
        self.reusable = False  # the last response ended cleanly with keep-alive
        self.idle_handle: asyncio.TimerHandle | None = None
        self.held = False  # ticker bookkeeping
        self.fresh = False  # bytes came since the ticker last looked
        self.empty_ticks = 0
        self.last_len = 0  # bytes of the latest read
        self.reader: Any = None  # what the ticker pauses, and its direct read step
        self.read_step: Any = None
        self.via_proxy = False  # connected to an http proxy: requests in absolute form
        self._reset()

    def _reset(self) -> None:
        self.head: asyncio.Future[Response] | None = None
        self.end: asyncio.Future[None] | None = None
        self.response: Response | None = None
        self.parser: StreamParser | None = None
        self.body: list[bytes] = []
        self.body_size = 0
        self.body_cap = 0
        self.truncated = False
        self.sse_done = False  # the parser saw [DONE]: the rest is read only for reuse
        self._head_buf = b""
        self._dechunk: Dechunker | None = None
        self._left: int | None = None
        self._decode: zlib._Decompress | None = None
        self.deadline: Deadline | None = None

    # -- the request side ------------------------------------------------------------------

    def start(self, request: bytes, deadline: Deadline) -> None:
        """Send `request`; bytes that arrive stamp `deadline.last` (the idle timeout)."""
        assert not self.busy and self.transport is not None
        self._reset()
        self.busy = True
        self.reusable = False
        self.deadline = deadline
        self.head = self.loop.create_future()
        self.end = self.loop.create_future()
        self.transport.write(request)

    def read_sse(self, parser: StreamParser) -> None:
        """Feed the body to `parser`, held by the ticker; `end` resolves at [DONE] or the
        body's end."""
        self.parser = parser
        if self.body:
            data, self.body = b"".join(self.body), []
            self._to_parser([data])
        if self.ticker is not None and self.busy:
            self.ticker.hold(self)

    def read_all(self, cap: int) -> None:
        """Collect the body (up to `cap` bytes, then `truncated`); `end` resolves at its end."""
        self.body_cap = cap
        if self.body_size > cap:
            self._over_cap()

    def fail(self, exc: BaseException) -> None:
        """A read error: the request fails with it and the connection is dropped."""
        self._fail(exc)
        self.abort()

    def abort(self) -> None:
        """Drop the connection (a response not read to its end cannot be reused)."""
        self.busy = False
        self.reusable = False
        was_closed, self.closed = self.closed, True
        if self.ticker is not None:
            self.ticker.release(self)
        if self.transport is not None and not was_closed:
            self.transport.abort()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.fresh = True
        self.last_len = len(data)
        if not self.busy:
            if data:  # bytes nobody asked for: the connection cannot be trusted any more
                self.abort()
            return
        self.deadline.last = self.loop.time()  # type: ignore[union-attr]
        try:
            if self.response is None:
                data = self._read_head(data)
                if data is None:
                    return
            self._read_body(data)
            if self.busy and self.parser is not None and self.ticker is not None \
                    and not self.held:
                self.ticker.hold(self)
        except (ApiError, HttpProtocolError, zlib.error) as exc:
            self._fail(exc if not isinstance(exc, zlib.error)
                       else HttpProtocolError(f"bad compressed body: {exc}"))
            self.abort()

    def eof_received(self) -> bool:
        if self.busy and self.response is not None and self._left is None \
                and self._dechunk is None:
            self._body_done()  # a body delimited by the end of the connection
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.ticker is not None:
            self.ticker.release(self)
        if self.busy:
            self.busy = False
            where = "before a response" if self.response is None else "mid-body"
            self._fail(exc if exc is not None
                       else Disconnected(f"the server closed the connection {where}"))
        if self.idle_handle is not None:
            self.idle_handle.cancel()
            self.idle_handle = None

    # -- parsing ---------------------------------------------------------------------------

    def _read_head(self, data: bytes) -> bytes | None:
        buf = self._head_buf + data if self._head_buf else data
        while True:
            cut = buf.find(b"\r\n\r\n")
            if cut < 0:
                if len(buf) > MAX_HEAD:
                    raise HttpProtocolError("response head larger than 64 KiB")
                self._head_buf = buf
                return None
            resp = parse_head(buf[:cut])
            buf = buf[cut + 4:]
            if 100 <= resp.status < 200 and resp.status != 101:
                continue  # 100 Continue, 103 Early Hints: the real head follows
            break
        self._head_buf = b""
        self.response = resp
        self._decode = _decoder(resp.encoding)
        if resp.chunked:
            self._dechunk = Dechunker()
        else:
            self._left = resp.length
        if not self.head.done():  # type: ignore[union-attr]
            self.head.set_result(resp)  # type: ignore[union-attr]
        if resp.length == 0:
            self._body_done()
            return None
        return buf

    def _read_body(self, data: bytes) -> None:
        if self._dechunk is not None:
            pieces = self._dechunk.feed(data) if data else []
            finished = self._dechunk.done
        elif self._left is not None:
            if len(data) > self._left:
                data = data[:self._left]
            self._left -= len(data)
            pieces = [data] if data else []
            finished = self._left == 0
        else:
            pieces = [data] if data else []
            finished = False
        if self._decode is not None and pieces:
            pieces = [self._decode.decompress(b"".join(pieces))]
        if pieces:
            if self.parser is not None:
                self._to_parser(pieces)
            else:
                self.body.extend(pieces)
                self.body_size += sum(len(p) for p in pieces)
                if self.body_cap and self.body_size > self.body_cap:
                    self._over_cap()
                    return
        if finished:
            self._body_done()

    def _to_parser(self, pieces: list[bytes]) -> None:
        parser = self.parser
        if self.sse_done:
            return
        parser.feed(pieces[0] if len(pieces) == 1 else b"".join(pieces))  # type: ignore[union-attr]
        if parser.done:  # type: ignore[union-attr]
            self.sse_done = True
            if parser.oversize is not None:  # type: ignore[union-attr]
                self._over_cap()  # cut at max_answer_bytes: the rest is not read
                return
            if not self.end.done():  # type: ignore[union-attr]
                self.end.set_result(None)  # type: ignore[union-attr]

    def _over_cap(self) -> None:
        self.truncated = True
        if not self.end.done():  # type: ignore[union-attr]
            self.end.set_result(None)  # type: ignore[union-attr]
        if self.busy:
            self.abort()

    def _body_done(self) -> None:
        resp = self.response
        self.busy = False
        self.reusable = bool(resp is not None and resp.keep_alive and not self.closed)
        if self.ticker is not None:
            self.ticker.release(self)
        if not self.end.done():  # type: ignore[union-attr]
            self.end.set_result(None)  # type: ignore[union-attr]
        on_done = self.on_done
        if on_done is not None:
            on_done(self)

    on_done = None  # set by the pool: called when a response ended (to take it back)

    def _fail(self, exc: BaseException) -> None:
        for fut in (self.head, self.end):
            if fut is not None and not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: a caller that already left does not warn
                break

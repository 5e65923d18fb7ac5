"""The simulator's OpenAI-style Batch API (docs/sim.md, "Batches").

    POST /v1/files                  multipart upload (purpose=batch) -> {"id": "file-..."}
    GET  /v1/files/{id}/content     the file's bytes (input, output or error JSONL)
    POST /v1/batches                {input_file_id, endpoint, completion_window, metadata}
    GET  /v1/batches                newest first, `limit` and `after` (has_more, last_id)
    GET  /v1/batches/{id}           the batch object (status, request_counts, file ids)
    POST /v1/batches/{id}/cancel    cancelled at once; what was answered is in the output

and OpenRouter's inline shape on the same paths (docs/batch.md, "OpenRouter"):

    POST /v1/batches                {endpoint, model, completion_window, metadata, provider,
                                    requests: [{custom_id, body}]} -> 202, status validating
    GET  /v1/batches/{id}/results   the result lines, `limit` and `cursor` pages
                                    ({object: list, data, has_more, next_cursor})

Each line is answered by the simulator's own chat handler (`Simulator.chat`) through a
`LineRequest` standing in for the HTTP request: the same routing, providers, faults, quirks,
answers and usage as a live request with the same body (the cost times
`batch_price_factor`). `batch_create_delay_s` delays the answer to POST /v1/batches (the
batch exists at once). The batch is `validating`, then `in_progress` while its lines run, and
completes no sooner than `batch_processing_s` after it was created, and not while batches are
held (`POST /sim/batches/hold` until `POST /sim/batches/release`). `batch_line_fail_rate`
answers a share of lines with an error line instead; `batch_expire_rate` leaves a share
unanswered and ends the batch `expired`. Every `POST /v1/batches` is counted
(`/sim/stats` -> `batches.submitted`).

Files (uploads, outputs, errors) live in one unlinked temporary file on disk (`Spool`), not
in memory, and are served from it in chunks: the simulator's memory holds the batches in
flight, not every file of a 100,000-request run.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import tempfile
import time
from typing import Any
from urllib.parse import parse_qs

import orjson

from .faults import error_body
from .http import Request

PREFIXES = ("/api/v1", "/v1")
TERMINAL = ("completed", "failed", "expired", "cancelled")
SEND_CHUNK = 1 << 20


class Spool:
    """The batch API's files, appended to one temporary file (unlinked at once: gone with
    the process, even after kill -9); a file is its (offset, size) in it."""

    def __init__(self) -> None:
        self._f: Any = None
        self._end = 0
        self.extents: dict[str, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self.extents)

    def __contains__(self, fid: object) -> bool:
        return fid in self.extents

    def put(self, fid: str, parts: list[bytes]) -> int:
        """Store the concatenation of `parts` as file `fid`; its size."""
        if self._f is None:
            self._f = tempfile.TemporaryFile(prefix="specgen-sim-batch-")
        start = self._end
        for part in parts:
            os.pwrite(self._f.fileno(), part, self._end)
            self._end += len(part)
        self.extents[fid] = (start, self._end - start)
        return self._end - start

    def read(self, fid: str, offset: int = 0, size: int | None = None) -> bytes | None:
        """`size` bytes of file `fid` from `offset` (the rest of it by default); None when
        there is no such file."""
        extent = self.extents.get(fid)
        if extent is None:
            return None
        start, total = extent
        n = total - offset if size is None else min(size, total - offset)
        return os.pread(self._f.fileno(), n, start + offset) if n > 0 else b""

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class LineRequest:
    """What `Simulator.chat` needs of a request, for one batch line: the answer is kept."""

    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "on_lost",
                 "_state", "done", "status", "payload")

    def __init__(self, body: bytes, headers: dict[str, str], done: asyncio.Future):
        self.method, self.path, self.query = "POST", "/api/v1/chat/completions", ""
        self.headers, self.body, self.keep_alive = headers, body, True
        self.on_lost = None
        self._state = 0
        self.done = done
        self.status = 0
        self.payload = b""

    closed = False
    transport = None

    def _end(self) -> None:
        self._state = 2
        if not self.done.done():
            self.done.set_result(self)

    def respond(self, status: int, body: bytes, content_type: str = "application/json",
                headers: dict[str, str] | None = None) -> None:
        self.status, self.payload = status, body
        self._end()

    def start_stream(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._state = 1
        self.status = 400
        self.payload = orjson.dumps(error_body(400, "a batch line cannot be streamed"))

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        return None

    def end_stream(self) -> None:
        self._end()

    def write_raw(self, data: bytes) -> None:
        self._state = max(self._state, 1)

    def reset(self) -> None:
        self.status = 500
        self.payload = orjson.dumps(error_body(500, "upstream connection reset"))
        self._end()


class BatchApi:
    def __init__(self, sim: Any):
        self.sim = sim
        self.files = Spool()
        self.batches: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.submitted = 0
        self.cancelled = 0
        self.lines = 0
        self.held = False  # no batch completes while held (a cancel still ends it)
        self._n = 0

    def stats(self) -> dict[str, int]:
        by_state: dict[str, int] = {}
        for b in self.batches.values():
            by_state[b["status"]] = by_state.get(b["status"], 0) + 1
        return {"submitted": self.submitted, "lines": self.lines, "cancelled": self.cancelled,
                "files": len(self.files), "by_state": by_state}

    def hold(self, request: Request) -> None:
        """POST /sim/batches/hold: batches run their lines but stay `finalizing` (tests)."""
        self.held = True
        _json(request, 200, {"held": True})

    def release(self, request: Request) -> None:
        """POST /sim/batches/release: held batches complete (after `batch_processing_s`)."""
        self.held = False
        _json(request, 200, {"held": False})

    def _id(self, kind: str) -> str:
        self._n += 1
        digest = hashlib.blake2b(f"{self.sim.seed}:{kind}:{self._n}:{time.time()}".encode(),
                                 digest_size=8).hexdigest()
        return f"{kind}-{digest}"

    # -- routing --------------------------------------------------------------------------
    def handle(self, request: Request) -> bool:
        """Answer `request` if it is a Batch API path; False when it is not one."""
        path = request.path
        for prefix in PREFIXES:
            if path.startswith(prefix + "/files") or path.startswith(prefix + "/batches"):
                rest = path[len(prefix):].strip("/").split("/")
                break
        else:
            return False
        if self.sim.cfg.api_keys:
            denied = self.sim._auth(request)
            if denied:
                _json(request, 401, denied)
                return True
        m = request.method
        try:
            if rest == ["files"] and m == "POST":
                self.upload(request)
            elif len(rest) == 3 and rest[0] == "files" and rest[2] == "content" and m == "GET":
                self.content(request, rest[1])
            elif rest == ["batches"] and m == "POST":
                self.create(request)
            elif rest == ["batches"] and m == "GET":
                self.list(request)
            elif len(rest) == 2 and rest[0] == "batches" and m == "GET":
                self.get(request, rest[1])
            elif len(rest) == 3 and rest[0] == "batches" and rest[2] == "cancel" and m == "POST":
                self.cancel(request, rest[1])
            elif len(rest) == 3 and rest[0] == "batches" and rest[2] == "results" and m == "GET":
                self.results(request, rest[1])
            else:
                _json(request, 404, error_body(404, f"Not Found: {path[:200]}"))
        except (BadInput, ValueError) as exc:  # ValueError: a limit or cursor not a number
            _json(request, 400, error_body(400, str(exc)))
        return True

    # -- files ----------------------------------------------------------------------------
    def upload(self, request: Request) -> None:
        fields = parse_multipart(request.headers.get("content-type", ""), request.body)
        if fields.get("purpose", b"").decode() != "batch":
            raise BadInput("purpose must be \"batch\"")
        data = fields.get("file")
        if data is None:
            raise BadInput("no file part in the upload")
        fid = self._id("file")
        self.files.put(fid, [data])
        _json(request, 200, {"id": fid, "object": "file", "bytes": len(data),
                             "created_at": int(time.time()), "filename": "batch.jsonl",
                             "purpose": "batch"})

    def content(self, request: Request, fid: str) -> None:
        if fid not in self.files:
            _json(request, 404, error_body(404, f"No such file: {fid}"))
            return
        task = asyncio.get_running_loop().create_task(self._send_file(request, fid))
        self.sim._tasks.add(task)
        task.add_done_callback(self.sim._tasks.discard)

    async def _send_file(self, request: Request, fid: str) -> None:
        """A file's bytes in chunks read from the spool as the client takes them (a result
        file can be hundreds of MB)."""
        request.start_stream(200, {"Content-Type": "application/jsonl"})
        offset = 0
        while chunk := self.files.read(fid, offset, SEND_CHUNK):
            request.write(chunk)
            offset += len(chunk)
            try:
                await request.drain()
            except (ConnectionError, OSError):  # the client went away
                return
        request.end_stream()

    # -- batches --------------------------------------------------------------------------
    def create(self, request: Request) -> None:
        try:
            body = orjson.loads(request.body)
        except orjson.JSONDecodeError as exc:
            raise BadInput(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise BadInput("the request body must be a JSON object")
        if body.get("endpoint") != "/v1/chat/completions":
            raise BadInput("endpoint must be \"/v1/chat/completions\"")
        inline = "requests" in body  # OpenRouter's shape: the lines in the body
        fid = body.get("input_file_id")
        if inline:
            items = body["requests"]
            if not isinstance(items, list) or not 1 <= len(items) <= 5000:
                raise BadInput("requests must be an array of 1 to 5,000 requests")
        else:
            data = self.files.read(fid) if isinstance(fid, str) else None
            if data is None:
                raise BadInput(f"input_file_id {fid!r} does not name an uploaded file")
            items = [raw for raw in data.splitlines() if raw.strip()]
        lines = []
        seen: set[str] = set()
        for n, raw in enumerate(items, 1):
            try:
                line = raw if inline else orjson.loads(raw)
                cid = line["custom_id"]
                lbody = line["body"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                raise BadInput(f"request {n} of the batch is not a batch request") from None
            if cid in seen:
                raise BadInput(f"request {n}: custom_id {cid!r} is not unique")
            if inline and (not isinstance(lbody, dict) or lbody.get("model") != body.get("model")):
                raise BadInput(f"request {n}: its body's model is not the batch's model "
                               f"{body.get('model')!r} (one model per batch)")
            seen.add(cid)
            lines.append((cid, orjson.dumps(lbody)))
        self.submitted += 1
        self.lines += len(lines)
        bid = self._id("batch")
        now = int(time.time())
        batch = {
            "id": bid, "object": "batch", "endpoint": "/v1/chat/completions", "errors": None,
            "input_file_id": fid, "completion_window": body.get("completion_window", "24h"),
            "status": "validating", "output_file_id": None, "error_file_id": None,
            "created_at": now, "in_progress_at": None, "finalizing_at": None,
            "completed_at": None, "failed_at": None, "expired_at": None,
            "cancelled_at": None,
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
            "metadata": body.get("metadata") or None,
        }
        if inline:
            batch.update(input_file_id=None, model=body.get("model"),
                         provider=body.get("provider"))
        self.batches[bid] = batch
        self.order.append(bid)
        headers = {k: v for k, v in request.headers.items()
                   if k in ("authorization", "x-specgen-return-token-ids")}
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._run(batch, lines, headers))
        self.sim._tasks.add(task)
        task.add_done_callback(self.sim._tasks.discard)
        delay = self.sim.cfg.batch_create_delay_s
        status = 202 if inline else 200
        if delay > 0:  # created, but the answer is late (a client killed meanwhile)
            loop.call_later(delay, _json, request, status, dict(batch))
        else:
            _json(request, status, batch)

    def list(self, request: Request) -> None:
        q = parse_qs(request.query)
        limit = max(1, min(100, int(q.get("limit", ["20"])[0])))
        after = q.get("after", [None])[0]
        ids = self.order[::-1]
        if after is not None and after in ids:
            ids = ids[ids.index(after) + 1:]
        page = ids[:limit]
        _json(request, 200, {"object": "list", "data": [self.batches[i] for i in page],
                             "first_id": page[0] if page else None,
                             "last_id": page[-1] if page else None,
                             "has_more": len(ids) > limit})

    def get(self, request: Request, bid: str) -> None:
        batch = self.batches.get(bid)
        if batch is None:
            _json(request, 404, error_body(404, f"No such batch: {bid}"))
            return
        _json(request, 200, batch)

    def results(self, request: Request, bid: str) -> None:
        """A finished batch's result lines (output, then errors), a page of `limit` from
        the `cursor` (the offset of the page's first line)."""
        batch = self.batches.get(bid)
        if batch is None:
            _json(request, 404, error_body(404, f"No such batch: {bid}"))
            return
        if batch["status"] not in TERMINAL:
            raise BadInput(f"batch {bid} is {batch['status']}: its results are not ready")
        q = parse_qs(request.query)
        limit = max(1, min(1000, int(q.get("limit", ["100"])[0])))
        start = int(q.get("cursor", ["0"])[0])
        rows = [raw for key in ("output_file_id", "error_file_id") if batch.get(key)
                for raw in (self.files.read(batch[key]) or b"").splitlines() if raw.strip()]
        page = rows[start:start + limit]
        more = start + limit < len(rows)
        request.respond(200, b'{"object":"list","data":[' + b",".join(page) + b'],"has_more":'
                        + (b"true" if more else b"false") + b',"next_cursor":'
                        + (b'"%d"' % (start + limit) if more else b"null") + b"}")

    def cancel(self, request: Request, bid: str) -> None:
        batch = self.batches.get(bid)
        if batch is None:
            _json(request, 404, error_body(404, f"No such batch: {bid}"))
            return
        if batch["status"] not in TERMINAL:
            batch["status"] = "cancelling"
            batch["_cancel"] = True
            self.cancelled += 1
        _json(request, 200, batch)

    # -- processing -----------------------------------------------------------------------
    async def _run(self, batch: dict[str, Any], lines: list[tuple[str, bytes]],
                   headers: dict[str, str]) -> None:
        cfg = self.sim.cfg
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.sleep(min(0.2, cfg.batch_processing_s / 10))
        if batch.get("_cancel"):
            return self._end(batch, [], [], "cancelled")
        batch["status"] = "in_progress"
        batch["in_progress_at"] = int(time.time())
        counts = batch["request_counts"]
        out: list[bytes] = []
        err: list[bytes] = []
        factor = cfg.batch_price_factor
        pending: dict[asyncio.Future, str] = {}
        expired: list[str] = []
        for cid, body in lines:
            rng = random.Random(f"{self.sim.seed}:{batch['id']}:{cid}")
            if cfg.batch_expire_rate and rng.random() < cfg.batch_expire_rate:
                expired.append(cid)
                continue
            if cfg.batch_line_fail_rate and rng.random() < cfg.batch_line_fail_rate:
                err.append(_line(cid, None, {"code": "server_error",
                                             "message": "the line could not be processed"}))
                counts["failed"] += 1
                continue
            fut = loop.create_future()
            self.sim.chat(LineRequest(body, headers, fut))
            pending[fut] = cid
        waiting = set(pending)
        while waiting:
            done, waiting = await asyncio.wait(waiting, timeout=0.1)
            for fut in done:
                req = fut.result()
                cid = pending[fut]
                payload = req.payload
                try:
                    body = orjson.loads(payload) if payload else None
                except orjson.JSONDecodeError:  # a broken answer: an error line
                    req.status = 502
                    body = {"error": {"code": 502, "message": "Provider returned error"}}
                if req.status == 200:
                    if isinstance(body, dict) and factor != 1.0:
                        _scale_cost(body.get("usage"), factor)
                    out.append(_line(cid, {"status_code": 200, "request_id": cid,
                                           "body": body}, None))
                    counts["completed"] += 1
                else:
                    err.append(_line(cid, {"status_code": req.status, "request_id": cid,
                                           "body": body}, None))
                    counts["failed"] += 1
            if batch.get("_cancel"):
                return self._end(batch, out, err, "cancelled")
        batch["status"] = "finalizing"
        batch["finalizing_at"] = int(time.time())
        rest = cfg.batch_processing_s - (loop.time() - started)
        while (rest > 0 or self.held) and not batch.get("_cancel"):
            await asyncio.sleep(min(rest, 0.1) if rest > 0 else 0.1)
            rest = cfg.batch_processing_s - (loop.time() - started)
        if batch.get("_cancel"):
            return self._end(batch, out, err, "cancelled")
        if expired:
            for cid in expired:
                err.append(_line(cid, None, {"code": "batch_expired", "message":
                                             "This request could not be executed before the "
                                             "completion window expired."}))
            counts["failed"] += len(expired)
            return self._end(batch, out, err, "expired")
        self._end(batch, out, err, "completed")

    def _end(self, batch: dict[str, Any], out: list[bytes], err: list[bytes], status: str
             ) -> None:
        if out:
            fid = self._id("file")
            self.files.put(fid, [b"\n".join(out), b"\n"])
            batch["output_file_id"] = fid
        if err:
            fid = self._id("file")
            self.files.put(fid, [b"\n".join(err), b"\n"])
            batch["error_file_id"] = fid
        batch.pop("_cancel", None)
        batch["status"] = status
        batch[f"{status}_at"] = int(time.time())


class BadInput(Exception):
    pass


def _line(cid: str, response: dict[str, Any] | None, error: dict[str, Any] | None) -> bytes:
    return orjson.dumps({"id": f"batch_req_{cid}", "custom_id": cid, "response": response,
                         "error": error})


def _scale_cost(usage: Any, factor: float) -> None:
    if not isinstance(usage, dict):
        return
    if isinstance(usage.get("cost"), int | float):
        usage["cost"] = usage["cost"] * factor
    details = usage.get("cost_details")
    if isinstance(details, dict):
        for k, v in details.items():
            if isinstance(v, int | float):
                details[k] = v * factor


def parse_multipart(content_type: str, body: bytes) -> dict[str, bytes]:
    """The parts of a multipart/form-data body by field name."""
    boundary = None
    for part in content_type.split(";"):
        part = part.strip()
        if part.startswith("boundary="):
            boundary = part[len("boundary="):].strip('"')
    if not boundary:
        raise BadInput("the upload must be multipart/form-data with a boundary")
    out: dict[str, bytes] = {}
    delim = b"--" + boundary.encode()
    for chunk in body.split(delim)[1:]:
        if chunk.startswith(b"--"):
            break
        head, sep, data = chunk.partition(b"\r\n\r\n")
        if not sep:
            continue
        name = None
        for line in head.decode("latin-1").split("\r\n"):
            if line.lower().startswith("content-disposition"):
                for item in line.split(";"):
                    item = item.strip()
                    if item.startswith("name="):
                        name = item[5:].strip('"')
        if name is not None:
            out[name] = data[:-2] if data.endswith(b"\r\n") else data
    return out


def _json(request: Request, status: int, obj: Any) -> None:
    request.respond(status, orjson.dumps(obj))

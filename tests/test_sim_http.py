"""The simulator's own HTTP/1.1 server, over real sockets against a `specgen sim` process:
keep-alive, pipelining, `Expect: 100-continue`, chunked bodies, bad requests, disconnects."""

from __future__ import annotations

import json
import socket

import pytest

from test_sim_support import CHAT, MODEL, SimProcess, wait_for

CONFIG = """
seed = 0
[length]
distribution = "fixed"
tokens = 20
min = 20
max = 20
[[providers]]
name = "Fast"
tag = "fast"
[[providers]]
name = "Slow"
tag = "slow"
latency_s = 30
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    s = SimProcess(tmp_path_factory.mktemp("http"), CONFIG)
    yield s
    s.stop()


def _connect(sim) -> socket.socket:
    host, port = sim.root[len("http://"):].split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _body(content: str = "hi", **extra) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}],
                       "provider": {"only": ["fast"]}, **extra}).encode()


def _post(body: bytes, extra_headers: bytes = b"", version: bytes = b"HTTP/1.1") -> bytes:
    return (b"POST " + CHAT.encode() + b" " + version + b"\r\nHost: x\r\n" + extra_headers
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def _read_response(s: socket.socket, buf: bytes = b"") -> tuple[bytes, dict, bytes, bytes]:
    """(status line, headers, body, bytes after it) of one response (Content-Length or
    chunked)."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"closed before a full head: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines)}
    if b"content-length" in headers:
        n = int(headers[b"content-length"])
        while len(rest) < n:
            chunk = s.recv(65536)
            assert chunk, "closed mid-body"
            rest += chunk
        return status, headers, rest[:n], rest[n:]
    assert headers.get(b"transfer-encoding") == b"chunked", headers
    body = b""
    while True:
        while b"\r\n" not in rest:
            rest += s.recv(65536)
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        while len(rest) < size + 2:
            rest += s.recv(65536)
        if size == 0:
            return status, headers, body, rest[2:]
        body, rest = body + rest[:size], rest[size + 2:]


def test_keep_alive_and_pipelined_requests_in_order(sim):
    s = _connect(sim)
    try:
        # Three requests in one write, then a fourth on the same connection.
        s.sendall(b"".join(_post(_body(f"q{i}", max_tokens=i + 1)) for i in range(3)))
        rest = b""
        for i in range(3):
            status, _, body, rest = _read_response(s, rest)
            assert status == b"HTTP/1.1 200 OK"
            assert json.loads(body)["usage"]["completion_tokens"] == i + 1
        s.sendall(b"GET /api/v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body, rest = _read_response(s, rest)
        assert status == b"HTTP/1.1 200 OK" and json.loads(body)["data"][0]["id"] == MODEL
        assert headers[b"content-type"] == b"application/json" and b"date" in headers
    finally:
        s.close()


def test_byte_by_byte_and_expect_continue(sim):
    s = _connect(sim)
    try:
        for b in _post(_body("slowly")):
            s.send(bytes([b]))
        status, _, body, _ = _read_response(s)
        assert status == b"HTTP/1.1 200 OK" and json.loads(body)["choices"]
        body = _body("after 100")
        s.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        status, _, answer, _ = _read_response(s)
        assert status == b"HTTP/1.1 200 OK" and json.loads(answer)["choices"]
    finally:
        s.close()


def test_chunked_request_body(sim):
    body = _body("chunked", max_tokens=3)
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7])
                      for i in range(0, len(body), 7))
    s = _connect(sim)
    try:
        s.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\nX-Trailer: 1\r\n\r\n")
        status, _, answer, _ = _read_response(s)
        assert status == b"HTTP/1.1 200 OK"
        assert json.loads(answer)["usage"]["completion_tokens"] == 3
    finally:
        s.close()


def test_streams_are_chunked_and_the_connection_is_reused(sim):
    s = _connect(sim)
    try:
        s.sendall(_post(_body("stream", stream=True, max_tokens=4)) + _post(_body("next")))
        status, headers, body, rest = _read_response(s)
        assert status == b"HTTP/1.1 200 OK"
        assert headers[b"content-type"] == b"text/event-stream"
        assert body.startswith(b": OPENROUTER PROCESSING") and body.endswith(b"data: [DONE]\n\n")
        status, _, body, _ = _read_response(s, rest)
        assert status == b"HTTP/1.1 200 OK" and json.loads(body)["object"] == "chat.completion"
    finally:
        s.close()


@pytest.mark.parametrize("raw,status", [
    (b"GARBAGE\r\n\r\n", b"400"),
    (b"POST /x HTTP/2.0\r\nHost: x\r\n\r\n", b"400"),
    (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nBad header line\r\n\r\n", b"400"),
    (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
     b"400"),
    (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nContent-Length: -1\r\n\r\n", b"400"),
    (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", b"501"),
    (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
     b"400"),
])
def test_malformed_requests_get_an_error_and_a_close(sim, raw, status):
    s = _connect(sim)
    try:
        s.sendall(raw)
        got = b""
        while chunk := s.recv(65536):  # the server closes after answering
            got += chunk
        assert got.startswith(b"HTTP/1.1 " + status), got
        assert b"Connection: close" in got and json.loads(got.partition(b"\r\n\r\n")[2])["error"]
    finally:
        s.close()
    assert sim.get("/sim/stats")[0] == 200  # and the server is fine


def test_connection_close_and_http_1_0(sim):
    for raw in (_post(_body(), b"Connection: close\r\n"), _post(_body(), version=b"HTTP/1.0")):
        s = _connect(sim)
        try:
            s.sendall(raw)
            got = b""
            while chunk := s.recv(65536):
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in got
        finally:
            s.close()


def test_not_found_and_wrong_method(sim):
    assert sim.request("GET", "/nothing/here")[0] == 404
    status, headers, _ = sim.request("GET", CHAT)
    assert status == 405 and headers["Allow"] == "POST"
    assert sim.request("POST", "/api/v1/models")[0] == 405


def test_a_client_that_leaves_is_counted_as_cancelled(sim):
    before = sim.stats()
    s = _connect(sim)
    s.sendall(_post(json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                "provider": {"only": ["slow"]}}).encode()))
    assert wait_for(lambda: sim.stats()["in_flight"] == before["in_flight"] + 1)
    s.close()
    after = wait_for(lambda: (st := sim.stats())["in_flight"] == before["in_flight"] and st)
    assert after["failed"].get("cancelled", 0) == before["failed"].get("cancelled", 0) + 1
    assert after["completed"] == before["completed"]

"""A small Hugging Face Hub written for the tests (never the network): the endpoints
huggingface_hub calls for a dataset repo.

- GET  /api/datasets/OWNER/NAME/revision/REV[?blobs=true]  revision info + file listing
- GET  /api/datasets/OWNER/NAME/tree/REV[/PATH]             file tree (recursive)
- HEAD/GET /datasets/OWNER/NAME/resolve/REV/PATH             the file, with ETag,
  X-Repo-Commit, Content-Length; Range requests answer 206
- REV may be a branch, a commit, or the quoted `refs/convert/parquet` branch
- a gated repo answers 401 (X-Error-Code: GatedRepo) without an Authorization header;
  an unknown repo 401 RepoNotFound, an unknown revision 404 RevisionNotFound.

Repos are built in the test: `hub.commit(repo, {path: bytes}, branch="main")` returns the new
commit sha and moves the branch. `slow` paths are sent in small chunks with pauses (so a test
can kill a download halfway); `requests` records (method, path, range header, authorised).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


class FakeHub:
    def __init__(self) -> None:
        self.branches: dict[str, dict[str, str]] = {}
        self.commits: dict[str, dict[str, dict[str, bytes]]] = {}
        self.gated: set[str] = set()
        self.slow: dict[str, float] = {}  # file path -> seconds between 1 KiB chunks
        self.requests: list[tuple[str, str, str | None, bool]] = []
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- building repos ------------------------------------------------------------------
    def commit(self, repo: str, files: dict[str, bytes], branch: str = "main",
               parent: str | None = None) -> str:
        """A commit of `files` (on top of the branch's files unless parent == "") on `branch`."""
        with self.lock:
            base = {}
            head = self.branches.get(repo, {}).get(branch)
            if parent != "" and head:
                base = dict(self.commits[repo][head])
            base.update(files)
            h = hashlib.sha1(repr((repo, branch, head, sorted(base.items()))).encode())
            sha = h.hexdigest()
            self.commits.setdefault(repo, {})[sha] = base
            self.branches.setdefault(repo, {})[branch] = sha
            return sha

    # -- serving -------------------------------------------------------------------------
    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _resolve_rev(self, repo: str, rev: str) -> str | None:
        if rev in self.commits.get(repo, {}):
            return rev
        return self.branches.get(repo, {}).get(rev)

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        raw = urlsplit(h.path)
        parts = raw.path.split("/")  # still quoted: a revision may hold %2F
        authorised = bool(h.headers.get("Authorization"))
        with self.lock:
            self.requests.append(("HEAD" if head else "GET", unquote(raw.path),
                                  h.headers.get("Range"), authorised))
        try:
            if parts[1:3] == ["api", "datasets"] and len(parts) >= 7:
                repo = f"{unquote(parts[3])}/{unquote(parts[4])}"
                if not self._allowed(h, repo, authorised):
                    return
                kind, rev = parts[5], unquote(parts[6])
                if kind == "revision":
                    return self._info(h, repo, rev)
                if kind == "tree":
                    return self._tree(h, repo, rev, unquote("/".join(parts[7:])))
            if parts[1] == "datasets" and len(parts) >= 7 and parts[4] == "resolve":
                repo = f"{unquote(parts[2])}/{unquote(parts[3])}"
                if not self._allowed(h, repo, authorised):
                    return
                return self._file(h, repo, unquote(parts[5]), unquote("/".join(parts[6:])),
                                  head)
            self._error(h, 404, "RepoNotFound", "not found")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _allowed(self, h, repo: str, authorised: bool) -> bool:
        if repo not in self.commits:
            self._error(h, 401, "RepoNotFound", "Repository not found")
            return False
        if repo in self.gated and not authorised:
            self._error(h, 401, "GatedRepo", "Access to this dataset is restricted")
            return False
        return True

    def _info(self, h, repo: str, rev: str) -> None:
        sha = self._resolve_rev(repo, rev)
        if sha is None:
            return self._error(h, 404, "RevisionNotFound", "Invalid rev id")
        files = self.commits[repo][sha]
        self._json(h, {"id": repo, "sha": sha, "private": False,
                       "gated": "auto" if repo in self.gated else False,
                       "siblings": [{"rfilename": p, "size": len(b),
                                     "blobId": hashlib.sha1(b).hexdigest()}
                                    for p, b in sorted(files.items())]})

    def _tree(self, h, repo: str, rev: str, prefix: str) -> None:
        sha = self._resolve_rev(repo, rev)
        if sha is None:
            return self._error(h, 404, "RevisionNotFound", "Invalid rev id")
        items = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                 for p, b in sorted(self.commits[repo][sha].items())
                 if not prefix or p.startswith(prefix.rstrip("/") + "/")]
        self._json(h, items)

    def _file(self, h, repo: str, rev: str, path: str, head: bool) -> None:
        sha = self._resolve_rev(repo, rev)
        if sha is None:
            return self._error(h, 404, "RevisionNotFound", "Invalid rev id")
        data = self.commits[repo][sha].get(path)
        if data is None:
            h.send_response(404)
            h.send_header("X-Error-Code", "EntryNotFound")
            h.send_header("X-Repo-Commit", sha)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and not head:
            start = int(rng[6:].split("-")[0] or 0)
        body = data[start:]
        h.send_response(206 if start else 200)
        h.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        h.send_header("X-Repo-Commit", sha)
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(len(body)))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if head:
            return
        pause = self.slow.get(path)
        if not pause:
            h.wfile.write(body)
            return
        for i in range(0, len(body), 1024):
            h.wfile.write(body[i:i + 1024])
            h.wfile.flush()
            time.sleep(pause)

    def _json(self, h, obj) -> None:
        body = json.dumps(obj).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _error(self, h, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

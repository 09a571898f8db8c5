"""A local Hugging Face Hub: enough of its HTTP API for the real huggingface_hub client to resolve, list and
download a repo (tests point HF_ENDPOINT at it).

    with HubServer({"meta-llama/Llama-3.2-3B-Instruct": tiny_model_dir()}) as hub:
        env["HF_ENDPOINT"] = hub.base

Served, as the Hub serves them (huggingface_hub 2.x reads exactly these):
- GET  /api/models/{repo}/revision/{revision}  -> {"id", "sha", "siblings": [{"rfilename"}]}
- GET  /api/models/{repo}/tree/{revision}      -> [{"type": "file", "path", "size", "oid"}]
- HEAD /{repo}/resolve/{revision}/{file}       -> X-Repo-Commit, ETag, Content-Length
- GET  /{repo}/resolve/{revision}/{file}       -> the bytes
- GET  /api/models/{repo}[/revision/{revision}]?expand=safetensors&expand=sha -> {"id", "sha", "safetensors"}: the
  model API as huggingface_hub's HfApi.model_info reads it, with the safetensors metadata given in `safetensors`
  (repo id -> {"parameters": {dtype: count}, "total": n}, as the Hub reports it)
A repo in `gated` answers 401 with the Hub's X-Error-Code: GatedRepo unless the request carries
`Authorization: Bearer <token>`. A repo in `renamed` (old id -> new id) answers 307 with a relative Location on
the same host, as the Hub does for a renamed repo. `fault` makes every answer misbehave (the adversarial cases):
"redirect-offhost" (307 to another host, as an LFS file's CDN redirect), "trickle" (a byte every 0.2 s),
"stall" (headers, then nothing), "oversized" (2 MiB without Content-Length). Every request is recorded as
(method, path), and its Authorization header in `authorizations`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional


class _Repo:
    def __init__(self, root: Path):
        self.files = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
        digest = hashlib.sha1()
        for name, path in self.files.items():
            digest.update(name.encode() + b"\0" + hashlib.sha1(path.read_bytes()).digest())
        self.sha = digest.hexdigest()  # a 40-hex commit, as the Hub's

    def oid(self, name: str) -> str:
        return hashlib.sha1(self.files[name].read_bytes()).hexdigest()


class HubServer:
    def __init__(self, repos: dict[str, Path], gated: Optional[dict[str, str]] = None,
                 safetensors: Optional[dict[str, dict]] = None, renamed: Optional[dict[str, str]] = None,
                 fault: Optional[str] = None):
        self.repos = {repo_id: _Repo(Path(root)) for repo_id, root in repos.items()}
        self.gated = dict(gated or {})  # repo id -> the token that opens it
        self.safetensors = dict(safetensors or {})
        self.renamed = dict(renamed or {})
        self.fault = fault
        self.requests: list[tuple[str, str]] = []
        self.authorizations: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                hub._answer(self, body=False)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "HubServer":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------ answers
    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(h.path).path)
        self.requests.append((h.command, path))
        self.authorizations.append(h.headers.get("Authorization", ""))
        if self.fault:
            try:
                self._misbehave(h, path)
            except OSError:  # the client gave up (what the adversarial cases want it to do)
                pass
            return
        status, headers, data = self._route(path, h.headers.get("Authorization", ""))
        h.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(data)), "Connection": "close"}.items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(data)
        h.close_connection = True

    def _misbehave(self, h: BaseHTTPRequestHandler, path: str) -> None:
        h.close_connection = True
        if self.fault == "redirect-offhost":
            h.send_response(307)
            h.send_header("Location", f"https://cdn-lfs.example.invalid{path}")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Connection", "close")
        if self.fault == "trickle":
            h.send_header("Content-Length", "1000")
            h.end_headers()
            for _ in range(1000):  # 200 s in all; the client gives up long before
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(0.2)
        elif self.fault == "stall":
            h.send_header("Content-Length", "100")
            h.end_headers()
            h.wfile.flush()
            time.sleep(30)
        elif self.fault == "oversized":
            h.end_headers()  # no Content-Length: the body runs until the connection closes
            for _ in range(32):
                h.wfile.write(b" " * 65536)

    def _route(self, path: str, auth: str) -> tuple[int, dict[str, str], bytes]:
        api = path.startswith("/api/models/")
        parts = path[len("/api/models/"):].split("/") if api else path.lstrip("/").split("/")
        repo_id, rest = "/".join(parts[:2]), parts[2:]
        if repo_id in self.renamed:
            new = "/".join([self.renamed[repo_id], *rest])
            return 307, {"Location": f"/api/models/{new}" if api else f"/{new}"}, b""
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", f"Repository Not Found for url: {path}.")
        token = self.gated.get(repo_id)
        if token is not None and auth != f"Bearer {token}":
            return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access "
                               "to it and be authenticated to access it. Please log in.")
        if api and (rest[:1] == ["revision"] or not rest):
            info = {"id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False, "gated": bool(token),
                    "siblings": [{"rfilename": name} for name in repo.files]}
            if repo_id in self.safetensors:
                info["safetensors"] = self.safetensors[repo_id]
            return 200, {"Content-Type": "application/json"}, json.dumps(info).encode()
        if api and rest[:1] == ["tree"]:
            tree = [{"type": "file", "path": name, "size": p.stat().st_size, "oid": repo.oid(name)}
                    for name, p in repo.files.items()]
            return 200, {"Content-Type": "application/json"}, json.dumps(tree).encode()
        if not api and rest[:1] == ["resolve"] and len(rest) >= 3:
            name = "/".join(rest[2:])
            if name not in repo.files:
                return self._error(404, "EntryNotFound", f"Entry Not Found for url: {path}.")
            data = repo.files[name].read_bytes()
            return 200, {"X-Repo-Commit": repo.sha, "ETag": f'"{repo.oid(name)}"',
                         "Content-Type": "application/octet-stream"}, data
        return self._error(404, "EntryNotFound", f"no such route {path}")

    @staticmethod
    def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
        return status, {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}, \
            json.dumps({"error": message}).encode()

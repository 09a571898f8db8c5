"""A local Hugging Face Hub: enough of its HTTP API for the real huggingface_hub client to resolve, list and
download a repo (tests point HF_ENDPOINT at it).

    with HubServer({"meta-llama/Llama-3.2-3B-Instruct": tiny_model_dir()}) as hub:
        env["HF_ENDPOINT"] = hub.base

Served, as the Hub serves them (huggingface_hub 2.x reads exactly these):
- GET  /api/models/{repo}/revision/{revision}  -> {"id", "sha", "siblings": [{"rfilename"}]}
- GET  /api/models/{repo}/tree/{revision}      -> [{"type": "file", "path", "size", "oid"}]
- HEAD /{repo}/resolve/{revision}/{file}       -> X-Repo-Commit, ETag, Content-Length
- GET  /{repo}/resolve/{revision}/{file}       -> the bytes
A repo in `gated` answers 401 with the Hub's X-Error-Code: GatedRepo unless the request carries
`Authorization: Bearer <token>`. Every request is recorded as (method, path).
"""

from __future__ import annotations

import hashlib
import json
import threading
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
    def __init__(self, repos: dict[str, Path], gated: Optional[dict[str, str]] = None):
        self.repos = {repo_id: _Repo(Path(root)) for repo_id, root in repos.items()}
        self.gated = dict(gated or {})  # repo id -> the token that opens it
        self.requests: list[tuple[str, str]] = []
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
        status, headers, data = self._route(path, h.headers.get("Authorization", ""))
        h.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(data)), "Connection": "close"}.items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(data)
        h.close_connection = True

    def _route(self, path: str, auth: str) -> tuple[int, dict[str, str], bytes]:
        api = path.startswith("/api/models/")
        parts = path[len("/api/models/"):].split("/") if api else path.lstrip("/").split("/")
        repo_id, rest = "/".join(parts[:2]), parts[2:]
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", f"Repository Not Found for url: {path}.")
        token = self.gated.get(repo_id)
        if token is not None and auth != f"Bearer {token}":
            return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access "
                               "to it and be authenticated to access it. Please log in.")
        if api and rest[:1] == ["revision"]:
            info = {"id": repo_id, "modelId": repo_id, "sha": repo.sha, "private": False, "gated": bool(token),
                    "siblings": [{"rfilename": name} for name in repo.files]}
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

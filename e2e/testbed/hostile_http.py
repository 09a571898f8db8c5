"""A local HTTP server that answers the way a hostile tenant's pod or URL would (tests and bench/adversarial.py).

Each path has a `Reply`: a status, headers and a body, sent at once or trickled a few bytes at a time (headers
included, when `trickle_headers`). `SECRET` stands for a page of a service only the operator reaches: a test
points a redirect at it and checks that none of it comes back in an error.
"""

from __future__ import annotations

import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

SECRET = "SECRET-7f3a-operator-only: root:x:0:0"


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    #: Seconds between pieces of `piece` bytes; 0 sends everything at once.
    trickle: float = 0.0
    piece: int = 1
    trickle_headers: bool = False
    #: Send no Content-Length (the body then ends when the connection closes).
    unsized: bool = False


def secret_page() -> Reply:
    return Reply(200, (SECRET + "\n").encode() * 3, (("Content-Type", "text/plain"),))


def redirect_to(location: str, status: int = 302) -> Reply:
    return Reply(status, SECRET.encode(), (("Location", location),))


class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, Reply] = {}
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        reply = self.routes.get(path) or Reply(404, f"no route {path}; {SECRET}".encode())
        head = self._head(reply)
        try:
            if reply.trickle_headers:
                self._trickle(head + reply.body, reply)
            else:
                self.wfile.write(head)
                self.wfile.flush()
                self._trickle(reply.body, reply)
        except OSError:  # the client gave up: what a deadline is for
            pass
        self.close_connection = True

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        """As GET, the request's body recorded first (`HostileServer.bodies`)."""
        length = int(self.headers.get("Content-Length") or 0)
        self.server.bodies.append(self.rfile.read(length) if length else b"")  # type: ignore[attr-defined]
        self.do_GET()

    def _head(self, reply: Reply) -> bytes:
        lines = [f"HTTP/1.1 {reply.status} Whatever {SECRET}", "Connection: close"]
        if not reply.unsized:
            lines.append(f"Content-Length: {len(reply.body)}")
        lines += [f"{k}: {v}" for k, v in reply.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def _trickle(self, data: bytes, reply: Reply) -> None:
        if not reply.trickle:
            self.wfile.write(data)
            return
        for i in range(0, len(data), reply.piece):
            self.wfile.write(data[i:i + reply.piece])
            self.wfile.flush()
            time.sleep(reply.trickle)

    def log_message(self, *args: object) -> None:
        pass


class HostileServer:
    """`with HostileServer({"/metrics": Reply(...)}) as s:` serves on 127.0.0.1:`s.port` in a thread (or on
    `host`:`port`, e.g. a fake pod's IP and vLLM's port)."""

    def __init__(self, routes: Optional[dict[str, Reply]] = None, host: str = "127.0.0.1", port: int = 0):
        handler = type("Handler", (_Handler,), {"routes": dict(routes or {})})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads, self._server.block_on_close = True, False
        self._server.requests = []  # type: ignore[attr-defined]
        self._server.bodies = []  # type: ignore[attr-defined]
        self.port = self._server.server_address[1]
        self.base = f"http://{host}:{self.port}"

    def wrap(self, context: "ssl.SSLContext") -> None:
        """Serve https with this context's certificate from now on."""
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.base = f"https://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[str]:
        """The paths asked for, in order."""
        return self._server.requests  # type: ignore[attr-defined]

    @property
    def bodies(self) -> list[bytes]:
        """The bodies of the POSTs, in order."""
        return self._server.bodies  # type: ignore[attr-defined]

    def __enter__(self) -> "HostileServer":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

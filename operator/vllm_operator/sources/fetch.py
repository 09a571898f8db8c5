"""GET what a VLLMServer points the operator at, without letting the answer reach anything but its parser.

The URLs come from people who can create VLLMServers (a pod's /metrics, spec.autoscaling.prometheusURL,
spec.model.configURL), and the operator reaches services they cannot. So every fetch here is one GET over
http or https that follows no redirect, finishes within one deadline for the whole exchange (name lookup
aside: connect, TLS, headers and body together, not a timeout per socket read), reads at most a byte cap,
and fails with a category ("HTTP 404", "timed out", "redirect refused", ...): never a byte of the answer,
which would otherwise travel into a status, a condition or an Event.
"""

from __future__ import annotations

import functools
import http.client
import io
import itertools
import json
import re
import socket
import ssl
import time
import urllib.parse
import urllib.request
from typing import Any, Optional

#: JSON that nests deeper is refused before json.loads sees it (it recurses once per level). Hugging Face
#: config.json files nest 5 levels at most (quantization_config.config_groups...), Prometheus answers 5.
MAX_JSON_DEPTH = 32
_CHUNK = 64 * 1024
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


class FetchError(Exception):
    """A failed fetch, as a category that is safe to show anywhere: it holds nothing the server sent."""


def too_large(max_bytes: int) -> FetchError:
    return FetchError(f"response larger than {max_bytes} bytes")


class _Deadline:
    def __init__(self, seconds: float):
        self._at = time.monotonic() + seconds

    def left(self) -> float:
        left = self._at - time.monotonic()
        if left <= 0:
            raise FetchError("timed out")
        return left


class _Reader(io.RawIOBase):
    """A socket's input where each wait is bounded by what is left of the fetch's deadline: a server that
    trickles one byte per second keeps every single read short, so one timeout per read bounds nothing."""

    def __init__(self, sock: socket.socket, deadline: _Deadline):
        super().__init__()
        self._sock, self._deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._deadline.left())
        return self._sock.recv_into(buffer)


class _BoundedSocket:
    """What http.client does with a socket (send, read through makefile, close), under the deadline."""

    def __init__(self, sock: socket.socket, deadline: _Deadline):
        self._sock, self._deadline = sock, deadline

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._deadline.left())  # since Python 3.5 a total for the whole sendall
        self._sock.sendall(data)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_Reader(self._sock, self._deadline))

    def close(self) -> None:
        """Nothing: http.client closes the connection while the response still reads; get() closes the socket."""


def get(url: str, *, seconds: float, max_bytes: int, accept: str = "*/*", use_proxy: bool = False) -> bytes:
    """The body of a 2xx answer to GET `url`, or FetchError with a category.

    `use_proxy`: go through the environment's HTTP(S)_PROXY (honouring NO_PROXY), as urllib and requests
    do; never for pod IPs, which are reached directly whatever proxy the operator's pod has."""
    return _fetch(url, seconds=seconds, max_bytes=max_bytes, accept=accept, use_proxy=use_proxy)


def post_json(url: str, payload: Any, *, seconds: float, max_bytes: int) -> bytes:
    """The body of a 2xx answer to POST `url` with `payload` as JSON, or FetchError with a category: the same
    bounds as get (one deadline, a byte cap, no redirect, nothing of the answer in an error), never through a
    proxy (it is for pod IPs: vLLM's runtime adapter endpoints)."""
    body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    return _fetch(url, seconds=seconds, max_bytes=max_bytes, accept="application/json", use_proxy=False,
                  method="POST", body=body)


def _fetch(url: str, *, seconds: float, max_bytes: int, accept: str, use_proxy: bool, method: str = "GET",
           body: Optional[bytes] = None) -> bytes:
    deadline = _Deadline(seconds)
    target = _parse(url)
    try:
        proxy = _proxy(target) if use_proxy else None
        sock = _open(target, deadline, proxy)
        try:
            # Through a proxy, plain http asks for the whole URL; https asks the tunnel for the path.
            absolute = proxy is not None and not _https(target)
            return _exchange(sock, target, deadline, max_bytes, accept, absolute, method, body)
        finally:
            sock.close()
    except FetchError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise FetchError(_category(e)) from None  # not chained: its text may quote the answer


def _parse(url: str) -> urllib.parse.SplitResult:
    if _CONTROL.search(url.strip()):  # urlsplit would drop CR and LF silently
        raise FetchError("invalid URL")
    target = urllib.parse.urlsplit(url.strip())
    if target.scheme.lower() not in ("http", "https"):
        raise FetchError("not an http(s) URL")
    try:
        target.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        raise FetchError("invalid URL") from None
    if not target.hostname or "@" in target.netloc:  # credentials in a URL are never sent
        raise FetchError("invalid URL")
    return target


def _https(target: urllib.parse.SplitResult) -> bool:
    return target.scheme.lower() == "https"


def _port(target: urllib.parse.SplitResult) -> int:
    return target.port or (443 if _https(target) else 80)


def _proxy(target: urllib.parse.SplitResult) -> Optional[urllib.parse.SplitResult]:
    proxy = urllib.request.getproxies().get(target.scheme.lower())
    if not proxy or urllib.request.proxy_bypass(target.hostname or ""):
        return None
    return urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")


def _open(target: urllib.parse.SplitResult, deadline: _Deadline,
          proxy: Optional[urllib.parse.SplitResult]) -> socket.socket:
    """A connected socket to the target (through the proxy: a CONNECT tunnel for https), TLS included."""
    via = proxy or target
    sock = _connect(via.hostname or "", _port(via), deadline)
    try:
        if _https(target) and proxy is not None:
            _tunnel(sock, f"{target.hostname}:{_port(target)}", deadline)
        if _https(target):
            sock.settimeout(deadline.left())  # the handshake as a whole, since Python 3.5
            sock = _tls().wrap_socket(sock, server_hostname=target.hostname)
        return sock
    except BaseException:
        sock.close()
        raise


@functools.cache
def _tls() -> ssl.SSLContext:
    """The system's trusted certificates, loaded once (a context per fetch reads them every time)."""
    return ssl.create_default_context()


def _connect(host: str, port: int, deadline: _Deadline) -> socket.socket:
    """TCP to the first of the host's addresses that answers, all of them within the one deadline (a name
    with 50 unanswering addresses would otherwise cost 50 timeouts)."""
    error: Exception = FetchError("name not resolved")
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        left = deadline.left()
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left)
            sock.connect(address)
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise error


def _tunnel(sock: socket.socket, authority: str, deadline: _Deadline) -> None:
    bounded = _BoundedSocket(sock, deadline)
    bounded.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode("ascii"))
    answer = http.client.HTTPResponse(bounded, method="CONNECT")  # type: ignore[arg-type]
    answer.begin()  # reads nothing past the headers: the server says nothing more before our TLS hello
    answer.close()
    if answer.status != 200:
        raise FetchError(f"proxy answered HTTP {answer.status}")


def _exchange(sock: socket.socket, target: urllib.parse.SplitResult, deadline: _Deadline, max_bytes: int,
              accept: str, absolute: bool, method: str = "GET", body: Optional[bytes] = None) -> bytes:
    connection = http.client.HTTPConnection(target.hostname or "", _port(target))  # never connects: it gets our socket
    connection.sock = _BoundedSocket(sock, deadline)
    path = urllib.parse.urlunsplit(("", "", target.path or "/", target.query, ""))
    headers = {"Host": target.netloc, "Accept": accept, "User-Agent": "vllm-operator"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    connection.request(method, f"{target.scheme}://{target.netloc}{path}" if absolute else path, body=body,
                       headers=headers)
    response = connection.getresponse()
    try:
        return _body(response, max_bytes)
    finally:
        response.close()


def _body(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    if 300 <= response.status < 400:
        raise FetchError("redirect refused")
    if not 200 <= response.status < 300:
        raise FetchError(f"HTTP {response.status}")
    if response.length is not None and response.length > max_bytes:
        raise too_large(max_bytes)
    body = bytearray()
    while chunk := response.read(min(_CHUNK, max_bytes + 1 - len(body))):
        body += chunk
        if len(body) > max_bytes:
            raise too_large(max_bytes)
    if response.length:  # what Content-Length still promised when the connection closed
        raise FetchError("response cut short")
    return bytes(body)


def _category(e: BaseException) -> str:
    """What went wrong, in words that hold nothing the server sent (an exception's own text may)."""
    if isinstance(e, ssl.SSLCertVerificationError):  # before ValueError: it is one
        return "certificate not trusted"
    if isinstance(e, ssl.SSLError):
        return "TLS failed"
    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, socket.gaierror):
        return "name not resolved"
    if isinstance(e, ConnectionError):  # before HTTPException: RemoteDisconnected is both
        return "connection closed"
    if isinstance(e, http.client.IncompleteRead):
        return "response cut short"
    if isinstance(e, http.client.InvalidURL) or isinstance(e, ValueError):
        return "invalid URL"  # a control character in the path, a host name IDNA cannot encode
    if isinstance(e, http.client.HTTPException):
        return "not an HTTP response"
    return "connection failed"


# --------------------------------------------------------------------------- JSON
_STRING = re.compile(r'"[^"]*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """How deep `text`'s arrays and objects nest, in linear time and without recursion.

    Strings are dropped first so that brackets inside them do not count: removing escaped backslashes,
    then escaped quotes, leaves only the quotes that open and close strings (a run of backslashes pairs
    up from its left, as JSON's escapes do). On text that is not JSON the figure bounds how deep
    json.loads gets before it fails: up to that point both read the text alike."""
    plain = _STRING.sub("", text.replace("\\\\", "").replace('\\"', ""))
    return max(itertools.accumulate(map(_STEP.__getitem__, _NOT_BRACKET.sub("", plain))), default=0)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def load_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse an answer as JSON, or FetchError: "not JSON", or nesting deeper than `max_depth` (refused before
    parsing, so no RecursionError). NaN and Infinity, which json.loads accepts, are not JSON either."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FetchError("not JSON") from None
    if json_depth(text) > max_depth:
        raise FetchError(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError:  # also an integer of more than 4,300 digits
        raise FetchError("not JSON") from None

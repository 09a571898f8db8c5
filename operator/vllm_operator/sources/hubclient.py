"""The one HTTP client huggingface_hub makes hub.py's requests with: bounded by a deadline, a byte cap and one host.

Installed with huggingface_hub's ``set_client_factory`` at the first lookup (imported only then: httpx2 and its TLS
setup cost a fifth of a second, which `vllm-operator plan` of catalog models should not pay). Every wait of a
request (connect, TLS handshake, send, each socket read) is bounded by what is left of the lookup's deadline,
through a network backend of our own under httpcore2; each answer is capped in bytes; a request or a redirect to
another host than the lookup's endpoint is refused. Requests outside a lookup (bounded()) are refused too.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Union

import httpcore2
import httpx2

from . import fetch as net


@dataclass(frozen=True)
class _Lookup:
    deadline: float
    origin: tuple[str, str, int]
    max_bytes: int


_CURRENT: contextvars.ContextVar[Optional[_Lookup]] = contextvars.ContextVar("vllm_operator_hub_lookup", default=None)


class Refused(Exception):
    """Our own refusal inside the transport (not an httpx2 error, so nothing retries or wraps it)."""


def _origin(url: Union[str, httpx2.URL]) -> tuple[str, str, int]:
    parts = urllib.parse.urlsplit(str(url))
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower().rstrip("."), parts.port or (443 if scheme == "https" else 80)


def _current() -> _Lookup:
    lookup = _CURRENT.get()
    if lookup is None:  # huggingface_hub used outside lookup(): nothing bounds it, so nothing is sent
        raise Refused("no Hub request outside a bounded lookup")
    return lookup


def _left() -> float:
    left = _current().deadline - time.monotonic()
    if left <= 0:
        raise httpcore2.ReadTimeout("timed out")
    return left


class _Stream(httpcore2.NetworkStream):
    """A connection whose every wait is bounded by what is left of the lookup's deadline (a per-read timeout
    bounds nothing against a server that trickles)."""

    def __init__(self, inner: httpcore2.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: Optional[float] = None) -> bytes:
        return self._inner.read(max_bytes, _left())

    def write(self, buffer: bytes, timeout: Optional[float] = None) -> None:
        self._inner.write(buffer, _left())

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: Optional[str] = None,
                  timeout: Optional[float] = None) -> "_Stream":
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left()))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore2.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore2.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: Optional[float] = None, local_address: Optional[str] = None,
                    socket_options: Any = None) -> _Stream:
        return _Stream(self._inner.connect_tcp(host, port, _left(), local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: Optional[float] = None, socket_options: Any = None) -> Any:
        raise httpcore2.ConnectError("no unix sockets")

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, _left()))


class _CappedBody(httpx2.SyncByteStream):
    def __init__(self, inner: httpx2.SyncByteStream, max_bytes: int):
        self._inner, self._max = inner, max_bytes

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self._inner:
            seen += len(chunk)
            if seen > self._max:
                raise Refused(str(net.too_large(self._max)))
            yield chunk

    def close(self) -> None:
        self._inner.close()


class _Transport(httpx2.HTTPTransport):
    """httpx2's own transport on the bounded network backend, refusing other hosts and answers over the cap."""

    def __init__(self, proxy: Optional[str] = None):
        super().__init__(trust_env=False)
        ssl_context = httpx2.create_ssl_context(trust_env=False)
        # httpx2's HTTPTransport keeps its httpcore2 pool in _pool and has no network_backend argument; the pool
        # classes take one. tests/unit/test_hub.py's trickle and stall cases fail if this stops taking effect.
        if proxy:
            self._pool = httpcore2.HTTPProxy(proxy_url=proxy, ssl_context=ssl_context, network_backend=_Backend())
        else:
            self._pool = httpcore2.ConnectionPool(ssl_context=ssl_context, network_backend=_Backend())

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        lookup = _current()
        if _origin(request.url) != lookup.origin:
            raise Refused("request to another host refused")
        response = super().handle_request(request)
        location = response.headers.get("Location")
        if 300 <= response.status_code < 400 and location is not None:
            if _origin(urllib.parse.urljoin(str(request.url), location)) != lookup.origin:
                response.close()
                raise Refused("redirect to another host refused")
        length = response.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > lookup.max_bytes:
            response.close()
            raise Refused(str(net.too_large(lookup.max_bytes)))
        assert isinstance(response.stream, httpx2.SyncByteStream)
        return httpx2.Response(response.status_code, headers=response.headers,
                               stream=_CappedBody(response.stream, lookup.max_bytes), extensions=response.extensions)


class _Routing(httpx2.BaseTransport):
    """Direct, or through the environment's HTTP(S)_PROXY unless NO_PROXY names the host (as fetch.py does)."""

    def __init__(self) -> None:
        proxies = urllib.request.getproxies()
        self._direct = _Transport()
        self._proxied = {scheme: _Transport(proxies[scheme]) for scheme in ("http", "https") if proxies.get(scheme)}

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        proxied = self._proxied.get(request.url.scheme)
        if proxied is not None and not urllib.request.proxy_bypass(request.url.host):
            return proxied.handle_request(request)
        return self._direct.handle_request(request)

    def close(self) -> None:
        for transport in (self._direct, *self._proxied.values()):
            transport.close()


def _client() -> httpx2.Client:
    return httpx2.Client(transport=_Routing(), follow_redirects=True, max_redirects=5, trust_env=False,
                         timeout=None)  # the network backend bounds every wait


_INSTALL = threading.Lock()
_installed = False


def install() -> None:
    """huggingface_hub's one shared client becomes ours, once, at the first lookup (never at import)."""
    global _installed
    with _INSTALL:
        if not _installed:
            from huggingface_hub import set_client_factory

            set_client_factory(_client)
            _installed = True


@contextlib.contextmanager
def bounded(endpoint: str, seconds: float, max_bytes: int) -> Iterator[None]:
    token = _CURRENT.set(_Lookup(time.monotonic() + seconds, _origin(endpoint), max_bytes))
    try:
        yield
    finally:
        _CURRENT.reset(token)

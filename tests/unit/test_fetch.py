"""The fetch helper against a local server that answers like a hostile tenant: redirects, trickles, huge
bodies, garbage, and a page only the operator reaches (SECRET), which must never come back in an error."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2e.testbed.hostile_http import SECRET, HostileServer, Reply, redirect_to, secret_page
from vllm_operator.sources import fetch


def failure(url: str, **kwargs) -> str:
    kwargs.setdefault("seconds", 1.0)
    kwargs.setdefault("max_bytes", 1024)
    with pytest.raises(fetch.FetchError) as info:
        fetch.get(url, **kwargs)
    message = str(info.value)
    assert SECRET not in message and "SECRET" not in message
    return message


def test_a_plain_answer_is_returned():
    with HostileServer({"/ok": Reply(200, b'{"a": 1}')}) as s:
        assert fetch.get(f"{s.base}/ok?x=1", seconds=1, max_bytes=1024) == b'{"a": 1}'
        assert s.requests == ["/ok?x=1"]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_refused_and_never_followed(status):
    with HostileServer({"/redirect": redirect_to("/secret", status), "/secret": secret_page()}) as s:
        assert failure(f"{s.base}/redirect") == "redirect refused"
        assert s.requests == ["/redirect"]


def test_an_error_status_is_its_code_only():
    with HostileServer() as s:  # its 404 page and reason phrase quote SECRET
        assert failure(f"{s.base}/nothing") == "HTTP 404"


def test_a_trickled_body_ends_at_the_deadline_not_per_read():
    # One byte every 0.1 s: no single read waits 1 s, the whole body would take 30 s.
    with HostileServer({"/slow": Reply(200, b"x" * 300, trickle=0.1)}) as s:
        t0 = time.monotonic()
        assert failure(f"{s.base}/slow", seconds=1.0) == "timed out"
        assert time.monotonic() - t0 < 3.0


def test_trickled_headers_end_at_the_deadline():
    with HostileServer({"/slow": Reply(200, b"{}", headers=(("X-Pad", "p" * 300),), trickle=0.1,
                                       trickle_headers=True)}) as s:
        t0 = time.monotonic()
        assert failure(f"{s.base}/slow", seconds=1.0) == "timed out"
        assert time.monotonic() - t0 < 3.0


def test_a_body_over_the_cap_is_refused_sized_or_not():
    with HostileServer({"/sized": Reply(200, b"x" * 5000), "/unsized": Reply(200, b"x" * 5000, unsized=True),
                        "/exact": Reply(200, b"x" * 1024, unsized=True)}) as s:
        assert failure(f"{s.base}/sized", max_bytes=1024) == "response larger than 1024 bytes"
        assert failure(f"{s.base}/unsized", max_bytes=1024) == "response larger than 1024 bytes"
        assert len(fetch.get(f"{s.base}/exact", seconds=1, max_bytes=1024)) == 1024


@pytest.mark.parametrize("url", ["file:///etc/passwd", "/etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1:70/x",
                                 "jar:http://x!/"])
def test_only_http_and_https(url):
    assert failure(url) == "not an http(s) URL"


@pytest.mark.parametrize("url", ["http://user@127.0.0.1:1/", "http://u:p@127.0.0.1:1/", "http://127.0.0.1:99999/",
                                 "http:///path", "http://127.0.0.1:1/a b\r\nX-Injected: 1"])
def test_malformed_urls(url):
    assert failure(url) == "invalid URL"


def test_connection_refused():
    assert failure("http://127.0.0.1:1/metrics") == "connection refused"


def _raw_server(answer: bytes) -> tuple[socket.socket, int]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


@pytest.mark.parametrize("answer, category", [
    ((SECRET + "\r\n\r\n").encode(), "not an HTTP response"),
    (b"", "connection closed"),
    (f"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{SECRET}".encode(), "response cut short"),
])
def test_a_broken_answer_is_a_category(answer, category):
    listener, port = _raw_server(answer)
    with listener:
        assert failure(f"http://127.0.0.1:{port}/") == category


def _trickling_server(data: bytes) -> tuple[socket.socket, int]:
    """Accepts one connection and sends `data` one byte every 0.1 s (a TLS handshake that never ends)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            try:
                for byte in data:
                    conn.sendall(bytes([byte]))
                    time.sleep(0.1)
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


def test_a_trickled_tls_handshake_ends_at_the_deadline():
    # The start of a TLS ServerHello record, then an endless length: the handshake never completes.
    listener, port = _trickling_server(b"\x16\x03\x03\x40\x00" + b"\x02" * 300)
    with listener:
        t0 = time.monotonic()
        assert failure(f"https://127.0.0.1:{port}/", seconds=1.0) == "timed out"
        assert time.monotonic() - t0 < 3.0


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a certificate")
def test_an_untrusted_certificate(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with HostileServer({"/": Reply(200, b"{}")}) as s:
        s.wrap(context)
        assert failure(f"https://127.0.0.1:{s.port}/") == "certificate not trusted"


@pytest.fixture
def proxy_env(monkeypatch):
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "all_proxy",
                 "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_plain_http_goes_through_the_environment_proxy_only_when_asked(proxy_env):
    with HostileServer({"/ok": Reply(200, b"direct")}) as target, \
            HostileServer({f"{'http://127.0.0.1'}:{1}/ok": Reply(200, b"proxied")}) as proxy:
        proxy_env.setenv("http_proxy", proxy.base)
        assert fetch.get(f"{target.base}/ok", seconds=1, max_bytes=100) == b"direct"
        assert fetch.get("http://127.0.0.1:1/ok", seconds=1, max_bytes=100, use_proxy=True) == b"proxied"
        assert proxy.requests == ["http://127.0.0.1:1/ok"]
        proxy_env.setenv("no_proxy", "127.0.0.1")
        assert failure("http://127.0.0.1:1/ok", use_proxy=True) == "connection refused"


def _connect_proxy(answer: bytes, seen: list[bytes]) -> tuple[socket.socket, int]:
    """A proxy that answers CONNECT with `answer`, then records the first byte the client sends through."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            seen.append(conn.recv(65536))
            conn.sendall(answer)
            conn.settimeout(2)
            seen.append(conn.recv(1))

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


def test_https_goes_through_a_connect_tunnel(proxy_env):
    seen: list[bytes] = []
    listener, port = _connect_proxy(b"HTTP/1.1 200 Connection established\r\n\r\n", seen)
    with listener:
        proxy_env.setenv("https_proxy", f"http://127.0.0.1:{port}")
        failure("https://example.test:8443/config.json", use_proxy=True)  # the fake proxy hangs up on our TLS
    assert seen[0].startswith(b"CONNECT example.test:8443 HTTP/1.1\r\n")
    assert seen[1] == b"\x16", "a TLS handshake record went through the tunnel"


def test_a_proxy_refusing_the_tunnel(proxy_env):
    listener, port = _connect_proxy(f"HTTP/1.1 403 {SECRET}\r\nContent-Length: 0\r\n\r\n".encode(), [])
    with listener:
        proxy_env.setenv("https_proxy", f"http://127.0.0.1:{port}")
        assert failure("https://example.test/config.json", use_proxy=True) == "proxy answered HTTP 403"


# --------------------------------------------------------------------------- JSON
def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


_TRICKY = st.text(alphabet='ab"\\[]{}\n\u00e9', max_size=8)
_JSON = st.recursive(st.none() | st.integers() | _TRICKY,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY, inner, max_size=3),
                     max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_JSON, st.booleans())
def test_json_depth_matches_the_parsed_depth(value, ascii_only):
    # Strings full of brackets, quotes and backslashes (escaped as JSON escapes them) never count.
    assert fetch.json_depth(json.dumps(value, ensure_ascii=ascii_only)) == _depth(value)


def test_deep_nesting_is_refused_before_json_loads_recurses():
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000, "[" * 100_000):
        with pytest.raises(fetch.FetchError, match="nested deeper than 32 levels"):
            fetch.load_json(text.encode())
    assert fetch.load_json(("[" * 32 + "]" * 32).encode()) == json.loads("[" * 32 + "]" * 32)


@pytest.mark.parametrize("raw", [b"NaN", b'{"a": Infinity}', b"[-Infinity]", b"\xff\xfe", b"{", SECRET.encode(),
                                 b"1" * 5000])
def test_what_is_not_json(raw):
    with pytest.raises(fetch.FetchError) as info:
        fetch.load_json(raw)
    assert str(info.value) == "not JSON"


# --------------------------------------------------------------------------- POST (vLLM's runtime adapter endpoints)
def test_post_json_sends_the_payload_and_returns_the_answer():
    with HostileServer({"/v1/load_lora_adapter": Reply(200, b"Success")}) as s:
        assert fetch.post_json(f"{s.base}/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"}, seconds=1,
                               max_bytes=1024) == b"Success"
        assert json.loads(s.bodies[0]) == {"lora_name": "a", "lora_path": "/x"}


def test_post_json_has_gets_bounds():
    with HostileServer({"/redirect": redirect_to("/secret", 307), "/secret": secret_page(),
                        "/slow": Reply(200, b"x" * 300, trickle=0.1), "/big": Reply(200, b"x" * 5000)}) as s:
        for path, category in (("/redirect", "redirect refused"), ("/nothing", "HTTP 404"), ("/slow", "timed out"),
                               ("/big", "response larger than 1024 bytes")):
            with pytest.raises(fetch.FetchError) as info:
                fetch.post_json(f"{s.base}{path}", {}, seconds=1.0, max_bytes=1024)
            assert str(info.value) == category and SECRET not in str(info.value)
        assert "/secret" not in s.requests

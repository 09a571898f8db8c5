"""kopf's connections to the API server, in a bounded pool.

kopf's own HTTP session (aiohttp, `TCPConnector(limit=0)` in kopf/_cogs/clients/auth.py)
has no connection limit: every request in flight opens
a connection, and each TLS connection carries a 256 KiB read buffer (asyncio's
SSLProtocol). When 1,000 VLLMServers arrive at once, kopf patches them all at once: about
a thousand connections and a quarter of a gigabyte (bench/scale.py found it with
tracemalloc). The login handler here gives kopf the same credentials (kopf's
`login_via_client`: in-cluster service account, else kubeconfig) in a session whose pool
is bounded; requests beyond it wait for a free connection.

Watch streams hold a connection each for minutes, so the bound is set from the number of
watches (one per watched resource and namespace) plus room for the requests.

A login handler returning its own session is kopf's supported extension point (custom
HTTP sessions, nolar/kopf#1230, closing nolar/kopf#909 and #1011), written against kopf
1.45.2; nothing private is used. `self_test()` checks that the public names it needs are
there; when they are not, no login handler is registered and kopf logs in its own way
(an unbounded pool), with a warning.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import aiohttp
import kopf

#: Connections for requests, on top of one per watch stream.
REQUEST_CONNECTIONS = 32


def connection_limit(watched_resources: int, namespaces: int) -> int:
    """Two connections per watch stream (a stream being replaced overlaps its successor) plus the requests."""
    return 2 * watched_resources * max(1, namespaces) + REQUEST_CONNECTIONS


def make_login(limit: int):
    """A kopf login handler: kopf's own credentials, in a session of at most `limit` connections."""

    async def login_with_bounded_pool(logger: Any, settings: kopf.OperatorSettings, **kwargs: Any
                                      ) -> Optional[kopf.AiohttpSession]:
        info = kopf.login_via_client(logger=logger, settings=settings, **kwargs)
        if info is None:
            return None
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, ssl=info.as_ssl_context()),
            headers=info.as_http_headers(),
            auth=info.as_aiohttp_basic_auth(),
            proxy=info.proxy_url,
            trust_env=info.trust_env,
        )
        return kopf.AiohttpSession(server=info.server, default_namespace=info.default_namespace,
                                   expiration=info.expiration, aiohttp_session=session)

    return login_with_bounded_pool


def self_test() -> Optional[str]:
    """None when kopf takes a login handler's own aiohttp session; else what is missing."""
    session_class = getattr(kopf, "AiohttpSession", None)
    if session_class is None or not dataclasses.is_dataclass(session_class):
        return "kopf has no AiohttpSession (custom HTTP sessions from login handlers)"
    if "aiohttp_session" not in {f.name for f in dataclasses.fields(session_class)}:
        return "kopf's AiohttpSession takes no aiohttp_session"
    if not callable(getattr(kopf, "login_via_client", None)):
        return "kopf has no login_via_client"
    return None

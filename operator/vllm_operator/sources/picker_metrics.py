"""The endpoint picker's count of requests it found no pod for: what wakes a server scaled to zero.

The Gateway API Inference Extension's picker (v1.2.0) answers a request with 503 when its pool has no ready pod
(the director's "failed to find candidate pods") and counts it in
``inference_objective_request_error_total{error_code="ServiceUnavailable"}`` on its metrics port; that counter
rising while a server is at zero replicas is a request waiting to be served (docs/scale-to-zero.md). One bounded
GET (sources/fetch.py) of the picker's Service, never a byte of the answer into a status.
"""

from __future__ import annotations

from typing import Callable, Optional

from .. import builders
from . import fetch

UNSERVED_METRIC = "inference_objective_request_error_total"
UNSERVED_CODE = "ServiceUnavailable"
MAX_BYTES = 4 * 1024 * 1024


def picker_url(namespace: str, pool: str) -> str:
    """The picker's metrics, on its Service (builders.build_picker_service)."""
    return f"http://{builders.picker_name(pool)}.{namespace}.svc:{builders.PICKER_METRICS_PORT}/metrics"


def unserved(text: str) -> float:
    """Requests the picker answered 503 for (no pod to serve them), summed over its models."""
    total = 0.0
    needle = f'error_code="{UNSERVED_CODE}"'
    for line in text.splitlines():
        if line.startswith(UNSERVED_METRIC + "{") and needle in line:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                continue
    return total


class PickerSource:
    """Reads a pool's picker's unserved count; `url` maps (namespace, pool) to its metrics URL (tests point it at
    a picker process)."""

    def __init__(self, url: Callable[[str, str], str] = picker_url, timeout: float = 2.0):
        self.url = url
        self.timeout = timeout

    def read(self, namespace: str, pool: str) -> tuple[Optional[float], str]:
        """(the count, "") or (None, why not)."""
        url = self.url(namespace, pool)
        try:
            body = fetch.get(url, seconds=self.timeout, max_bytes=MAX_BYTES, accept="text/plain")
        except fetch.FetchError as e:
            return None, f"GET {url}: {e}"
        return unserved(body.decode("utf-8", "replace")), ""

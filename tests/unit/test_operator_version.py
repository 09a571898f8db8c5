"""The declared minimum Kubernetes version, checked when the operator starts.

The test bed runs one (current) Kubernetes, so an older API server is a fault no real part here can show: a
stand-in answers /version, and everything else of the start-up path is the real one.
"""

from __future__ import annotations

import pytest

from vllm_operator import api
from vllm_operator.operator_main import UnsupportedKubernetes, check_server_version


class _Version:
    def __init__(self, major: str, minor: str):
        self.answer = {"major": major, "minor": minor, "gitVersion": f"v{major}.{minor}.0"}

    def request(self, method: str, path: str, **_):
        assert (method, path) == ("GET", "/version")
        return self.answer


@pytest.mark.parametrize("minor", ["30", "31+", "37"])
def test_the_minimum_and_newer_are_accepted(minor):
    assert check_server_version(_Version("1", minor)) >= api.MIN_KUBERNETES_VERSION


@pytest.mark.parametrize("minor", ["20", "29", "29+"])
def test_an_older_api_server_is_refused_with_what_to_do(minor):
    with pytest.raises(UnsupportedKubernetes, match=r"Kubernetes 1\.29|Kubernetes 1\.20") as info:
        check_server_version(_Version("1", minor))
    assert "needs 1.30 or newer" in str(info.value)

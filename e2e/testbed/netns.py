"""A network namespace of its own for the calling thread, with pod addresses on its loopback interface.

The API server refuses loopback addresses in EndpointSlices ("may not be in the loopback range"), so the
pods the fake kubelet puts on 127.x.y.z never appear behind a Service. In a fresh network namespace any
address can be put on ``lo``: pods get addresses from a pod network (10.244.0.0/16 here) that the
endpointslice controller publishes, and every process or thread started from the calling thread while it
is inside (a control plane, the operator, vLLM, the fake kubelet's and the load's threads) reaches them.
Nothing of the host's network changes; the namespace goes away with the last process in it.

    with isolated_network(["10.244.0.10", "10.244.0.11"]):
        ...   # this thread, and what it starts from now on, live in the namespace

Needs CAP_SYS_ADMIN and CAP_NET_ADMIN (root); ``unavailable()`` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import shutil
import socket
import subprocess
from typing import Iterator, Optional, Sequence

CLONE_NEWNET = 0x40000000


def unavailable() -> Optional[str]:
    """Why a network namespace cannot be made here (None: it can)."""
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2's ip and util-linux's unshare"
    try:
        r = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare --net failed: {e}"
    if r.returncode != 0:
        return f"cannot make a network namespace (needs CAP_SYS_ADMIN and CAP_NET_ADMIN): {r.stderr.strip()}"
    return None


def _libc():
    return ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def isolated_network(addresses: Sequence[str]) -> Iterator[None]:
    """Move the calling thread into a new network namespace, lo up with `addresses` (/32 each); back on exit."""
    for a in addresses:
        if ipaddress.ip_address(a).is_loopback:
            raise ValueError(f"{a} is a loopback address: put pods on addresses the API server accepts")
    libc = _libc()
    host = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
        try:
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True, capture_output=True)
            for a in addresses:
                subprocess.run(["ip", "addr", "add", f"{a}/32", "dev", "lo"], check=True, capture_output=True)
            yield
        finally:
            if libc.setns(host, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns back to the host's network namespace: {os.strerror(err)}")
    finally:
        os.close(host)


def is_local(address: str) -> bool:
    """Whether `address` belongs to this host (in the calling thread's network namespace): it can be bound."""
    ip = ipaddress.ip_address(address)
    if ip.is_loopback:
        return True
    with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))
            return True
        except OSError:
            return False

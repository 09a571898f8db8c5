"""What the e2e process starters need: free ports, and a child that dies with its parent. (vllm_env.py keeps
its own copy: it also runs as a standalone script, the guard, where the e2e package is not importable.)"""

from __future__ import annotations

import ctypes
import socket

_PR_SET_PDEATHSIG = 1


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct TCP ports nothing listens on at `host` now (the caller binds them soon after). All n are held
    bound until all are chosen: a port let go may be handed out again at once, and one process given the same port
    twice (its gRPC and its health port) fails to bind the second."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now (the caller binds it soon after)."""
    return free_ports(1, host)[0]


def set_pdeathsig(sig: int) -> None:
    """prctl(PR_SET_PDEATHSIG) in a preexec_fn: the child gets `sig` when the thread that forked it ends."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:  # not Linux
        pass

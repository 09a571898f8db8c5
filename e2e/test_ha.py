"""Operator HA: two replicas with kopf peering, exactly one active; SIGKILL it and the other takes over.

The peering CRDs ship in crds/kopf-peering.yaml; `vllm-operator run --peering NAME` creates
its peering object when missing. Replica A (priority 200) is active, B (100) pauses; A is
killed with SIGKILL and B must resume within the keep-alive lifetime and converge a server
created after the kill. Only one replica acts at a time: the paused one logs no handler
run and no reconcile. The takeover time is reported.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
import time
from pathlib import Path

import pytest

from e2e.testbed.controlplane import wait_for
from e2e.testbed.convergence import (apply_server, example, server_doc, wait_converged)
from e2e.testbed.operator_process import ACTING, OperatorProcess
from tests.apiserver.test_peering import kube  # noqa: F401 - fixtures

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[1]
LIFETIME = 10  # seconds; the takeover after a SIGKILL waits at most this long
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def log_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def acting_lines(path: Path) -> list[str]:
    return [line for line in log_lines(path) if ACTING.search(line)]


def stamp(line: str) -> float:
    """Wall-clock seconds of a kopf log line ("[2026-11-30 00:08:26,580] ...", local time)."""
    m = _STAMP.match(line)
    assert m, line
    return dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def first_line(path: Path, needle: str) -> str | None:
    return next((line for line in log_lines(path) if needle in line), None)


def test_one_replica_acts_and_the_other_takes_over_after_sigkill(control_plane, kube, namespace, tmp_path,  # noqa: F811 - the fixture
                                                                 stress_report):
    name = f"ha-{secrets.token_hex(3)}"

    def replica(tag: str, priority: int) -> OperatorProcess:
        return OperatorProcess(control_plane.kubeconfig, tmp_path / f"operator-{tag}.log", resync_seconds=3,
                               extra_args=["--namespace", namespace, "--peering", name, "--peering-priority",
                                           str(priority), "--peering-lifetime", str(LIFETIME)])

    a, b = replica("a", 200), replica("b", 100)
    bases = [example("llama-8b-single-gpu.yaml"), example("qwen-7b-daemonset.yaml"),
             example("llama-3b-autoscaled.yaml")]
    final = {}
    try:
        a.start()
        final["first"] = server_doc("first", namespace, bases[0])
        apply_server(kube, final["first"])
        wait_converged(kube, namespace, final, timeout=90, what="A converges the first server")
        b.start()
        # B starts paused (peering is mandatory) and stays so once it sees A's higher priority: its
        # keep-alive joins A's in the peering object, and it logs nothing it does.
        peers_path = f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{name}"
        wait_for(lambda: len(kube.request("GET", peers_path).get("status") or {}) == 2, 60, "B's keep-alive")

        for i in range(4):
            final[f"s{i}"] = server_doc(f"s{i}", namespace, bases[i % len(bases)])
            apply_server(kube, final[f"s{i}"])
        final["first"]["spec"]["model"]["servedName"] = "changed-while-b-is-paused"
        apply_server(kube, final["first"])
        wait_converged(kube, namespace, final, timeout=90, what="A converges while B is paused")
        status = kube.request("GET", peers_path)["status"]
        assert sorted(p["priority"] for p in status.values()) == [100, 200], status
        assert acting_lines(a.log_path), "A never acted"
        assert acting_lines(b.log_path) == [], "B acted while A was active:\n" + "\n".join(acting_lines(b.log_path))
        # The autoscaler's loop (a kopf daemon per autoscaled server) runs in the active replica only.
        autoscaled = f"autoscaler started for {namespace}/s2"
        wait_for(lambda: first_line(a.log_path, autoscaled), 30, "A's autoscaler loop for s2")
        assert not first_line(b.log_path, "autoscaler started"), "B started an autoscaler loop while paused"

        # SIGKILL the active replica: no goodbye, B must wait out A's keep-alive and take over.
        killed_at = time.time()
        a.kill()
        final["after-kill"] = server_doc("after-kill", namespace, bases[1])
        apply_server(kube, final["after-kill"])
        final["s0"]["spec"]["model"]["servedName"] = "changed-after-the-kill"
        apply_server(kube, final["s0"])
        resumed = wait_for(lambda: first_line(b.log_path, "Resuming operations after the pause"), LIFETIME + 60,
                           "B resumes")
        takeover = stamp(resumed) - killed_at
        converge = wait_converged(kube, namespace, final, timeout=120, what="B converges after the takeover")
        converged_after_kill = time.time() - killed_at
        assert acting_lines(b.log_path), "B never acted after taking over"
        assert all(stamp(line) >= stamp(resumed) for line in acting_lines(b.log_path)), "B acted before resuming"
        assert takeover <= LIFETIME + 15, f"takeover took {takeover:.1f}s with a {LIFETIME}s keep-alive lifetime"
        # ... and moves with the takeover: B's loop starts only after B resumed, A's died with A.
        started = wait_for(lambda: first_line(b.log_path, autoscaled), 30, "B's autoscaler loop for s2")
        assert stamp(started) >= stamp(resumed)
    except BaseException:
        for p in (a, b):
            print(f"--- {p.log_path.name}\n{p.log_tail(60)}")
        raise
    finally:
        a.stop()
        b.stop()
    stress_report("ha", "takeover after SIGKILL of the active replica",
                  f"{takeover:.1f} s (keep-alive lifetime {LIFETIME} s)")
    stress_report("ha", "new server converged by the survivor", f"{converged_after_kill:.1f} s after the kill "
                  f"({converge:.1f} s after B resumed)")

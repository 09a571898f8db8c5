"""Crash safety: the operator converges after SIGKILLs at random moments and after an API-server outage.

A seeded script creates, updates (model, servedName, replicas, image, workload) and deletes
VLLMServers -- re-creating some deleted names, so old children must not be adopted or
left behind -- while the operator is killed with SIGKILL at random moments and started
again. Afterwards every server must converge (e2e/testbed/convergence.py): exactly the children
its last spec wants, up to date, nothing orphaned or duplicated, deleted servers gone.
The second test stops only the kube-apiserver (etcd keeps the data) for ~10 s mid-run:
the same operator process must recover on its own. The third deletes a child while the
kube-apiserver is down (in etcd itself): the operator must notice what kopf's re-listing
does not tell, and restore it.

CI-sized by default; `--long` (or VLLM_OPERATOR_LONG=1) runs more servers, operations and
kills. VLLM_OPERATOR_CRASH_SEED picks another script.
"""

from __future__ import annotations

import base64
import json
import os
import random
import threading
import time
import urllib.request
from typing import Any, Optional

import pytest

from e2e.testbed.controlplane import ControlPlane, wait_for
from e2e.testbed.convergence import (EXAMPLES, apply_server, delete_server, example, get_server, install_crd,
                             server_doc, wait_converged)
from e2e.testbed.operator_process import OperatorProcess
from vllm_operator import api, pipeline
from vllm_operator.kube.client import Kube

pytestmark = pytest.mark.apiserver

SEED = int(os.environ.get("VLLM_OPERATOR_CRASH_SEED", "20261130"))
#: The single-node examples without routing: a group (spec.nodes > 1) needs LeaderWorkerSet and spec.routing the
#: Inference Extension's CRDs, which this test's cluster does not serve (tests/apiserver/test_leaderworkerset.py and
#: test_routing_apiserver.py run the real ones).
BASES = {p.name: example(p.name) for p in EXAMPLES
         if (example(p.name)["spec"].get("nodes") or 1) == 1 and not example(p.name)["spec"].get("routing")}
MODELS = ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.2-3B-Instruct",
          "google/gemma-3-4b-it", "Qwen/Qwen2.5-32B-Instruct-AWQ"]


@pytest.fixture(scope="module")
def kube(control_plane) -> Kube:
    install_crd(control_plane)
    return Kube(control_plane.api_client())


def plans(doc: dict[str, Any]) -> bool:
    server = api.VLLMServer.model_validate(doc)
    return pipeline.plan_server(server.metadata.name, server.metadata.namespace, server.spec).fits


def mutate(rng: random.Random, doc: dict[str, Any]) -> dict[str, Any]:
    """A changed copy of `doc` that still plans (the spec change the operator must not lose)."""
    for _ in range(20):
        new = {**doc, "spec": {**doc["spec"]}}
        spec = new["spec"]
        what = rng.choice(["servedName", "replicas", "model", "image", "workload"])
        if what == "servedName":
            spec["model"] = {**spec["model"], "servedName": f"served-{rng.randrange(10**6)}"}
        elif what == "replicas" and spec.get("workload", "StatefulSet") == "StatefulSet":
            spec["replicas"] = rng.randrange(0, 4)
        elif what == "model":
            spec["model"] = {**spec["model"], "name": rng.choice(MODELS)}
            if "AWQ" in spec["model"]["name"]:
                spec["model"]["quantization"] = "awq_marlin"
            else:
                spec["model"].pop("quantization", None)
        elif what == "image":
            spec["image"] = f"vllm/vllm-openai:v0.32.{rng.randrange(1, 9)}"
        elif what == "workload":
            if spec.get("workload", "StatefulSet") == "StatefulSet":
                spec["workload"] = "DaemonSet"
                spec.pop("cache", None)  # a DaemonSet cannot make a claim per pod
                spec.pop("autoscaling", None)
                spec.pop("replicas", None)
            else:
                spec["workload"] = "StatefulSet"
        if spec != doc["spec"] and plans(new):
            return new
    return doc


def script(rng: random.Random, namespace: str, servers: int, operations: int) -> list[tuple[str, str, Any]]:
    """Seeded operations: ("apply", name, doc) or ("delete", name, None); creates first, then a mix."""
    names = [f"s{i:03d}" for i in range(servers)]
    bases = list(BASES.values())
    ops: list[tuple[str, str, Any]] = []
    state: dict[str, Optional[dict]] = {}
    for i, name in enumerate(names):
        state[name] = server_doc(name, namespace, bases[i % len(bases)])
        ops.append(("apply", name, state[name]))
    rng.shuffle(ops)
    for _ in range(operations):
        name = rng.choice(names)
        doc = state[name]
        roll = rng.random()
        if doc is None:  # re-create a deleted name: new uid, the old children must not be adopted
            state[name] = server_doc(name, namespace, rng.choice(bases))
            ops.append(("apply", name, state[name]))
        elif roll < 0.75:
            state[name] = mutate(rng, doc)
            ops.append(("apply", name, state[name]))
        else:
            state[name] = None
            ops.append(("delete", name, None))
    return ops


class Chaos(threading.Thread):
    """Kills the operator with SIGKILL after a random uptime, starts it again after a random pause.

    The operator dies with the thread that started it (PR_SET_PDEATHSIG follows the parent thread), so
    this thread stays until `stop` is set; `finished` says the schedule is through."""

    def __init__(self, operator: OperatorProcess, rng: random.Random, kills: int,
                 uptime: tuple[float, float] = (1.0, 5.0), downtime: tuple[float, float] = (0.0, 1.5)):
        super().__init__(daemon=True, name="chaos")
        self.operator, self.kills = operator, kills
        self.schedule = [(rng.uniform(*uptime), rng.uniform(*downtime)) for _ in range(kills)]
        self.done = 0
        self.stop = threading.Event()
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            for up, down in self.schedule:
                if self.stop.wait(up):
                    break
                self.operator.kill()
                self.done += 1
                self.stop.wait(down)
                self.operator.start()
        finally:
            self.finished.set()
        self.stop.wait()
        self.operator.stop()


def run_script(kube: Kube, namespace: str, ops: list[tuple[str, str, Any]]) -> None:
    for verb, name, doc in ops:
        if verb == "apply":
            # A server deleted a moment ago may still be terminating (its finalizer is released
            # only by a running operator): the re-create waits until the name is free.
            wait_for(lambda: _apply_unless_terminating(kube, doc), 120, f"re-create {name}", interval=0.2)
        else:
            delete_server(kube, namespace, name)


def _apply_unless_terminating(kube: Kube, doc: dict[str, Any]) -> bool:
    m = doc["metadata"]
    live = get_server(kube, m["namespace"], m["name"])
    if live is not None and live["metadata"].get("deletionTimestamp"):
        return False
    apply_server(kube, doc)
    return True


def final_state(ops: list[tuple[str, str, Any]]) -> dict[str, Optional[dict]]:
    final: dict[str, Optional[dict]] = {}
    for verb, name, doc in ops:
        final[name] = doc if verb == "apply" else None
    return final


def test_sigkill_at_random_moments_converges(control_plane, kube, namespace, tmp_path, long_mode, stress_report):
    rng = random.Random(SEED)
    servers, operations, kills = (400, 1200, 30) if long_mode else (200, 250, 6)
    ops = script(rng, namespace, servers, operations)
    operator = OperatorProcess(control_plane.kubeconfig, tmp_path / "operator.log", resync_seconds=5,
                               extra_args=["--namespace", namespace])
    chaos = Chaos(operator, rng, kills)
    t0 = time.monotonic()
    try:
        chaos.operator.start()
        chaos.start()
        run_script(kube, namespace, ops)
        assert chaos.finished.wait(timeout=kills * 10), "the kill schedule did not finish"
        assert chaos.done == kills, f"only {chaos.done}/{kills} kills happened"
        assert operator.alive(), operator.log_tail()
        seconds = wait_converged(kube, namespace, final_state(ops), timeout=240 if not long_mode else 900,
                                 what=f"convergence after {kills} SIGKILLs")
    except BaseException:
        print(operator.log_tail(80))
        raise
    finally:
        chaos.stop.set()
        chaos.join(timeout=30)
        operator.stop()
    final = final_state(ops)
    stress_report("crash", "seed", SEED)
    stress_report("crash", "operations (creates, updates, deletes)",
                  f"{len(ops)} on {servers} servers, {sum(d is not None for d in final.values())} live at the end")
    stress_report("crash", "SIGKILLs survived", chaos.done)
    stress_report("crash", "convergence after the last restart", f"{seconds:.1f} s (run {time.monotonic() - t0:.0f} s)")


def test_apiserver_outage_recovers_without_restart(control_plane, tmp_path, long_mode, stress_report):
    if not isinstance(control_plane, ControlPlane):
        pytest.skip("needs the local control plane (stops and starts its kube-apiserver)")
    # A control plane of its own: stopping and restarting a kube-apiserver is the fault under test, and a
    # restart that fails must not take the session's control plane (and every later test) down with it.
    with ControlPlane(workdir=tmp_path / "cp") as own:
        install_crd(own)
        kube = Kube(own.api_client())
        namespace = "outage"
        own.kubectl("create", "namespace", namespace)
        _outage_run(own, kube, namespace, tmp_path, long_mode, stress_report)


def _outage_run(control_plane, kube, namespace, tmp_path, long_mode, stress_report):
    rng = random.Random(SEED + 1)
    servers, operations = (120, 300) if long_mode else (40, 60)
    ops = script(rng, namespace, servers, operations)
    half = len(ops) // 2
    operator = OperatorProcess(control_plane.kubeconfig, tmp_path / "operator.log", resync_seconds=5,
                               extra_args=["--namespace", namespace]).start()
    pid = operator.proc.pid
    try:
        run_script(kube, namespace, ops[:half])
        # Mid-run: the operator is up and busy with the first half when the API server goes away.
        wait_for(lambda: any((get_server(kube, namespace, name) or {}).get("status") for _, name, doc in ops[:half]
                             if doc is not None), 120, "the operator at work")
        control_plane.stop_apiserver()
        down = time.monotonic()
        outage = 10.0
        time.sleep(outage)  # the fault itself: ~10 s without an API server (etcd keeps the data)
        control_plane.start_apiserver()
        outage = time.monotonic() - down
        run_script(kube, namespace, ops[half:])
        seconds = wait_converged(kube, namespace, final_state(ops), timeout=240,
                                 what="convergence after the API-server outage")
        assert operator.alive() and operator.proc.pid == pid, "the operator had to be restarted"
    except BaseException:
        print(operator.log_tail(80))
        raise
    finally:
        operator.stop()
    stress_report("apiserver outage", "outage", f"{outage:.1f} s, same operator process (pid {pid})")
    stress_report("apiserver outage", "convergence after the outage", f"{seconds:.1f} s for {len(ops)} operations")


def _etcd(control_plane, path: str, body: dict[str, str]) -> dict[str, Any]:
    """etcd's own v3 JSON gateway: how a write lands while no kube-apiserver is there to see it."""
    request = urllib.request.Request(control_plane.etcd_url + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_a_child_deleted_while_the_watch_was_down_is_restored(tmp_path):
    """kopf re-lists after its watch comes back with "410 Gone" (a restarted kube-apiserver) and never
    tells an index that an object vanished in the gap. The operator's cache audit must notice, or the
    stale entry hides the deletion from every later reconcile and the child is never restored.
    The deletion is written to etcd directly while the kube-apiserver is down: the one way to delete
    an object without any watch seeing it."""
    with ControlPlane(workdir=tmp_path / "cp") as cp:
        install_crd(cp)
        kube, namespace = Kube(cp.api_client()), "gap"
        cp.kubectl("create", "namespace", namespace)
        operator = OperatorProcess(cp.kubeconfig, tmp_path / "operator.log", resync_seconds=3,
                                   extra_args=["--namespace", namespace]).start()
        try:
            for name in ("a", "b"):
                apply_server(kube, server_doc(name, namespace, BASES["llama-8b-single-gpu.yaml"]))
            wait_for(lambda: all(kube.get("apps/v1", "StatefulSet", namespace, n) for n in ("a", "b")), 90,
                     "both StatefulSets")
            before = kube.get("apps/v1", "StatefulSet", namespace, "a")["metadata"]["uid"]
            cp.stop_apiserver()
            deleted = _etcd(cp, "/v3/kv/deleterange", {"key": _b64(f"/registry/statefulsets/{namespace}/a")})
            assert deleted.get("deleted") == "1", deleted
            for i in range(5):  # later revisions than any the operator saw: its watch resumes with 410 Gone
                _etcd(cp, "/v3/kv/put", {"key": _b64(f"/test/gap/{i}"), "value": _b64("x")})
            cp.start_apiserver()
            # The operator may restore it before this process sees the API server ready (it did, with three
            # suites on 2 cores): the restored StatefulSet is a new object, so the proof is its uid.
            def recreated():
                sts = kube.get("apps/v1", "StatefulSet", namespace, "a")
                return sts is not None and sts["metadata"]["uid"] != before

            wait_for(recreated, 90, "the StatefulSet deleted during the outage restored (a new uid)")
            log = operator.log_tail(100000)
            assert f"StatefulSet {namespace}/a was deleted while the watch was down" in log
            assert f"StatefulSet {namespace}/b was deleted" not in log
            assert operator.alive()
        except BaseException:
            print(operator.log_tail(80))
            raise
        finally:
            operator.stop()

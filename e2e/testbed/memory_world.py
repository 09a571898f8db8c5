"""One VLLMServer reconciled by the real Reconciler against an in-memory API, for tests of the status
it writes (tests/artefacts/test_argocd_health.py, tests/unit/test_reconcile_pure.py) without a cluster."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Optional

import yaml

from vllm_operator.controller.reconcile import Reconciler
from vllm_operator.kube.client import ApiError

ROOT = Path(__file__).resolve().parents[2]
NS = "team"


class MemoryKube:
    """Just enough of kube.Kube for the Reconciler: objects in a dict, apply merges, events counted."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []

    def get(self, api_version, kind, namespace, name):
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def list(self, api_version, kind, namespace, *, label_selector=None):
        wanted = dict(kv.split("=", 1) for kv in label_selector.split(",")) if label_selector else {}
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items() if k == kind and ns == namespace
                and all((o["metadata"].get("labels") or {}).get(a) == b for a, b in wanted.items())]

    def apply(self, obj, *, subresource=None, field_manager=None):
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        if subresource == "status":
            self.objects[key]["status"] = copy.deepcopy(obj["status"])
        else:
            live = self.objects.setdefault(key, {"status": {}})
            live.update(copy.deepcopy(obj))
            live["metadata"].setdefault("uid", f"uid-{key[2]}")
            live["metadata"].setdefault("generation", 1)
        return copy.deepcopy(self.objects[key])

    def delete(self, api_version, kind, namespace, name, *, uid=None):
        return self.objects.pop((kind, namespace, name), None) is not None

    def request(self, method, path, *, body=None, **_):
        """Events only: each recording (a new Event, or one counted on: kube/events.py) is kept in order."""
        assert "/events" in path and method in ("POST", "PATCH"), (method, path)
        if method == "POST":
            self.events.append(body)
            return body
        name = path.rsplit("/", 1)[-1]
        posted = next((e for e in reversed(self.events) if e["metadata"]["name"] == name), None)
        if posted is None:  # posted by an earlier World (the events module remembers its names)
            raise ApiError(404, "not found", method, path)
        self.events.append({**copy.deepcopy(posted), **body})
        return self.events[-1]


class World:
    """One VLLMServer, its children and pods, reconciled by the real Reconciler."""

    def __init__(self, spec_changes: Optional[dict] = None, example: str = "llama-8b-single-gpu.yaml", *,
                 read_events: bool = False, now: str = "2026-01-01T00:00:00Z"):
        self.kube = MemoryKube()
        self.now = now
        self.reconciler = Reconciler(self.kube, clock=lambda: self.now)  # type: ignore[arg-type]
        #: Events the cluster's controllers and kubelet wrote; the Reconciler reads them when read_events.
        self.cluster_events: list[dict[str, Any]] = []
        #: The objects each read of Events asked about (kind/name).
        self.event_reads: list[list[str]] = []
        if read_events:
            self.reconciler.events_of = self.events_about
        doc = yaml.safe_load((ROOT / "examples" / example).read_text())
        doc["metadata"] = {"name": "srv", "namespace": NS, "uid": "uid-srv", "generation": 1}
        doc["spec"].update(spec_changes or {})
        self.kube.objects[("VLLMServer", NS, "srv")] = doc

    @property
    def server(self) -> dict[str, Any]:
        return self.kube.get(None, "VLLMServer", NS, "srv")

    def change_spec(self, **changes) -> None:
        srv = self.kube.objects[("VLLMServer", NS, "srv")]
        srv["spec"].update(changes)
        srv["metadata"]["generation"] += 1

    def reconcile(self) -> dict[str, Any]:
        self.reconciler.reconcile(NS, "srv")
        return self.server

    def workload_reports(self, ready: int, *, updated: Optional[int] = None, desired: Optional[int] = None) -> None:
        """What the StatefulSet, DaemonSet or LeaderWorkerSet controller would write into the workload's status
        (a LeaderWorkerSet's counts are groups)."""
        for kind in ("StatefulSet", "DaemonSet", "LeaderWorkerSet"):
            w = self.kube.objects.get((kind, NS, "srv"))
            if w is None:
                continue
            want = w["spec"].get("replicas", 1) if desired is None else desired
            done = want if updated is None else updated
            if kind == "StatefulSet":
                w["status"] = {"observedGeneration": w["metadata"]["generation"], "replicas": want,
                               "readyReplicas": ready, "updatedReplicas": done,
                               "currentRevision": "r1", "updateRevision": "r1" if done >= want else "r2"}
            elif kind == "LeaderWorkerSet":
                w["status"] = {"observedGeneration": w["metadata"]["generation"], "replicas": want,
                               "readyReplicas": ready, "updatedReplicas": done}
            else:
                w["status"] = {"observedGeneration": 1, "desiredNumberScheduled": want, "numberReady": ready,
                               "updatedNumberScheduled": done}

    def crash_loop(self) -> None:
        self.kube.objects[("Pod", NS, "srv-0")] = {
            "metadata": {"name": "srv-0", "namespace": NS,
                         "labels": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": "srv"}},
            "status": {"containerStatuses": [{
                "name": "vllm", "restartCount": 5, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "message": "torch.OutOfMemoryError: CUDA out of memory"}},
            }]},
        }

    def add_pod(self, name: str = "srv-0", *, status: Optional[dict] = None) -> None:
        """A pod of the server as the API returns it: the container the operator built, the given status."""
        sts = self.kube.objects.get(("StatefulSet", NS, "srv")) or self.kube.objects[("DaemonSet", NS, "srv")]
        template = copy.deepcopy(sts["spec"]["template"])
        self.kube.objects[("Pod", NS, name)] = {
            "metadata": {**template["metadata"], "name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": template["spec"], "status": status or {"phase": "Pending"}}

    def events_about(self, namespace: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        names = [f"{o.get('kind', 'Pod')}/{o['metadata']['name']}" for o in objects]
        self.event_reads.append(names)
        return [copy.deepcopy(e) for e in self.cluster_events
                if f"{e['involvedObject']['kind']}/{e['involvedObject']['name']}" in names]

    def warning_events(self) -> list[tuple[str, str]]:
        """The (reason, message) of the Warning Events the operator posted about the server."""
        return [(e["reason"], e["message"]) for e in self.kube.events if e["type"] == "Warning"]

"""Play scheduler + kubelet for a control plane that has neither.

``FakeKubelet`` registers a Node (with GPUs in its allocatable resources), then
polls pods every ``interval`` seconds and:

* binds unscheduled pods to its node through the Binding API (pods whose
  ``nodeSelector`` does not match the node's labels, or for which ``unschedulable(pod)`` returns the
  scheduler's message, stay Pending, marked ``PodScheduled=False/Unschedulable``, as a scheduler would
  leave them);
* "starts" pods bound to its node: gives each a unique IP from a 127.0.0.0/8
  pool, calls ``on_pod_start(pod, ip)`` (a test may start a real process on that
  IP; a bool return decides readiness), then patches the pod status to Running
  with the Ready condition; a pod's readinessGates hold Ready at False (ContainersReady True) until every
  gate's condition is True, as a kubelet does, and conditions of other types (a gate's) are left as they are;
* restarts a pod's containers when told (``restart_container``: the container exited): restartCount + 1,
  lastState terminated, not ready until ``set_ready`` again;
* finalises pods being deleted. By default at once, as for a forced deletion: no preStop hook,
  ``on_pod_stop(pod, ip)`` (the containers killed), then the pod deleted with grace period 0
  (there is no kubelet to finish a graceful deletion, so StatefulSet scale-down would otherwise
  hang). With ``graceful=True`` as a kubelet terminates a pod, in a thread per terminating pod
  so the loop keeps serving the others: the containers' preStop hooks (only ``sleep N``, as an
  exec command or the sleep action: the hook's own wait; nothing else is executed), then
  ``on_pod_stop(pod, ip, grace)`` where ``grace`` is the deletion's grace period
  (``deletionGracePeriodSeconds``, else ``terminationGracePeriodSeconds``) less the time the
  hooks took, at least 2 s (the kubelet's minimum): the container runtime's stop, SIGTERM and
  SIGKILL once ``grace`` is over; then the pod is deleted with grace period 0 (preconditions on
  its uid). The pod keeps its IP until then. ``terminations`` records each one's timeline;
* releases the IPs of pods that are gone;
* reports a container failure the way a kubelet does when ``faults(pod)`` returns a ``Fault``
  for a new pod (an image it cannot pull, an OOM kill, a crash loop with its termination
  message, a startup probe's kill): that container status, never Ready, and the kubelet's
  Events about the pod.

Pods are kubernetes client model objects (``V1Pod``) in the callbacks.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import logging
import random
import socket
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)

DEFAULT_GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"

OnPodStart = Callable[[client.V1Pod, str], Optional[bool]]
OnPodStop = Callable[..., None]
"""``(pod, ip)``: the pod's containers are gone, kill what is left at once (a forced deletion, a pod that vanished,
the kubelet's own stop). A graceful termination calls ``(pod, ip, grace_seconds)``: stop the containers as a
container runtime does, SIGTERM, then SIGKILL once ``grace_seconds`` are over (0 when the kubelet is stopping)."""

#: The kubelet's minimumGracePeriodInSeconds: what is left for SIGTERM -> SIGKILL after the preStop hooks.
MIN_GRACE_SECONDS = 2
DEFAULT_GRACE_SECONDS = 30


@dataclass
class Termination:
    """One pod's termination as this kubelet ran it (``time.monotonic()`` instants)."""

    namespace: str
    name: str
    uid: str
    ip: Optional[str]
    seen_at: float
    """When the kubelet saw the deletionTimestamp."""
    graceful: bool
    grace_seconds: float = 0.0
    """The deletion's grace period."""
    prestop_seconds: float = 0.0
    """What the preStop hooks asked to wait (``sleep N``)."""
    stop_at: Optional[float] = None
    """on_pod_stop called (the SIGTERM)."""
    stop_grace: Optional[float] = None
    """The grace on_pod_stop was given."""
    stopped_at: Optional[float] = None
    deleted_at: Optional[float] = None
    errors: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.deleted_at is not None


@dataclass(frozen=True)
class Fault:
    """What a kubelet reports for a pod whose first container fails: the containerStatus fields beyond name
    and image (state, lastState, restartCount), the pod's phase, and the Events it posts about the pod as
    (type, reason, message)."""

    container: dict[str, Any]
    events: tuple[tuple[str, str, str], ...] = ()
    phase: str = "Running"


def _gates_true(pod: client.V1Pod) -> bool:
    """Every readiness gate of the pod has its condition True (a kubelet's Ready needs them all)."""
    conditions = {c.type: c.status for c in (pod.status.conditions or [])}
    return all(conditions.get(g.condition_type) == "True" for g in pod.spec.readiness_gates or [])


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def free_loopback_ips(n: int, port: int = 8000) -> list[str]:
    """n addresses of a random 127.x.y.0/24 where nothing listens on `port` (test runs share the host): an
    ip_pool for pods whose on_pod_start serves on their own address."""
    def free(ip: str) -> bool:
        with socket.socket() as s:
            try:
                s.bind((ip, port))
                return True
            except OSError:
                return False

    for _ in range(50):
        base = f"127.{random.randint(100, 250)}.{random.randint(1, 254)}"
        ips = [f"{base}.{10 + i}" for i in range(n)]
        if all(free(ip) for ip in ips):
            return ips
    raise RuntimeError("no free loopback addresses")


def _default_ip_pool() -> list[str]:
    return [f"127.0.0.{i}" for i in range(10, 255)]


class _PodState:
    __slots__ = ("uid", "namespace", "name", "ip", "ready", "reported_ready", "pod", "restarts", "started_at")

    def __init__(self, pod: client.V1Pod, ip: str):
        self.uid = pod.metadata.uid
        self.namespace = pod.metadata.namespace
        self.name = pod.metadata.name
        self.ip = ip
        self.ready = False
        #: (containers ready, pod Ready, restarts) as last patched.
        self.reported_ready: Optional[tuple[bool, bool, int]] = None
        self.pod = pod
        self.restarts = 0
        self.started_at: Optional[str] = None  # the running container's start, after a restart


class FakeKubelet:
    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: Optional[str] = None,
        node_name: str = "fake-node-1",
        ip_pool: Optional[Iterable[str]] = None,
        on_pod_start: Optional[OnPodStart] = None,
        on_pod_stop: Optional[OnPodStop] = None,
        auto_ready: bool = True,
        *,
        gpu_product: str = DEFAULT_GPU_PRODUCT,
        gpus: int = 8,
        cpu: str = "64",
        memory: str = "512Gi",
        labels: Optional[dict[str, str]] = None,
        interval: float = 0.3,
        delete_node_on_stop: bool = True,
        faults: Optional[Callable[[client.V1Pod], Optional[Fault]]] = None,
        graceful: bool = False,
        unschedulable: Optional[Callable[[client.V1Pod], Optional[str]]] = None,
    ):
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.node_name = node_name
        self.ip_pool = list(ip_pool) if ip_pool is not None else _default_ip_pool()
        if not self.ip_pool:
            raise ValueError("empty ip_pool")
        self.on_pod_start = on_pod_start
        self.on_pod_stop = on_pod_stop
        self.faults = faults
        #: The scheduler's message for a pod it cannot place for a reason beyond the node selector (its requests
        #: do not fit what is left on the node, say), or None: such a pod stays Pending, PodScheduled=False.
        self.unschedulable = unschedulable
        self._faulted: set[str] = set()  # uids reported failing: left as reported
        self.auto_ready = auto_ready
        #: Terminate pods as a kubelet does (preStop, SIGTERM, SIGKILL after the grace period); may be changed
        #: between deletions.
        self.graceful = graceful
        self.terminations: dict[str, Termination] = {}  # uid -> its termination
        self._terminating: dict[str, threading.Thread] = {}  # uid -> the thread terminating it
        self.interval = interval
        self.delete_node_on_stop = delete_node_on_stop
        self.node_labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.product": gpu_product,
            "nvidia.com/gpu.count": str(gpus),
            **(labels or {}),
        }
        self.capacity = {
            "cpu": cpu,
            "memory": memory,
            "pods": "110",
            "ephemeral-storage": "500Gi",
            "nvidia.com/gpu": str(gpus),
        }
        self.errors: list[str] = []  # exceptions seen in the loop / callbacks
        self._pods: dict[str, _PodState] = {}  # uid -> state
        self._ips_in_use: set[str] = set()
        self._ip_cycle = itertools.cycle(self.ip_pool)
        self._desired_ready: dict[tuple[str, str], bool] = {}
        self._unschedulable_marked: set[str] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._last_heartbeat = 0.0

    # ------------------------------------------------------------------ API
    def start(self) -> "FakeKubelet":
        if self._thread is not None:
            return self
        self._register_node()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"fakekubelet-{self.node_name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=30)
        self._thread = None
        # Terminations in progress cut their preStop short and stop their containers with no grace.
        for t in list(self._terminating.values()):
            t.join(timeout=60)
        with self._lock:
            for st in list(self._pods.values()):
                self._call_stop(st)
            self._pods.clear()
            self._ips_in_use.clear()
        if self.delete_node_on_stop:
            try:
                self.core.delete_node(self.node_name)
            except ApiException as e:
                if e.status != 404:
                    raise

    def __enter__(self) -> "FakeKubelet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def set_ready(self, namespace: str, name: str, ready: bool) -> None:
        """Flip a pod's Ready condition (applied within one poll interval)."""
        with self._lock:
            self._desired_ready[(namespace, name)] = ready
            for st in self._pods.values():
                if st.namespace == namespace and st.name == name:
                    st.ready = ready

    def restart_container(self, namespace: str, name: str) -> bool:
        """The pod's containers exited and are started again, as a kubelet restarts them: restartCount + 1, the
        last state terminated, not ready until ``set_ready(..., True)`` (applied within one poll interval).
        False when the kubelet runs no such pod."""
        with self._lock:
            for st in self._pods.values():
                if st.namespace == namespace and st.name == name:
                    st.restarts += 1
                    st.started_at = _now()
                    st.ready = False
                    self._desired_ready[(namespace, name)] = False
                    return True
        return False

    def pod_ip(self, namespace: str, name: str) -> Optional[str]:
        with self._lock:
            for st in self._pods.values():
                if st.namespace == namespace and st.name == name:
                    return st.ip
        return None

    @property
    def running_pods(self) -> dict[tuple[str, str], str]:
        """(namespace, name) -> IP of the pods this kubelet runs."""
        with self._lock:
            return {(s.namespace, s.name): s.ip for s in self._pods.values()}

    # ------------------------------------------------------------ the node
    def _node_body(self) -> dict:
        now = _now()
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": dict(self.node_labels)},
            "spec": {},
            "status": self._node_status(now),
        }

    def _node_status(self, now: str) -> dict:
        return {
            "capacity": dict(self.capacity),
            "allocatable": dict(self.capacity),
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node_name},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "fake kubelet is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "",
                "containerRuntimeVersion": "fake://1.0",
                "kernelVersion": "",
                "kubeProxyVersion": "v1.20.2",
                "kubeletVersion": "v1.20.2",
                "machineID": "",
                "operatingSystem": "linux",
                "osImage": "fake",
                "systemUUID": "",
            },
        }

    def _register_node(self) -> None:
        try:
            self.core.create_node(self._node_body())
        except ApiException as e:
            if e.status != 409:
                raise
            self.core.patch_node(self.node_name, {"metadata": {"labels": dict(self.node_labels)}})
        # Status on create is kept for nodes, but patch it too (existing node).
        self.core.patch_node_status(self.node_name, {"status": self._node_status(_now())})
        self._last_heartbeat = time.monotonic()

    def _heartbeat(self) -> None:
        if time.monotonic() - self._last_heartbeat < 10:
            return
        self._last_heartbeat = time.monotonic()
        now = _now()
        self.core.patch_node_status(
            self.node_name,
            {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now}]}},
        )

    # ------------------------------------------------------------- the loop
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
                self._heartbeat()
            except Exception as e:  # noqa: BLE001 - a kubelet keeps going
                self._record(f"sync failed: {e!r}")
            self._stop.wait(self.interval)

    def _record(self, msg: str) -> None:
        log.warning("fakekubelet %s: %s", self.node_name, msg)
        self.errors.append(msg)
        del self.errors[:-100]

    def _list_pods(self) -> list[client.V1Pod]:
        if self.namespace:
            return self.core.list_namespaced_pod(self.namespace).items
        return self.core.list_pod_for_all_namespaces().items

    def _sync(self) -> None:
        pods = self._list_pods()
        seen: set[str] = set()
        for pod in pods:
            if self._stop.is_set():
                return
            uid = pod.metadata.uid
            seen.add(uid)
            node = pod.spec.node_name
            if node and node != self.node_name:
                continue
            try:
                if pod.metadata.deletion_timestamp is not None:
                    self._terminate(pod)
                elif not node:
                    refused = self.unschedulable(pod) if self.unschedulable is not None else None
                    if refused is None and self._schedulable(pod):
                        self._bind(pod)
                        self._run_pod(pod)
                    else:
                        self._mark_unschedulable(pod, refused)
                elif pod.status.phase in ("Succeeded", "Failed"):
                    continue
                else:
                    self._run_pod(pod)
            except ApiException as e:
                if e.status in (404, 409):  # gone or changed meanwhile: next round
                    continue
                self._record(f"{pod.metadata.namespace}/{pod.metadata.name}: {e.status} {e.reason}: {e.body}")
        with self._lock:
            for uid in [u for u in self._pods if u not in seen and u not in self._terminating]:
                self._call_stop(self._pods.pop(uid))
            self._unschedulable_marked &= seen

    # ------------------------------------------------------------ pod steps
    def _schedulable(self, pod: client.V1Pod) -> bool:
        sel = pod.spec.node_selector or {}
        return all(self.node_labels.get(k) == v for k, v in sel.items())

    def _mark_unschedulable(self, pod: client.V1Pod, message: Optional[str] = None) -> None:
        if pod.metadata.uid in self._unschedulable_marked:
            return
        self.core.patch_namespaced_pod_status(
            pod.metadata.name,
            pod.metadata.namespace,
            {
                "status": {
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": message or f"0/1 nodes are available: node {self.node_name} didn't match "
                                                  "Pod's node affinity/selector.",
                            "lastTransitionTime": _now(),
                        }
                    ]
                }
            },
        )
        self._unschedulable_marked.add(pod.metadata.uid)

    def _bind(self, pod: client.V1Pod) -> None:
        body = client.V1Binding(
            api_version="v1",
            kind="Binding",
            metadata=client.V1ObjectMeta(name=pod.metadata.name, uid=pod.metadata.uid),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.node_name),
        )
        # _preload_content=False: the client cannot deserialise the Binding
        # response (a Status) into V1Binding.
        r = self.core.create_namespaced_binding(pod.metadata.namespace, body, _preload_content=False)
        if hasattr(r, "release_conn"):
            r.read()
            r.release_conn()
        pod.spec.node_name = self.node_name

    def _allocate_ip(self) -> str:
        for _ in range(len(self.ip_pool)):
            ip = next(self._ip_cycle)
            if ip not in self._ips_in_use:
                self._ips_in_use.add(ip)
                return ip
        raise RuntimeError(f"fakekubelet {self.node_name}: IP pool exhausted ({len(self.ip_pool)} addresses)")

    def _run_pod(self, pod: client.V1Pod) -> None:
        uid = pod.metadata.uid
        key = (pod.metadata.namespace, pod.metadata.name)
        if uid in self._faulted:
            return
        fault = self.faults(pod) if self.faults is not None else None
        if fault is not None:
            self._report_fault(pod, fault)
            self._faulted.add(uid)
            return
        with self._lock:
            st = self._pods.get(uid)
            new = st is None
            if new:
                st = _PodState(pod, self._allocate_ip())
                self._pods[uid] = st
            st.pod = pod
        if new:
            ready: Optional[bool] = None
            if self.on_pod_start is not None:
                try:
                    ready = self.on_pod_start(pod, st.ip)
                except Exception as e:  # noqa: BLE001
                    self._record(f"on_pod_start {key[0]}/{key[1]} raised {e!r}")
                    ready = False
            with self._lock:
                if key in self._desired_ready:
                    st.ready = self._desired_ready[key]
                else:
                    st.ready = self.auto_ready if ready is None else bool(ready)
        # What is patched is what is recorded as reported: set_ready() from another thread during
        # the patch must leave them different, so the next sync sends the new value (recording
        # st.ready after the call lost such an update and left a pod NotReady for good).
        ready = st.ready
        reported = (ready, ready and _gates_true(pod), st.restarts)
        if st.reported_ready == reported and not new and pod.status.phase == "Running":
            return
        self._patch_running(pod, st, ready, reported[1])
        st.reported_ready = reported

    def _report_fault(self, pod: client.V1Pod, fault: Fault) -> None:
        now = _now()
        first, *others = pod.spec.containers
        statuses = [{"name": first.name, "image": first.image or "", "imageID": "", "ready": False,
                     "started": False, **fault.container}]
        statuses += [{"name": c.name, "image": c.image or "", "imageID": "", "ready": False, "restartCount": 0,
                      "state": {"running": {"startedAt": now}}} for c in others]
        status = {"phase": fault.phase, "hostIP": "127.0.0.1", "startTime": now, "containerStatuses": statuses,
                  "conditions": [{"type": t, "status": v, "lastTransitionTime": now} for t, v in (
                      ("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", "False"),
                      ("Ready", "False"))]}
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})
        for type_, reason, message in fault.events:
            self.core.create_namespaced_event(pod.metadata.namespace, {
                "metadata": {"generateName": f"{pod.metadata.name}."},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
                                   "namespace": pod.metadata.namespace, "uid": pod.metadata.uid,
                                   "fieldPath": f"spec.containers{{{first.name}}}"},
                "reason": reason, "message": message, "type": type_, "count": 1,
                "firstTimestamp": now, "lastTimestamp": now,
                "source": {"component": "kubelet", "host": self.node_name}})

    def _patch_running(self, pod: client.V1Pod, st: _PodState, is_ready: bool, pod_ready: bool) -> None:
        now = _now()
        ready = "True" if is_ready else "False"
        started = pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ") if pod.status.start_time else now

        def cond(t: str, s: str, reason: Optional[str] = None) -> dict:
            out = {"type": t, "status": s, "lastProbeTime": None, "lastTransitionTime": now}
            return out | ({"reason": reason} if reason else {})

        def running(c: client.V1Container) -> dict:
            return {
                "name": c.name,
                "image": c.image or "",
                "imageID": f"fake://{c.image or ''}",
                "containerID": f"fake://{st.uid}/{c.name}",
                "ready": is_ready,
                "started": True,
                "restartCount": st.restarts,
                "state": {"running": {"startedAt": st.started_at or started}},
                **({"lastState": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": started,
                                                 "finishedAt": st.started_at}}} if st.restarts else {}),
            }

        def completed(c: client.V1Container) -> dict:
            return {
                "name": c.name,
                "image": c.image or "",
                "imageID": f"fake://{c.image or ''}",
                "containerID": f"fake://{st.uid}/{c.name}",
                "ready": True,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": started}},
            }

        status = {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": st.ip,
            "podIPs": [{"ip": st.ip}],
            "startTime": started,
            "conditions": [
                cond("PodScheduled", "True"),
                cond("Initialized", "True"),
                cond("ContainersReady", ready),
                cond("Ready", "True" if pod_ready else "False",
                     "ReadinessGatesNotReady" if is_ready and not pod_ready else None),
            ],
            "containerStatuses": [running(c) for c in pod.spec.containers],
        }
        if pod.spec.init_containers:
            status["initContainerStatuses"] = [completed(c) for c in pod.spec.init_containers]
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})

    def _terminate(self, pod: client.V1Pod) -> None:
        uid = pod.metadata.uid
        with self._lock:
            if uid in self._terminating:
                return  # its thread is at it
            st = self._pods.get(uid)
            rec = self.terminations.get(uid)
            if rec is None:
                rec = self.terminations[uid] = Termination(pod.metadata.namespace, pod.metadata.name, uid,
                                                           st.ip if st else None, time.monotonic(), self.graceful)
            if self.graceful and st is not None:
                thread = threading.Thread(target=self._terminate_gracefully, args=(pod, st, rec), daemon=True,
                                          name=f"fakekubelet-terminate-{pod.metadata.name}")
                self._terminating[uid] = thread
                thread.start()
                return
        # At once: forced, or no container of ours runs (nothing to wait for).
        self._finalise(pod)
        rec.deleted_at = rec.deleted_at or time.monotonic()

    def _grace(self, pod: client.V1Pod) -> float:
        for g in (pod.metadata.deletion_grace_period_seconds, pod.spec.termination_grace_period_seconds):
            if g is not None:
                return float(g)
        return float(DEFAULT_GRACE_SECONDS)

    def _prestop_seconds(self, pod: client.V1Pod, rec: Termination) -> float:
        """How long the containers' preStop hooks take: each runs in parallel with the others, so the longest.
        Only a sleep is honoured (``sleep N`` as the exec command, or the sleep action); anything else would be a
        command in a container this kubelet does not have, so it is recorded and not run."""
        longest = 0.0
        for c in pod.spec.containers or []:
            pre = c.lifecycle.pre_stop if c.lifecycle is not None else None
            if pre is None:
                continue
            if pre.sleep is not None:
                longest = max(longest, float(pre.sleep.seconds))
                continue
            command = list(pre._exec.command or []) if pre._exec is not None else []
            if len(command) == 2 and command[0] in ("sleep", "/bin/sleep"):
                try:
                    seconds = float(command[1])
                    if math.isfinite(seconds) and seconds >= 0:
                        longest = max(longest, seconds)
                        continue
                except ValueError:
                    pass
            rec.errors.append(f"container {c.name}: preStop {command or pre.to_dict()} not run (only sleep N)")
            self._record(f"{pod.metadata.namespace}/{pod.metadata.name}: {rec.errors[-1]}")
        return longest

    def _terminate_gracefully(self, pod: client.V1Pod, st: _PodState, rec: Termination) -> None:
        try:
            grace = rec.grace_seconds = self._grace(pod)
            started = time.monotonic()
            rec.prestop_seconds = self._prestop_seconds(pod, rec)
            if rec.prestop_seconds:
                self._stop.wait(min(rec.prestop_seconds, grace))  # the hook's sleep, within the grace period
            left = max(grace - (time.monotonic() - started), MIN_GRACE_SECONDS)
            if self._stop.is_set():
                left = 0.0
            st.pod = pod
            rec.stop_at, rec.stop_grace = time.monotonic(), left
            self._call_stop(st, left)
            rec.stopped_at = time.monotonic()
            try:
                self._finalise(pod, stop=False)
            except ApiException as e:
                if e.status not in (404, 409):  # gone already (or replaced): nothing left to delete
                    raise
            rec.deleted_at = time.monotonic()
        except Exception as e:  # noqa: BLE001 - a kubelet keeps going
            rec.errors.append(repr(e))
            self._record(f"terminating {rec.namespace}/{rec.name} failed: {e!r}")
        finally:
            with self._lock:
                self._pods.pop(rec.uid, None)
                self._terminating.pop(rec.uid, None)

    def _finalise(self, pod: client.V1Pod, stop: bool = True) -> None:
        if stop:
            with self._lock:
                st = self._pods.pop(pod.metadata.uid, None)
            if st is not None:
                st.pod = pod
                self._call_stop(st)
        self.core.delete_namespaced_pod(
            pod.metadata.name,
            pod.metadata.namespace,
            grace_period_seconds=0,
            body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid)
            ),
        )

    def _call_stop(self, st: _PodState, grace: Optional[float] = None) -> None:
        """on_pod_stop, then the pod's IP is free again (a graceful stop keeps it until its containers are gone)."""
        if self.on_pod_stop is not None:
            try:
                if grace is None:
                    self.on_pod_stop(st.pod, st.ip)
                else:
                    self.on_pod_stop(st.pod, st.ip, grace)
            except Exception as e:  # noqa: BLE001
                self._record(f"on_pod_stop {st.namespace}/{st.name} raised {e!r}")
        with self._lock:
            self._ips_in_use.discard(st.ip)
            self._desired_ready.pop((st.namespace, st.name), None)

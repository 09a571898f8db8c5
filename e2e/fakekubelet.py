"""Play scheduler + kubelet for a control plane that has neither.

``FakeKubelet`` registers a Node (with GPUs in its allocatable resources), then
polls pods every ``interval`` seconds and:

* binds unscheduled pods to its node through the Binding API (pods whose
  ``nodeSelector`` does not match the node's labels stay Pending, marked
  ``PodScheduled=False/Unschedulable``, as a scheduler would leave them);
* "starts" pods bound to its node: gives each a unique IP from a 127.0.0.0/8
  pool, calls ``on_pod_start(pod, ip)`` (a test may start a real process on that
  IP; a bool return decides readiness), then patches the pod status to Running
  with the Ready condition;
* finalises pods being deleted: calls ``on_pod_stop(pod, ip)`` and deletes them
  with grace period 0 (there is no kubelet to finish a graceful deletion, so
  StatefulSet scale-down would otherwise hang);
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
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)

DEFAULT_GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"

OnPodStart = Callable[[client.V1Pod, str], Optional[bool]]
OnPodStop = Callable[[client.V1Pod, str], None]


@dataclass(frozen=True)
class Fault:
    """What a kubelet reports for a pod whose first container fails: the containerStatus fields beyond name
    and image (state, lastState, restartCount), the pod's phase, and the Events it posts about the pod as
    (type, reason, message)."""

    container: dict[str, Any]
    events: tuple[tuple[str, str, str], ...] = ()
    phase: str = "Running"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _default_ip_pool() -> list[str]:
    return [f"127.0.0.{i}" for i in range(10, 255)]


class _PodState:
    __slots__ = ("uid", "namespace", "name", "ip", "ready", "reported_ready", "pod")

    def __init__(self, pod: client.V1Pod, ip: str):
        self.uid = pod.metadata.uid
        self.namespace = pod.metadata.namespace
        self.name = pod.metadata.name
        self.ip = ip
        self.ready = False
        self.reported_ready: Optional[bool] = None
        self.pod = pod


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
        self._faulted: set[str] = set()  # uids reported failing: left as reported
        self.auto_ready = auto_ready
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
                    self._finalise(pod)
                elif not node:
                    if self._schedulable(pod):
                        self._bind(pod)
                        self._run_pod(pod)
                    else:
                        self._mark_unschedulable(pod)
                elif pod.status.phase in ("Succeeded", "Failed"):
                    continue
                else:
                    self._run_pod(pod)
            except ApiException as e:
                if e.status in (404, 409):  # gone or changed meanwhile: next round
                    continue
                self._record(f"{pod.metadata.namespace}/{pod.metadata.name}: {e.status} {e.reason}: {e.body}")
        with self._lock:
            for uid in [u for u in self._pods if u not in seen]:
                self._call_stop(self._pods.pop(uid))
            self._unschedulable_marked &= seen

    # ------------------------------------------------------------ pod steps
    def _schedulable(self, pod: client.V1Pod) -> bool:
        sel = pod.spec.node_selector or {}
        return all(self.node_labels.get(k) == v for k, v in sel.items())

    def _mark_unschedulable(self, pod: client.V1Pod) -> None:
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
                            "message": f"0/1 nodes are available: node {self.node_name} didn't match Pod's node affinity/selector.",
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
        if st.reported_ready == ready and not new and pod.status.phase == "Running":
            return
        self._patch_running(pod, st, ready)
        st.reported_ready = ready

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

    def _patch_running(self, pod: client.V1Pod, st: _PodState, is_ready: bool) -> None:
        now = _now()
        ready = "True" if is_ready else "False"
        started = pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ") if pod.status.start_time else now

        def cond(t: str, s: str) -> dict:
            return {"type": t, "status": s, "lastProbeTime": None, "lastTransitionTime": now}

        def running(c: client.V1Container) -> dict:
            return {
                "name": c.name,
                "image": c.image or "",
                "imageID": f"fake://{c.image or ''}",
                "containerID": f"fake://{st.uid}/{c.name}",
                "ready": is_ready,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": started}},
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
                cond("Ready", ready),
            ],
            "containerStatuses": [running(c) for c in pod.spec.containers],
        }
        if pod.spec.init_containers:
            status["initContainerStatuses"] = [completed(c) for c in pod.spec.init_containers]
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})

    def _finalise(self, pod: client.V1Pod) -> None:
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

    def _call_stop(self, st: _PodState) -> None:
        with self._lock:
            self._ips_in_use.discard(st.ip)
            self._desired_ready.pop((st.namespace, st.name), None)
        if self.on_pod_stop is not None:
            try:
                self.on_pod_stop(st.pod, st.ip)
            except Exception as e:  # noqa: BLE001
                self._record(f"on_pod_stop {st.namespace}/{st.name} raised {e!r}")

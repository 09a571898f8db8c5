"""The pod failure cases the classifier's tests and the status snapshots share: pods and Events as the API
returns them (the scheduler's condition message, the kubelet's waiting reasons and Events, the workload
controllers' FailedCreate, a vLLM traceback as FallbackToLogsOnError leaves it), each with the verdict expected.

Test data, not a test: tests/unit/test_failures.py checks the classifier on CASES and e2e/testbed/status_cases.py
turns them into reconciler statuses.
"""

from __future__ import annotations

from typing import Any, Optional

T0 = "2026-01-01T10:00:00Z"
IMAGE = "vllm/vllm-openai:v0.32.0"
MISSING = "vllm/vllm-openai:v9.9.9"

VLLM_LOG = "\n".join([
    "(APIServer pid=1) INFO 01-01 10:00:05 [api_server.py:1815] vLLM API server version 0.32.0",
    "(APIServer pid=1) INFO 01-01 10:00:05 [utils.py:326] non-default args: {'model': 'meta-llama/Llama-3.1-8B'}",
    "(EngineCore_DP0 pid=180) INFO 01-01 10:00:40 [gpu_model_runner.py:2912] Model loading took 14.99 GiB",
    "(EngineCore_DP0 pid=180) ERROR 01-01 10:01:10 [core.py:708] EngineCore failed to start.",
    "(EngineCore_DP0 pid=180) ERROR 01-01 10:01:10 [core.py:708] Traceback (most recent call last):",
    "(EngineCore_DP0 pid=180) ERROR 01-01 10:01:10 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. "
    "Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 22.05 GiB of which 1.02 GiB is free. "
    + "Including non-PyTorch memory, this process has 21.02 GiB memory in use. " * 4,
    "",
    "\x1b[31mRuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\x1b[0m",
    "",
])


# --------------------------------------------------------------------------- shapes
def pod(name: str = "srv-0", *, uid: Optional[str] = None, conditions: Optional[list] = None,
        status: Optional[dict] = None, limits: Optional[dict] = None, deleting: bool = False,
        image: str = IMAGE) -> dict[str, Any]:
    """A vLLM pod as the operator builds it (startup probe 60 x 10 s), with the given status."""
    meta: dict[str, Any] = {"name": name, "namespace": "team", "uid": uid or f"uid-{name}",
                            "labels": {"app.kubernetes.io/instance": "srv"}}
    if deleting:
        meta["deletionTimestamp"] = T0
    return {
        "metadata": meta,
        "spec": {"containers": [{
            "name": "vllm", "image": image,
            "resources": {"limits": {"memory": "20Gi", "nvidia.com/gpu": "1"} if limits is None else limits,
                          "requests": {"cpu": "4", "memory": "20Gi", "nvidia.com/gpu": "1"}},
            "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                             "timeoutSeconds": 5, "failureThreshold": 60},
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }]},
        "status": {"phase": "Pending" if status is None else "Running", "qosClass": "Burstable",
                   "conditions": conditions or [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                                 "lastTransitionTime": T0}],
                   **({"containerStatuses": [{"name": "vllm", "image": image, "imageID": "", "started": False,
                                              "ready": False, "restartCount": 0, "lastState": {}, **status}]}
                      if status is not None else {})},
    }


def unschedulable(message: str = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                  since: str = T0) -> list[dict[str, Any]]:
    return [{"type": "PodScheduled", "status": "False", "lastProbeTime": None, "lastTransitionTime": since,
             "reason": "Unschedulable", "message": message}]


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}}


def terminated(exit_code: int, reason: str = "Error", message: str = "", started: str = "2026-01-01T10:00:00Z",
               finished: str = "2026-01-01T10:10:02Z") -> dict[str, Any]:
    t = {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": finished,
         "containerID": "containerd://4f2c"}
    if message:
        t["message"] = message
    return t


def crashed(last: dict[str, Any], restarts: int = 3, state: Optional[dict] = None) -> dict[str, Any]:
    return {"restartCount": restarts, "lastState": {"terminated": last},
            **(state or waiting("CrashLoopBackOff", "back-off 1m20s restarting failed container=vllm "
                                "pod=srv-0_team(uid-srv-0)"))}


def event(kind: str, name: str, reason: str, message: str, *, at: str = "2026-01-01T10:05:00Z", uid: Optional[str] = None,
          type_: str = "Warning", component: str = "kubelet", field_path: Optional[str] = None) -> dict[str, Any]:
    """A core/v1 Event, as `kubectl get events -o json` shows it."""
    obj = {"kind": kind, "namespace": "team", "name": name, "uid": uid or f"uid-{name}",
           "apiVersion": "v1" if kind == "Pod" else "apps/v1"}
    if field_path:
        obj["fieldPath"] = field_path
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name}.17e2a1b2c3d4", "namespace": "team", "creationTimestamp": at},
            "involvedObject": obj, "reason": reason, "message": message, "type": type_,
            "source": {"component": component}, "firstTimestamp": at, "lastTimestamp": at, "count": 1}


def pod_event(reason: str, message: str, **kw: Any) -> dict[str, Any]:
    kw.setdefault("field_path", "spec.containers{vllm}")
    return event("Pod", "srv-0", reason, message, **kw)


PSA = ('create Pod srv-0 in StatefulSet srv failed error: pods "srv-0" is forbidden: violates PodSecurity '
       '"baseline:latest": host namespaces (hostIPC=true)')
QUOTA = ('create Pod srv-1 in StatefulSet srv failed error: pods "srv-1" is forbidden: exceeded quota: gpu-quota, '
         'requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=4, limited: requests.nvidia.com/gpu=4')
WEBHOOK = ('Error creating: admission webhook "validate.kyverno.svc-fail" denied the request: \n\npolicy '
           'DaemonSet/team/qwen for resource violation: \n\nrequire-requests-limits:\n  validate-resources: '
           "'validation error: CPU and memory resource requests and limits are required'")
STARTUP_FAILED = ('Startup probe failed: Get "http://10.244.1.7:8000/health": dial tcp 10.244.1.7:8000: connect: '
                  "connection refused")
ERR_IMAGE_PULL = ('rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/vllm/vllm-openai:v9.9.9": '
                  'failed to resolve reference "docker.io/vllm/vllm-openai:v9.9.9": docker.io/vllm/vllm-openai:v9.9.9: '
                  "not found")

# (id, pods, events, now, reason or None, waiting, texts the message must hold)
CASES = [
    ("nothing", [], [], None, None, False, []),
    ("serving", [pod(status={"ready": True, "started": True, "state": {"running": {"startedAt": T0}}})], [], None,
     None, False, []),
    ("loading", [pod(status={"state": {"running": {"startedAt": T0}}})], [pod_event("Unhealthy", STARTUP_FAILED)],
     None, None, False, []),
    # ---- FailedCreate
    ("pod-security", [], [event("StatefulSet", "srv", "FailedCreate", PSA, component="statefulset-controller")], None,
     "FailedCreate", False, ["StatefulSet srv cannot create its pods", 'violates PodSecurity "baseline:latest"',
                             "hostIPC=true", "ipc: SharedMemory"]),
    ("quota", [pod()], [event("StatefulSet", "srv", "FailedCreate", QUOTA)], None,
     "FailedCreate", False, ["exceeded quota: gpu-quota", "limited: requests.nvidia.com/gpu=4"]),
    ("quota-since-lifted", [pod("srv-1")], [
        event("StatefulSet", "srv", "FailedCreate", QUOTA, at="2026-01-01T10:00:00Z"),
        event("StatefulSet", "srv", "SuccessfulCreate", "create Pod srv-1 in StatefulSet srv successful",
              at="2026-01-01T10:02:00Z", type_="Normal")], None, None, False, []),
    ("pod-exists-by-now", [pod("srv-0", status={"state": {"running": {}}})],
     [event("StatefulSet", "srv", "FailedCreate", PSA)], None, None, False, []),
    ("other-pod-created-later", [pod("srv-0", status={"ready": True, "state": {"running": {}}})], [
        event("StatefulSet", "srv", "FailedCreate", QUOTA, at="2026-01-01T10:00:00Z"),
        event("StatefulSet", "srv", "SuccessfulCreate", "create Pod srv-0 in StatefulSet srv successful",
              at="2026-01-01T10:02:00Z", type_="Normal")], None, "FailedCreate", False, ["srv-1"]),
    ("daemonset-webhook", [], [event("DaemonSet", "qwen", "FailedCreate", WEBHOOK, component="daemonset-controller")],
     None, "FailedCreate", False, ["DaemonSet qwen cannot create its pods", 'admission webhook "validate.kyverno',
                                   "requests and limits are required"]),
    ("events-k8s-io-v1", [], [{"apiVersion": "events.k8s.io/v1", "kind": "Event", "reason": "FailedCreate",
                               "regarding": {"kind": "StatefulSet", "name": "srv", "namespace": "team"},
                               "note": PSA, "type": "Warning", "eventTime": "2026-01-01T10:05:00.123456Z",
                               "series": {"count": 4, "lastObservedTime": "2026-01-01T10:09:00.000001Z"}}],
     None, "FailedCreate", False, ["hostIPC=true"]),
    # ---- Unschedulable
    ("no-gpu-free", [pod(conditions=unschedulable())], [], None,
     "Unschedulable", False, ["pod srv-0 cannot be scheduled: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."]),
    ("no-gpu-node", [pod(conditions=unschedulable("0/3 nodes are available: 3 node(s) didn't match node selector."))],
     [], None, "Unschedulable", False, ["didn't match node selector. Check spec.gpu.product"]),
    ("within-grace", [pod(conditions=unschedulable())], [], "2026-01-01T10:04:59Z", "Unschedulable", True,
     ["Insufficient nvidia.com/gpu"]),
    ("grace-over", [pod(conditions=unschedulable())], [], "2026-01-01T10:05:00Z", "Unschedulable", False,
     ["Insufficient nvidia.com/gpu"]),
    ("autoscaler-adds-a-node", [pod(conditions=unschedulable())], [
        pod_event("TriggeredScaleUp", "pod triggered scale-up: [{gpu-pool 0->1 (max: 4)}]", type_="Normal",
                  component="cluster-autoscaler", field_path=None)], "2026-01-01T11:00:00Z",
     "Unschedulable", True, ["waits for a node being added", "gpu-pool 0->1"]),
    ("autoscaler-gave-up", [pod(conditions=unschedulable())], [
        pod_event("TriggeredScaleUp", "pod triggered scale-up: [{gpu-pool 0->1 (max: 1)}]", type_="Normal",
                  field_path=None, at="2026-01-01T10:01:00Z"),
        pod_event("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached", type_="Normal",
                  field_path=None, at="2026-01-01T10:06:00Z")], None, "Unschedulable", False, ["cannot be scheduled"]),
    # ---- images and containers
    ("err-image-pull", [pod(status=waiting("ErrImagePull", ERR_IMAGE_PULL), image=MISSING)], [], None,
     "ImagePullBackOff", False, [f"cannot pull image '{MISSING}' (ErrImagePull)", "v9.9.9: not found", "spec.image"]),
    ("image-pull-backoff", [pod(status=waiting("ImagePullBackOff", f'Back-off pulling image "{MISSING}"'),
                                image=MISSING)],
     [pod_event("Failed", f'Failed to pull image "{MISSING}": {ERR_IMAGE_PULL}'),
      pod_event("BackOff", f'Back-off pulling image "{MISSING}"', type_="Normal")], None,
     "ImagePullBackOff", False, [f"'{MISSING}' (ImagePullBackOff)", "failed to resolve reference"]),
    ("image-named-by-the-kubelet-only", [{"metadata": {"name": "srv-0"}, "status": {"containerStatuses": [
        {"name": "vllm", **waiting("ImagePullBackOff", f'Back-off pulling image "{MISSING}"')}]}}], [], None,
     "ImagePullBackOff", False, [f"'{MISSING}'"]),
    ("invalid-image", [pod(status=waiting("InvalidImageName", 'Failed to apply default image tag "Vllm/x:": couldn\'t '
                                          "parse image reference"), image="Vllm/x:")], [], None,
     "InvalidImageName", False, ["'Vllm/x:' is not valid", "spec.image"]),
    ("missing-secret", [pod(status=waiting("CreateContainerConfigError", 'secret "hf-token" not found'))], [], None,
     "CreateContainerConfigError", False, ['secret "hf-token" not found', "spec.hfTokenSecretRef"]),
    # ---- OOM, startup probe, crashes
    ("oom-killed", [pod(status=crashed(terminated(137, "OOMKilled")))], [], None,
     "OOMKilled", False, ["container vllm was OOMKilled (3 restarts)", "memory limit 20Gi",
                          "spec.resources.limits.memory"]),
    ("oom-no-limit", [pod(status=crashed(terminated(137, "OOMKilled")), limits={"nvidia.com/gpu": "1"})], [], None,
     "OOMKilled", False, ["node ran out of memory"]),
    ("crash-loop", [pod(status=crashed(terminated(1, message=VLLM_LOG)))], [], None,
     "CrashLoopBackOff", False, ["keeps exiting (CrashLoopBackOff, exit code 1, 3 restarts)", "Engine core initialization failed",
                                 "torch.OutOfMemoryError"]),
    ("crash-no-message", [pod(status=crashed(terminated(2)))], [], None,
     "CrashLoopBackOff", False, ["exit code 2", "kubectl logs srv-0 --previous"]),
    ("reloading-after-a-crash", [pod(status=crashed(terminated(1, message=VLLM_LOG), 2,
                                                    {"state": {"running": {"startedAt": T0}}}))], [], None,
     "CrashLoopBackOff", False, ["2 restarts", "Engine core initialization failed"]),
    ("serving-after-a-crash", [pod(status=crashed(terminated(1), 2, {"ready": True, "state": {"running": {}}}))], [],
     None, None, False, []),
    ("reloading-after-node-reboot", [pod(status=crashed(terminated(255, "Unknown"), 1, {"state": {"running": {}}}))],
     [], None, None, False, []),
    ("startup-probe-killed", [pod(status=crashed(terminated(137)))], [
        pod_event("Unhealthy", STARTUP_FAILED, at="2026-01-01T10:09:50Z"),
        pod_event("Killing", "Container vllm failed startup probe, will be restarted", type_="Normal",
                  at="2026-01-01T10:10:00Z")], None,
     "StartupProbeFailed", False, ["did not answer /health within its startup probe's 600 s",
                                   "failureThreshold 60 x periodSeconds 10", "3 restarts"]),
    ("startup-probe-no-kill-event", [pod(status=crashed(terminated(143, message=VLLM_LOG.split("\n")[2])))],
     [pod_event("Unhealthy", STARTUP_FAILED, at="2026-01-01T10:09:50Z")], None,
     "StartupProbeFailed", False, ["600 s", "Model loading took 14.99 GiB"]),
    ("crash-while-loading", [pod(status=crashed(terminated(1, message=VLLM_LOG)))],
     [pod_event("Unhealthy", STARTUP_FAILED, at="2026-01-01T10:09:50Z")], None,
     "CrashLoopBackOff", False, ["exit code 1"]),
    ("liveness-kill", [pod(status=crashed(terminated(137)))], [
        pod_event("Unhealthy", STARTUP_FAILED, at="2026-01-01T10:01:00Z"),
        pod_event("Killing", "Container vllm failed liveness probe, will be restarted", type_="Normal",
                  at="2026-01-01T10:10:00Z")], None,
     "CrashLoopBackOff", False, ["exit code 137 (SIGKILL)"]),
    ("startup-kill-of-an-earlier-run", [pod(status=crashed(terminated(1)))], [
        pod_event("Killing", "Container vllm failed startup probe, will be restarted", type_="Normal",
                  at="2026-01-01T09:30:00Z")], None, "CrashLoopBackOff", False, ["exit code 1"]),
    ("events-of-an-older-pod", [pod(status=crashed(terminated(137)), uid="uid-new")], [
        pod_event("Killing", "Container vllm failed startup probe, will be restarted", uid="uid-old")], None,
     "CrashLoopBackOff", False, []),
    ("terminating-pod", [pod(status=crashed(terminated(1)), deleting=True)], [], None, None, False, []),
]

"""Pod Security Admission, as the API server will judge the pods the operator is about to create. Pure.

A namespace labelled `pod-security.kubernetes.io/enforce: baseline` (or `restricted`) makes the API server
refuse every pod breaking that level; the StatefulSet controller then only logs FailedCreate events and the
server never starts. The reconciler asks this module first, so the VLLMServer says which field its namespace
forbids instead of waiting silently for pods that will never exist.

The checks follow the Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards,
as k8s.io/pod-security-admission implements them in 1.30-1.37) for what a pod template can carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")

#: Volume types the restricted level allows.
_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
#: Capabilities the baseline level allows a container to add.
_BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                          "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}

#: Where a pod field comes from in the VLLMServer spec, for messages a user can act on.
SPEC_FIELDS = {"hostIPC": "spec.ipc: Host", "hostNetwork": "spec.hostNetwork: true", "hostPID": "the pod's hostPID"}


@dataclass(frozen=True)
class Violation:
    """One thing a Pod Security level forbids in a pod template."""

    level: str
    field: str
    what: str
    #: Where in the pod template's spec, e.g. containers[vllm].securityContext (for the final-template check).
    path: str = ""

    def __str__(self) -> str:
        return f"{self.field} ({self.what})"


def enforced_level(namespace_labels: Optional[dict[str, str]]) -> Optional[str]:
    """The level a namespace enforces (None: unknown or not labelled, i.e. privileged by default)."""
    level = (namespace_labels or {}).get(ENFORCE_LABEL)
    return level if level in LEVELS else None


def violations(template_spec: dict[str, Any], level: Optional[str]) -> list[Violation]:
    """What `level` forbids in a pod template's spec (empty for privileged or an unknown level)."""
    if level not in ("baseline", "restricted"):
        return []
    found = _baseline(template_spec)
    if level == "restricted":
        found += _restricted(template_spec)
    return found


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(path, container) of every container, init containers first."""
    return [(f"{key}[{c.get('name')}]", c) for key in ("initContainers", "containers")
            for c in spec.get(key) or [] if isinstance(c, dict)]


def _baseline(spec: dict[str, Any]) -> list[Violation]:
    out = [Violation("baseline", SPEC_FIELDS[key], f"{key}=true", key) for key in ("hostIPC", "hostNetwork", "hostPID")
           if spec.get(key)]
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            out.append(Violation("baseline", f"volume {volume.get('name')}", "hostPath volumes",
                                 f"volumes[{volume.get('name')}].hostPath"))
    for path, c in _containers(spec):
        sc = c.get("securityContext") or {}
        name = f"container {c.get('name')}"
        if sc.get("privileged"):
            out.append(Violation("baseline", name, "privileged", f"{path}.securityContext.privileged"))
        added = set((sc.get("capabilities") or {}).get("add") or []) - _BASELINE_CAPABILITIES
        if added:
            out.append(Violation("baseline", name, f"capabilities {sorted(added)}",
                                 f"{path}.securityContext.capabilities.add"))
        if any(p.get("hostPort") for p in c.get("ports") or []) and not spec.get("hostNetwork"):
            out.append(Violation("baseline", name, "hostPort", f"{path}.ports"))
    return out


def _restricted(spec: dict[str, Any]) -> list[Violation]:
    out = []
    pod_sc = spec.get("securityContext") or {}
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if kinds - _RESTRICTED_VOLUMES and "hostPath" not in kinds:
            out.append(Violation("restricted", f"volume {volume.get('name')}", f"{sorted(kinds)} volumes",
                                 f"volumes[{volume.get('name')}]"))
    for path, c in _containers(spec):
        sc = c.get("securityContext") or {}
        name, at = f"container {c.get('name')}", f"{path}.securityContext"
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(Violation("restricted", name, "allowPrivilegeEscalation must be false",
                                 f"{at}.allowPrivilegeEscalation"))
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            out.append(Violation("restricted", name, "capabilities must drop ALL", f"{at}.capabilities.drop"))
        if set((sc.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(Violation("restricted", name, "only NET_BIND_SERVICE may be added", f"{at}.capabilities.add"))
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(Violation("restricted", name, "runAsNonRoot must be true", f"{at}.runAsNonRoot"))
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(Violation("restricted", name, "runAsUser must not be 0", f"{at}.runAsUser"))
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(Violation("restricted", name, "seccompProfile must be RuntimeDefault or Localhost",
                                 f"{at}.seccompProfile"))
    return out


def beyond_the_spec(template_spec: dict[str, Any], *, host_ipc: bool, host_network: bool) -> list[Violation]:
    """What the operator never puts in a pod, whatever the namespace allows: everything Pod Security
    "restricted" forbids, except the host IPC and network namespaces the VLLMServer asks for (spec.ipc: Host,
    spec.hostNetwork). Every pod the operator builds passes this; it is checked again on the final template,
    after spec.podTemplatePatch."""
    granted = {"hostIPC"} if host_ipc else set()
    granted |= {"hostNetwork"} if host_network else set()
    return [v for v in violations(template_spec, "restricted") if v.path not in granted]


def message(namespace: str, level: str, found: list[Violation]) -> str:
    """The condition's words: the namespace, its level, the fields, and what to do."""
    fields = "; ".join(str(v) for v in found)
    return (f"namespace {namespace} enforces Pod Security level {level!r} ({ENFORCE_LABEL}={level}), which "
            f"forbids {fields}: the API server would refuse every pod. Change the spec, or ask for a namespace "
            "whose level allows it")

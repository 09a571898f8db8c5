"""Pod Security Admission, as the API server will judge the pods the operator is about to create. Pure.

A namespace labelled `pod-security.kubernetes.io/enforce: baseline` (or `restricted`) makes the API server
refuse every pod breaking that level; the StatefulSet controller then only logs FailedCreate events and the
server never starts. The reconciler asks this module first, so the VLLMServer says which field its namespace
forbids instead of waiting silently for pods that will never exist.

The checks follow the Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards,
as k8s.io/pod-security-admission implements them at 1.37) for what a pod template can carry: every baseline rule
(host namespaces, privileged, capabilities, hostPath, hostPort, hostProcess, SELinux, /proc mount, seccomp
Unconfined, AppArmor in the fields and the annotations, unsafe sysctls, probe and lifecycle hosts) and every
restricted one (volume types, privilege escalation, non-root, seccomp, capabilities), over init, regular and
ephemeral containers. This is the offline reading (`vllm-operator plan`); the reconciler also asks the API server's
own Pod Security admission with a server-side dry run of the pod (controller/pod_admission.py), which decides.
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
#: The sysctls baseline allows (the "safe" set of k8s.io/pod-security-admission, up to 1.37).
_SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                 "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                 "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                 "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}
#: SELinux types baseline allows ("" is unset).
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
#: The AppArmor annotation (one per container) and the profiles baseline allows in it.
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")

#: Where a pod field comes from in the VLLMServer spec, for messages a user can act on.
SPEC_FIELDS = {"hostIPC": "spec.ipc: Host", "hostNetwork": "spec.hostNetwork: true", "hostPID": "the pod's hostPID"}


@dataclass(frozen=True)
class Violation:
    """One thing a Pod Security level forbids in a pod template."""

    level: str
    field: str
    what: str
    #: Where in the pod template's spec, e.g. containers[vllm].securityContext (for the final-template check);
    #: metadata.annotations[...] for what the pod's annotations carry.
    path: str = ""

    def __str__(self) -> str:
        return f"{self.field} ({self.what})"


def enforced_level(namespace_labels: Optional[dict[str, str]]) -> Optional[str]:
    """The level a namespace enforces (None: unknown or not labelled, i.e. privileged by default)."""
    level = (namespace_labels or {}).get(ENFORCE_LABEL)
    return level if level in LEVELS else None


def violations(template_spec: dict[str, Any], level: Optional[str],
               annotations: Optional[dict[str, Any]] = None) -> list[Violation]:
    """What `level` forbids in a pod template's spec and annotations (empty for privileged or an unknown level).
    Never raises: a field of the wrong type is read as unset (the API server refuses such a pod on its own)."""
    if level not in ("baseline", "restricted") or not isinstance(template_spec, dict):
        return []
    found = _baseline(template_spec, annotations if isinstance(annotations, dict) else {})
    if level == "restricted":
        found += _restricted(template_spec)
    return found


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(path, container) of every container, init and ephemeral ones too."""
    return [(f"{key}[{c.get('name')}]", c) for key in ("initContainers", "containers", "ephemeralContainers")
            for c in _list(spec.get(key)) if isinstance(c, dict)]


def _baseline(spec: dict[str, Any], annotations: dict[str, Any]) -> list[Violation]:
    out = [Violation("baseline", SPEC_FIELDS[key], f"{key}=true", key) for key in ("hostIPC", "hostNetwork", "hostPID")
           if spec.get(key)]
    for volume in _list(spec.get("volumes")):
        if isinstance(volume, dict) and "hostPath" in volume:
            out.append(Violation("baseline", f"volume {volume.get('name')}", "hostPath volumes",
                                 f"volumes[{volume.get('name')}].hostPath"))
    pod_sc = _map(spec.get("securityContext"))
    out += _context_baseline("the pod", pod_sc, "securityContext")
    for sysctl in _list(pod_sc.get("sysctls")):
        name = _map(sysctl).get("name")
        if name not in _SAFE_SYSCTLS:
            out.append(Violation("baseline", "the pod", f"sysctl {name} is not in the safe set",
                                 "securityContext.sysctls"))
    for key, value in annotations.items():
        if isinstance(key, str) and key.startswith(APPARMOR_ANNOTATION) and value != "runtime/default" \
                and not (isinstance(value, str) and value.startswith("localhost/")):
            out.append(Violation("baseline", "the pod", f"AppArmor profile {value!r}", f"metadata.annotations[{key}]"))
    for path, c in _containers(spec):
        sc = _map(c.get("securityContext"))
        name = f"container {c.get('name')}"
        out += _context_baseline(name, sc, f"{path}.securityContext")
        if sc.get("privileged"):
            out.append(Violation("baseline", name, "privileged", f"{path}.securityContext.privileged"))
        added = {str(a) for a in _list(_map(sc.get("capabilities")).get("add"))} - _BASELINE_CAPABILITIES
        if added:
            out.append(Violation("baseline", name, f"capabilities {sorted(added)}",
                                 f"{path}.securityContext.capabilities.add"))
        # baseline allows an unmasked /proc in a user namespace of the pod's own (hostUsers: false, 1.33+, which the
        # API server requires for it anyway); restricted never does (below).
        if sc.get("procMount") not in (None, "Default") and spec.get("hostUsers") is not False:
            out.append(Violation("baseline", name, f"procMount {sc.get('procMount')!r}",
                                 f"{path}.securityContext.procMount"))
        if any(_map(p).get("hostPort") for p in _list(c.get("ports"))) and not spec.get("hostNetwork"):
            out.append(Violation("baseline", name, "hostPort", f"{path}.ports"))
        out += _probe_hosts(name, c, path)
    return out


def _context_baseline(name: str, sc: dict[str, Any], at: str) -> list[Violation]:
    """The rules a pod's and a container's securityContext share at baseline."""
    out = []
    if _map(sc.get("windowsOptions")).get("hostProcess"):
        out.append(Violation("baseline", name, "hostProcess", f"{at}.windowsOptions.hostProcess"))
    selinux = _map(sc.get("seLinuxOptions"))
    if selinux.get("type", "") not in _SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        out.append(Violation("baseline", name, "seLinuxOptions beyond container_t", f"{at}.seLinuxOptions"))
    if _map(sc.get("seccompProfile")).get("type") == "Unconfined":
        out.append(Violation("baseline", name, "seccompProfile Unconfined", f"{at}.seccompProfile"))
    if _map(sc.get("appArmorProfile")).get("type") not in (None, "RuntimeDefault", "Localhost"):
        out.append(Violation("baseline", name, f"appArmorProfile {_map(sc.get('appArmorProfile')).get('type')!r}",
                             f"{at}.appArmorProfile"))
    return out


def _probe_hosts(name: str, c: dict[str, Any], path: str) -> list[Violation]:
    """Probes and lifecycle hooks may not name a host (1.34+): the kubelet would connect there for the pod."""
    handlers = [(f"{path}.{p}", _map(c.get(p))) for p in _PROBES]
    handlers += [(f"{path}.lifecycle.{h}", _map(_map(c.get("lifecycle")).get(h))) for h in ("postStart", "preStop")]
    return [Violation("baseline", name, f"{kind}.host", f"{at}.{kind}.host") for at, handler in handlers
            for kind in ("httpGet", "tcpSocket") if _map(handler.get(kind)).get("host")]


def _restricted(spec: dict[str, Any]) -> list[Violation]:
    out = []
    pod_sc = _map(spec.get("securityContext"))
    for volume in _list(spec.get("volumes")):
        kinds = set(_map(volume)) - {"name"}
        if kinds - _RESTRICTED_VOLUMES and "hostPath" not in kinds:
            out.append(Violation("restricted", f"volume {_map(volume).get('name')}", f"{sorted(kinds)} volumes",
                                 f"volumes[{_map(volume).get('name')}]"))
    if pod_sc.get("runAsNonRoot") is False:
        out.append(Violation("restricted", "the pod", "runAsNonRoot must be true", "securityContext.runAsNonRoot"))
    if pod_sc.get("runAsUser") == 0:
        out.append(Violation("restricted", "the pod", "runAsUser must not be 0", "securityContext.runAsUser"))
    pod_seccomp = _map(pod_sc.get("seccompProfile")).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        out.append(Violation("restricted", "the pod", "seccompProfile must be RuntimeDefault or Localhost",
                             "securityContext.seccompProfile"))
    for path, c in _containers(spec):
        sc = _map(c.get("securityContext"))
        name, at = f"container {c.get('name')}", f"{path}.securityContext"
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(Violation("restricted", name, "allowPrivilegeEscalation must be false",
                                 f"{at}.allowPrivilegeEscalation"))
        capabilities = _map(sc.get("capabilities"))
        if "ALL" not in _list(capabilities.get("drop")):
            out.append(Violation("restricted", name, "capabilities must drop ALL", f"{at}.capabilities.drop"))
        if {str(a) for a in _list(capabilities.get("add"))} - {"NET_BIND_SERVICE"}:
            out.append(Violation("restricted", name, "only NET_BIND_SERVICE may be added", f"{at}.capabilities.add"))
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(Violation("restricted", name, "runAsNonRoot must be true", f"{at}.runAsNonRoot"))
        if sc.get("runAsUser") == 0 or ("runAsUser" not in sc and pod_sc.get("runAsUser") == 0):
            out.append(Violation("restricted", name, "runAsUser must not be 0", f"{at}.runAsUser"))
        if sc.get("procMount") not in (None, "Default") and spec.get("hostUsers") is False:
            out.append(Violation("restricted", name, f"procMount {sc.get('procMount')!r}", f"{at}.procMount"))
        seccomp = _map(sc.get("seccompProfile")).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(Violation("restricted", name, "seccompProfile must be RuntimeDefault or Localhost",
                                 f"{at}.seccompProfile"))
    return out


def beyond_the_spec(template_spec: dict[str, Any], *, host_ipc: bool, host_network: bool,
                    annotations: Optional[dict[str, Any]] = None) -> list[Violation]:
    """What the operator never puts in a pod, whatever the namespace allows: everything Pod Security
    "restricted" forbids, except the host IPC and network namespaces the VLLMServer asks for (spec.ipc: Host,
    spec.hostNetwork). Every pod the operator builds passes this; it is checked again on the final template,
    after spec.podTemplatePatch."""
    granted = {"hostIPC"} if host_ipc else set()
    granted |= {"hostNetwork"} if host_network else set()
    return [v for v in violations(template_spec, "restricted", annotations) if v.path not in granted]


def message(namespace: str, level: str, found: list[Violation]) -> str:
    """The condition's words: the namespace, its level, the fields, and what to do."""
    fields = "; ".join(str(v) for v in found)
    return (f"namespace {namespace} enforces Pod Security level {level!r} ({ENFORCE_LABEL}={level}), which "
            f"forbids {fields}: the API server would refuse every pod. Change the spec, or ask for a namespace "
            "whose level allows it")

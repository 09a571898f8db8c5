"""What "converged" means for a namespace of VLLMServers, checked against a real API server.

Shared by the crash, outage and HA tests. A test keeps the last spec it applied per server
name (None once deleted); `convergence_problems` lists everything that differs from it:

* every live server: status.observedGeneration current, SpecValid=True, and exactly the
  children `builders.build_all` makes from its last applied spec, each up to date (the
  operator's desired-hash annotation and every desired field live: no lost spec change);
* every deleted server: gone (its finalizer released);
* every child in the namespace: owned (controller reference) by a live server that wants
  it -- no duplicates, no orphans of deleted or re-created servers.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Optional

import yaml

from e2e.testbed.controlplane import wait_for
from vllm_operator import api, builders, pipeline
from vllm_operator.kube.client import ApiError, Kube
from vllm_operator.controller.drift import up_to_date, with_hash

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "vllmservers.vllm-operator.io.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SERVERS = f"/apis/{api.GROUP}/{api.VERSION}"


def install_crd(control_plane, path: Path = CRD) -> None:
    """Install (or replace) the CRD and wait until it is served. `kubectl wait` fails outright while a new CRD
    has no conditions at all yet, so it is polled."""
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    wait_established(control_plane, f"{api.PLURAL}.{api.GROUP}")


def wait_established(control_plane, crd: str, timeout: float = 60) -> None:
    """Wait until a CRD is served. `kubectl wait` fails outright (".status.conditions accessor error") while a new
    CRD has no conditions at all yet, instead of waiting, so it is polled."""
    wait_for(lambda: control_plane.kubectl("wait", "--for=condition=Established", "--timeout=5s", f"crd/{crd}",
                                           check=False).returncode == 0, timeout, f"the CRD {crd} established")


def example(file: str | Path) -> dict[str, Any]:
    return yaml.safe_load(Path(ROOT / "examples" / file).read_text())


def server_doc(name: str, namespace: str, base: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    doc["metadata"] = {"name": name, "namespace": namespace}
    return doc


def server_path(namespace: str, name: str = "") -> str:
    return f"{SERVERS}/namespaces/{namespace}/{api.PLURAL}" + (f"/{name}" if name else "")


def apply_server(kube: Kube, doc: dict[str, Any], attempts: int = 10) -> dict[str, Any]:
    """Create a server, or replace its spec with `doc`'s (as `kubectl replace` does).

    Not server-side apply: this test bed's kube-apiserver (1.20 built from Debian's source) turns a
    field that an apply stops sending into null on a custom resource and then refuses the object
    ("spec.cache ... must be of type object: null"), where a real one removes the field.
    """
    m = doc["metadata"]
    for attempt in range(attempts):
        live = get_server(kube, m["namespace"], m["name"])
        try:
            if live is None:
                return kube.request("POST", server_path(m["namespace"]), body=doc)
            body = {**live, "spec": doc["spec"]}
            return kube.request("PUT", server_path(m["namespace"], m["name"]), body=body)
        except ApiError as e:
            if e.status != 409 or attempt == attempts - 1:  # 409: someone (kopf) wrote in between
                raise
    raise AssertionError("unreachable")


def delete_server(kube: Kube, namespace: str, name: str) -> None:
    try:
        kube.request("DELETE", server_path(namespace, name))
    except ApiError as e:
        if e.status != 404:
            raise


def get_server(kube: Kube, namespace: str, name: str) -> Optional[dict[str, Any]]:
    try:
        return kube.request("GET", server_path(namespace, name))
    except ApiError as e:
        if e.status == 404:
            return None
        raise


CHILD_KINDS = [("v1", "Service"), ("apps/v1", "StatefulSet"), ("apps/v1", "DaemonSet"),
               ("policy/v1", "PodDisruptionBudget")]


def expected_children(doc: dict[str, Any], owner: dict[str, Any]) -> list[dict[str, Any]]:
    """What the operator must have applied for `doc`, owned by the live server `owner`."""
    server = api.VLLMServer.model_validate(doc)
    plan = pipeline.plan_server(server.metadata.name, server.metadata.namespace, server.spec)
    assert plan.fits, f"{server.metadata.name}: the test applied a spec that does not plan: {plan.problems}"
    return [with_hash(o) for o in builders.build_all(plan, owner)]


def _condition(server: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (server.get("status") or {}).get("conditions") or [] if c.get("type") == type_), {})


def convergence_problems(kube: Kube, namespace: str, final: dict[str, Optional[dict[str, Any]]]) -> list[str]:
    """Everything that differs from the converged state `final` (name -> last applied doc, None if deleted)."""
    problems: list[str] = []
    live_servers = {s["metadata"]["name"]: s for s in kube.request("GET", server_path(namespace)).get("items", [])}
    children: dict[tuple[str, str], dict[str, Any]] = {}
    for api_version, kind in CHILD_KINDS:
        for obj in kube.list(api_version, kind, namespace,
                             label_selector=f"app.kubernetes.io/managed-by={builders.MANAGED_BY}"):
            obj.setdefault("apiVersion", api_version)
            obj.setdefault("kind", kind)
            children[(kind, obj["metadata"]["name"])] = obj

    wanted: dict[tuple[str, str], str] = {}  # (kind, name) -> owner uid
    for name, doc in sorted(final.items()):
        live = live_servers.get(name)
        if doc is None:
            if live is not None:
                problems.append(f"{name}: deleted, but still there (finalizers {live['metadata'].get('finalizers')})")
            continue
        if live is None:
            problems.append(f"{name}: missing")
            continue
        meta, status = live["metadata"], live.get("status") or {}
        if status.get("observedGeneration") != meta.get("generation"):
            problems.append(f"{name}: observedGeneration {status.get('observedGeneration')} != generation "
                            f"{meta.get('generation')}")
        if _condition(live, "SpecValid").get("status") != "True":
            problems.append(f"{name}: SpecValid is {_condition(live, 'SpecValid') or 'missing'}")
        for want in expected_children(doc, live):
            key = (want["kind"], want["metadata"]["name"])
            wanted[key] = meta["uid"]
            have = children.get(key)
            if have is None:
                problems.append(f"{name}: {key[0]}/{key[1]} missing")
            elif not up_to_date(want, have):
                problems.append(f"{name}: {key[0]}/{key[1]} is not what the last spec wants (lost change)")
    for key, obj in sorted(children.items()):
        owners = [o.get("uid") for o in obj["metadata"].get("ownerReferences") or [] if o.get("controller")]
        if key not in wanted:
            problems.append(f"{key[0]}/{key[1]}: not wanted by any live server (orphan), owners {owners}")
        elif owners != [wanted[key]]:
            problems.append(f"{key[0]}/{key[1]}: owned by {owners}, not by the live server {wanted[key]}")
    return problems


def wait_converged(kube: Kube, namespace: str, final: dict[str, Optional[dict[str, Any]]], timeout: float,
                   what: str = "convergence") -> float:
    """Poll until converged; returns the seconds it took, or raises with the remaining problems."""
    import time

    t0 = time.monotonic()
    last: list[list[str]] = [[]]

    def converged() -> bool:
        last[0] = convergence_problems(kube, namespace, final)
        return not last[0]

    try:
        wait_for(converged, timeout, what, interval=1.0)
    except TimeoutError:
        shown = "\n  ".join(last[0][:40])
        raise AssertionError(f"no {what} after {timeout:.0f}s; {len(last[0])} problems:\n  {shown}") from None
    return time.monotonic() - t0

"""Scale benchmark: 1,000 VLLMServers on a fresh local control plane, against a plain-client floor.

    python bench/scale.py            # N=1000 (about 10 minutes on 2 cores)
    python bench/scale.py --n 200    # a quick check

Prints figures; it is not a test. Two phases, each on its own fresh control plane
(etcd + kube-apiserver + kube-controller-manager, e2e/testbed/controlplane.py), so neither
inherits the other's objects:

floor     `vllm-operator render` of the N servers (the same StatefulSets/DaemonSets,
          Services and PDBs the operator would make), server-side applied by a plain
          client with --workers threads. Time from the first apply to the last answer.
          Then, in the same cluster, the N VLLMServers themselves, and one status write
          per server: a server-side apply to its /status of a status like the operator's
          (its plan, conditions, replicas, endpoint; `floor_status`). Two floors: the
          children alone, and the children plus one status write per server (what any
          operator must do: the children and a status saying what it did).
operator  `vllm-operator run` (warmed up on one server first), then the N VLLMServers
          applied by the same client. Time from the first apply until every server has
          its workload and status.observedGeneration == metadata.generation with the
          SpecValid and Progressing conditions set (watched, not polled).
          Then, with everything converged: the API requests of one no-op resync of all N
          (one full --resync-seconds window, counted by the kube-apiserver's own
          apiserver_request_total, by verb and resource, minus a window of the same
          length with the operator stopped), the requests of a restart (every server
          resumed; once with kopf's own ToggleSet as the baseline, then as shipped), and
          the operator's peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from e2e.testbed.controlplane import ControlPlane, wait_for  # noqa: E402
from e2e.testbed.operator_process import OperatorProcess  # noqa: E402
from vllm_operator import api, builders, pipeline  # noqa: E402
from vllm_operator.conditions import Conditions  # noqa: E402
from vllm_operator.kopfext import toggles as kopf_toggles  # noqa: E402
from vllm_operator.kube.client import Kube  # noqa: E402

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CRD = ROOT / "crds" / "vllmservers.vllm-operator.io.yaml"
#: What the operator itself writes; writes to anything else come from the controller-manager.
OPERATOR_RESOURCES = {"vllmservers", "vllmservers/status", "statefulsets", "daemonsets", "services",
                      "poddisruptionbudgets", "events"}
WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION", "CREATE", "UPDATE"}
SERVERS_PATH = f"/apis/{api.GROUP}/{api.VERSION}/{api.PLURAL}"


# --------------------------------------------------------------------------- inputs
def server_docs(n: int, namespaces: int) -> list[dict]:
    """N VLLMServers: the examples in turn, unique names, spread over several namespaces."""
    bases = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
    docs = []
    for i in range(n):
        doc = json.loads(json.dumps(bases[i % len(bases)]))
        doc["metadata"] = {"name": f"{doc['metadata']['name']}-{i:04d}", "namespace": f"bench-{i % namespaces}"}
        docs.append(doc)
    return docs


def render(docs: list[dict]) -> list[dict]:
    """The children the operator would make, from the offline CLI (`vllm-operator render`)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump_all(docs, f)
    try:
        out = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "render", f.name], check=True,
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "operator")})
    finally:
        os.unlink(f.name)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


# --------------------------------------------------------------------------- cluster helpers
class Http:
    """Raw HTTPS to the kube-apiserver with the control plane's admin token (metrics, watches)."""

    def __init__(self, cp: ControlPlane):
        url = urllib.parse.urlsplit(cp.server)
        self.host, self.port, self.token = url.hostname, url.port, cp.token
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE

    def connect(self, timeout: Optional[float] = 30) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def get(self, path: str) -> tuple[int, bytes]:
        conn = self.connect()
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {self.token}"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def request_counts(self) -> Counter:
        """apiserver_request_total summed by (verb, resource/subresource)."""
        status, body = self.get("/metrics")
        assert status == 200, status
        counts: Counter = Counter()
        for line in body.decode().splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
            resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            if labels.get("dry_run"):
                continue
            counts[(labels.get("verb", ""), resource)] += float(line.rsplit(" ", 1)[1])
        return counts


class Watcher(threading.Thread):
    """Keeps `state[(namespace, name)] = summarize(obj)` current from a LIST + WATCH of `path`."""

    def __init__(self, http_: Http, path: str, summarize: Callable[[dict], Any]):
        super().__init__(daemon=True, name=f"watch {path}")
        self.http, self.path, self.summarize = http_, path, summarize
        self.state: dict[tuple[str, str], Any] = {}
        self.changed = threading.Condition()
        self.stopped = False

    def _key(self, obj: dict) -> tuple[str, str]:
        return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]

    def run(self) -> None:
        rv = None
        while not self.stopped:
            try:
                if rv is None:
                    status, body = self.http.get(self.path)
                    if status != 200:  # e.g. a CRD just established, not served yet
                        time.sleep(0.5)
                        continue
                    listing = json.loads(body)
                    with self.changed:
                        self.state = {self._key(o): self.summarize(o) for o in listing.get("items", [])}
                        self.changed.notify_all()
                    rv = listing["metadata"]["resourceVersion"]
                conn = self.http.connect(timeout=None)
                conn.request("GET", f"{self.path}?watch=1&resourceVersion={rv}&timeoutSeconds=1800",
                             headers={"Authorization": f"Bearer {self.http.token}"})
                resp = conn.getresponse()
                for line in resp:
                    if self.stopped:
                        break
                    ev = json.loads(line)
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        rv = None  # 410 Gone: list again
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    with self.changed:
                        if ev["type"] == "DELETED":
                            self.state.pop(self._key(obj), None)
                        elif ev["type"] != "BOOKMARK":
                            self.state[self._key(obj)] = self.summarize(obj)
                        self.changed.notify_all()
                conn.close()
            except Exception:  # noqa: BLE001 - a watch must outlive any hiccup; list again
                rv = None
                if not self.stopped:
                    time.sleep(0.5)

    def wait(self, predicate: Callable[[dict], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate(self.state):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
        return True


def server_summary(obj: dict) -> bool:
    """Whether a VLLMServer's status is current: observedGeneration, SpecValid and Progressing."""
    st = obj.get("status") or {}
    types = {c.get("type") for c in st.get("conditions") or []}
    return st.get("observedGeneration") == obj["metadata"].get("generation") and {"SpecValid", "Progressing"} <= types


def ensure_namespaces(kube: Kube, names: set[str]) -> None:
    for ns in sorted(names):
        kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": ns}})


def apply_all(kube: Kube, objects: list[dict], workers: int, path_of: Optional[Callable] = None) -> float:
    """Server-side apply every object with `workers` threads; seconds from first request to last answer."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(lambda o: kube.request(
                "PATCH", path_of(o), query=[("fieldManager", "bench"), ("force", "true")], body=o,
                content_type="application/apply-patch+yaml") if path_of else kube.apply(o, field_manager="bench"),
                objects):
            pass
    return time.monotonic() - t0


def server_path(doc: dict) -> str:
    m = doc["metadata"]
    return f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{m['namespace']}/{api.PLURAL}/{m['name']}"


def floor_status(doc: dict, now: str = "2026-01-01T00:00:00Z") -> dict:
    """A status like the one the operator writes for a new server whose pods are not ready yet: its plan (from
    the same offline planner), SpecValid, Progressing, Ready and Degraded, replicas, selector and endpoint."""
    m = doc["metadata"]
    spec = api.VLLMServerSpec.model_validate(doc["spec"])
    plan = pipeline.plan_server(m["name"], m["namespace"], spec)
    conditions = Conditions([], 1, now)
    conditions.set("SpecValid", "True", "Planned", f"flags derived: {plan.max_model_len} tokens of context, "
                   f"{plan.kv_cache_tokens} KV cache tokens per replica")
    conditions.set("Degraded", "False", "AsExpected", "no failure seen")
    conditions.set("Ready", "False", "ReplicasNotReady", "0/1 replicas ready")
    conditions.set("Progressing", "True", "RollingOut", "StatefulSet: 0/1 updated, 0/1 ready")
    conditions.set("Reconciling", "True", "RollingOut", "StatefulSet: 0/1 updated, 0/1 ready")
    status = api.VLLMServerStatus(
        observed_generation=1, replicas=1, ready_replicas=0, selector=builders.selector_string(m["name"]),
        endpoint=f"http://{m['name']}.{m['namespace']}.svc:{builders.PORT}/v1",
        plan=api.PlanStatus.model_validate(plan.status()), conditions=conditions.items)
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": m["name"], "namespace": m["namespace"]},
            "status": status.wire()}


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM/VmRSS in bytes, and CPU seconds (utime + stime) of a process."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0]) * 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out["cpu"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def operator_metrics(port: int) -> Counter:
    """The operator's own counters (telemetry.py): reconciles by result, API writes by resource and verb."""
    import urllib.request

    counts: Counter = Counter()
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:
        return counts
    for line in text.splitlines():
        for name in ("vllm_operator_reconciles_total", "vllm_operator_api_writes_total"):
            if line.startswith(name + "{"):
                labels = ",".join(f"{k}={v}" for k, v in re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
                counts[(name.replace("vllm_operator_", "").replace("_total", ""), labels)] += float(
                    line.rsplit(" ", 1)[1])
    return counts


def written_since(http_: Http, since: float) -> Counter:
    """Objects whose managedFields show a write at or after `since` (wall clock), by (resource, field manager)."""
    import datetime as dt

    counts: Counter = Counter()
    for resource, path in (("vllmservers", SERVERS_PATH), ("statefulsets", "/apis/apps/v1/statefulsets"),
                           ("daemonsets", "/apis/apps/v1/daemonsets"), ("services", "/api/v1/services")):
        status, body = http_.get(path)
        for obj in json.loads(body).get("items", []) if status == 200 else []:
            for entry in obj["metadata"].get("managedFields") or []:
                if "time" not in entry:  # optional in a managedFields entry: no write time to compare
                    continue
                at = dt.datetime.strptime(entry["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
                if at.timestamp() >= int(since):
                    counts[(resource, entry.get("manager", "?"))] += 1
    return counts


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def diff(after: Counter, before: Counter) -> Counter:
    return Counter({k: round(after[k] - before.get(k, 0)) for k in after if after[k] - before.get(k, 0) > 0.5})


def show_requests(title: str, counts: Counter) -> None:
    writes = sum(v for (verb, _), v in counts.items() if verb in WRITE_VERBS)
    ours = sum(v for (verb, res), v in counts.items() if verb in WRITE_VERBS and res in OPERATOR_RESOURCES)
    print(f"  {title}: {sum(counts.values())} requests, {writes} writes ({ours} to what the operator writes: "
          f"{', '.join(sorted(OPERATOR_RESOURCES))})")
    for (verb, resource), v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"      {v:7d}  {verb:<7} {resource}")


def log_count(path: Path, offset: int, pattern: str) -> int:
    with open(path, "rb") as f:
        f.seek(offset)
        return sum(1 for line in f if pattern.encode() in line)


# --------------------------------------------------------------------------- phases
def floor_phase(args: argparse.Namespace, docs: list[dict], workdir: Path) -> dict:
    """The children applied directly; then, in the same cluster, the VLLMServers themselves (no operator
    runs): what creating the custom resources costs on its own."""
    with ControlPlane(workdir / "cp") as cp:
        kube = Kube(cp.api_client())
        children = render(docs)
        kinds = Counter(o["kind"] for o in children)
        ensure_namespaces(kube, {o["metadata"]["namespace"] for o in children})
        http_ = Http(cp)
        counts0 = http_.request_counts()
        seconds = apply_all(kube, children, args.workers)
        requests = diff(http_.request_counts(), counts0)
        load = _load()
        cp.kubectl("apply", "-f", str(CRD))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{api.PLURAL}.{api.GROUP}")
        servers_seconds = apply_all(kube, docs, args.workers, server_path)
        statuses = [floor_status(d) for d in docs]
        counts0 = http_.request_counts()
        status_seconds = apply_all(kube, statuses, args.workers, lambda o: server_path(o) + "/status")
        status_requests = diff(http_.request_counts(), counts0)
    return {"seconds": seconds, "objects": len(children), "kinds": dict(kinds), "load": load,
            "servers_seconds": servers_seconds, "status_seconds": status_seconds,
            "requests": {f"{a} {b}": c for (a, b), c in requests.items()},
            "status_requests": {f"{a} {b}": c for (a, b), c in status_requests.items()}}


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def operator_phase(args: argparse.Namespace, docs: list[dict], workdir: Path) -> dict:
    out: dict[str, Any] = {}
    with ControlPlane(workdir / "operator-cp") as cp:
        kube = Kube(cp.api_client())
        cp.kubectl("apply", "-f", str(CRD))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{api.PLURAL}.{api.GROUP}")
        ensure_namespaces(kube, {d["metadata"]["namespace"] for d in docs} | {"bench-warmup"})
        http_ = Http(cp)
        servers = Watcher(http_, SERVERS_PATH, server_summary)
        workloads = {kind: Watcher(http_, f"/apis/apps/v1/{kind}", lambda o: True)
                     for kind in ("statefulsets", "daemonsets")}
        for w in (servers, *workloads.values()):
            w.start()
        log = workdir / "operator.log"
        port = free_port()
        op = OperatorProcess(cp.kubeconfig, log, resync_seconds=args.resync,
                             extra_args=["--health-port", str(port), *args.operator_args.split()]).start()
        try:
            # Warm up: the operator is watching once it has reconciled one server.
            warm = json.loads(json.dumps(docs[0]))
            warm["metadata"] = {"name": "warmup", "namespace": "bench-warmup"}
            apply_all(kube, [warm], 1, server_path)
            assert servers.wait(lambda s: s.get(("bench-warmup", "warmup")), 120), op.log_tail()

            keys = [(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs]
            ds_keys = {k for k, d in zip(keys, docs) if d["spec"].get("workload") == "DaemonSet"}
            cpu0 = proc_status(op.proc.pid)["cpu"]
            counts0, own0 = http_.request_counts(), operator_metrics(port)
            t0 = time.monotonic()
            out["apply_seconds"] = apply_all(kube, docs, args.workers, server_path)

            def all_done(_state: dict) -> bool:
                return all(servers.state.get(k) for k in keys) and all(
                    k in workloads["daemonsets" if k in ds_keys else "statefulsets"].state for k in keys)

            ok = servers.wait(all_done, args.timeout)
            out["seconds"] = time.monotonic() - t0
            out["load"] = _load()
            out["converged"] = ok
            if not ok:
                out["not_converged"] = sum(1 for k in keys if not servers.state.get(k))
                print(op.log_tail(40), file=sys.stderr)
            out["cpu_converge"] = proc_status(op.proc.pid)["cpu"] - cpu0
            out["converge"] = diff(http_.request_counts(), counts0)
            out["converge_operator"] = diff(operator_metrics(port), own0)

            # Let the controller-manager's follow-up writes (pods, workload status) and the
            # operator's reconciles of them settle before measuring a quiet resync.
            settle(http_, args.resync)

            before, cpu0, offset = http_.request_counts(), proc_status(op.proc.pid)["cpu"], log.stat().st_size
            own0, wall0 = operator_metrics(port), time.time()
            time.sleep(args.resync + args.resync_margin)
            after = http_.request_counts()
            out["resync"] = diff(after, before)
            out["resync_operator"] = diff(operator_metrics(port), own0)
            out["resync_written"] = written_since(http_, wall0)
            out["resync_timers"] = log_count(log, offset, "Timer 'on_timer' succeeded")
            out["resync_window"] = args.resync + args.resync_margin
            out["cpu_resync"] = proc_status(op.proc.pid)["cpu"] - cpu0
            out["rss"] = proc_status(op.proc.pid)

            # A restart: every server is resumed. First with kopf's own ToggleSet (the baseline: its start-up
            # wait for the indices is quadratic, operator/vllm_operator/kopfext/toggles.py), then as shipped.
            for toggles in ("kopf", "ours"):
                op.stop()
                op.env[kopf_toggles.BASELINE_ENV] = toggles
                before, offset = http_.request_counts(), log.stat().st_size
                t1 = time.monotonic()
                op.start()
                wait_for(lambda: log_count(log, offset, "Resuming is processed") >= len(keys) + 1 or None,
                         args.timeout, "every server resumed", interval=1.0)
                suffix = "" if toggles == "ours" else "_kopf_toggles"
                out[f"restart_seconds{suffix}"] = time.monotonic() - t1
                out[f"restart{suffix}"] = diff(http_.request_counts(), before)
                out[f"rss_after_restart{suffix}"] = proc_status(op.proc.pid)

            # Background: the same window with no operator at all.
            op.stop()
            before = http_.request_counts()
            time.sleep(args.resync + args.resync_margin)
            out["background"] = diff(http_.request_counts(), before)
        finally:
            op.stop()
            for w in (servers, *workloads.values()):
                w.stopped = True
            out["log"] = str(log)
    return out


def settle(http_: Http, resync: float, quiet: float = 3.0, timeout: float = 300) -> None:
    """Wait until a `quiet`-second window sees no writes to the objects the operator owns."""
    deadline = time.monotonic() + timeout
    prev = http_.request_counts()
    quiet_windows = 0
    while time.monotonic() < deadline and quiet_windows < 2:  # two quiet windows in a row
        time.sleep(quiet)
        cur = http_.request_counts()
        writes = sum(v for (verb, res), v in diff(cur, prev).items()
                     if verb in WRITE_VERBS and (res in OPERATOR_RESOURCES or res.split("/")[0] == "pods"))
        prev = cur
        quiet_windows = quiet_windows + 1 if writes == 0 else 0


# --------------------------------------------------------------------------- main
def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="VLLMServers to create")
    ap.add_argument("--namespaces", type=int, default=5)
    ap.add_argument("--workers", type=int, default=8, help="client threads applying objects (floor and servers)")
    ap.add_argument("--resync", type=float, default=30.0, help="the operator's --resync-seconds")
    ap.add_argument("--resync-margin", type=float, default=10.0, help="seconds added to the no-op resync window")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--operator-args", default="", help="extra args for `vllm-operator run`")
    ap.add_argument("--skip-floor", action="store_true")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)

    docs = server_docs(args.n, args.namespaces)
    workdir = Path(tempfile.mkdtemp(prefix="vllm-operator-bench-"))
    print(f"scale benchmark: {args.n} VLLMServers over {args.namespaces} namespaces, {args.workers} client "
          f"workers; work dir {workdir}", flush=True)
    # The machine is shared: the floor runs before and after the operator phase, each on a fresh control
    # plane, and the ratio uses their mean; the load averages say how busy the machine was.
    floors = []
    if not args.skip_floor:
        floors.append(floor_phase(args, docs, workdir / "floor-1"))
        print(f"floor: {floors[0]['objects']} objects {floors[0]['kinds']} applied in {floors[0]['seconds']:.1f} s "
              f"(load {floors[0]['load']}); the {args.n} VLLMServers alone, no operator: "
              f"{floors[0]['servers_seconds']:.1f} s; one status write each: {floors[0]['status_seconds']:.1f} s",
              flush=True)
    op = operator_phase(args, docs, workdir)
    if not args.skip_floor:
        floors.append(floor_phase(args, docs, workdir / "floor-2"))
        print(f"floor again: applied in {floors[1]['seconds']:.1f} s (load {floors[1]['load']}); the VLLMServers "
              f"alone {floors[1]['servers_seconds']:.1f} s; one status write each: {floors[1]['status_seconds']:.1f} s",
              flush=True)
    floor = {key: sum(f[key] for f in floors) / len(floors) for key in ("seconds", "servers_seconds", "status_seconds")
             } | {"runs": floors} if floors else None

    mb = 2**20
    print(f"\noperator: {args.n} servers converged={op['converged']} in {op['seconds']:.1f} s "
          f"(their own apply took {op['apply_seconds']:.1f} s; operator CPU {op['cpu_converge']:.0f} s; "
          f"load {op['load']})")
    if floor:
        both = floor["seconds"] + floor["servers_seconds"]
        with_status = floor["seconds"] + floor["status_seconds"]
        print(f"  time vs floor 1, the children alone ({floor['seconds']:.1f} s, mean of {len(floor['runs'])}): "
              f"{op['seconds'] / floor['seconds']:.2f}x  (goal <= 1.5x)")
        print(f"  time vs floor 2, the children plus one status write per server ({with_status:.1f} s = "
              f"{floor['seconds']:.1f} + {floor['status_seconds']:.1f}): {op['seconds'] / with_status:.2f}x  "
              f"(goal <= 1.5x)")
        print(f"  vs floor 1 + creating the VLLMServers themselves ({both:.1f} s): {op['seconds'] / both:.2f}x; "
              f"vs floor 2 + creating them ({with_status + floor['servers_seconds']:.1f} s): "
              f"{op['seconds'] / (with_status + floor['servers_seconds']):.2f}x")
    print(f"  peak RSS (VmHWM): {op['rss']['VmHWM'] / mb:.0f} MB, RSS now {op['rss']['VmRSS'] / mb:.0f} MB "
          "(goal <= 200 MB)")
    show_requests("requests until converged (the client's own applies included)", op["converge"])
    if floor:
        print("    the floor's requests (first run; the children, then the status writes; the controller-manager's "
              "included):", floor["runs"][0]["requests"], floor["runs"][0]["status_requests"])
    writes: Counter = Counter()
    for (what, labels), v in op["converge_operator"].items():
        if what == "api_writes":
            writes[dict(kv.split("=", 1) for kv in labels.split(","))["resource"]] += v
    kopf_patches = op["converge"].get(("PATCH", "vllmservers"), 0)
    print("    the operator's writes per server until converged: "
          + ", ".join(f"{resource} {v / args.n:.2f}" for resource, v in sorted(writes.items()))
          + f"; kopf's patches of vllmservers {kopf_patches / args.n:.2f} (the API server's count)")
    print("    the operator's own counters until converged (its /metrics):")
    for (what, labels), v in sorted(op["converge_operator"].items()):
        print(f"      {v:7d}  {what} {labels}")
    print(f"  no-op resync window {op['resync_window']:.0f} s: {op['resync_timers']} timer runs, operator CPU "
          f"{op['cpu_resync']:.1f} s")
    show_requests("requests during the no-op resync", op["resync"])
    print("    the operator's own counters in that window (its /metrics):")
    for (what, labels), v in sorted(op["resync_operator"].items()):
        print(f"      {v:7d}  {what} {labels}")
    print("    objects written in that window, by field manager (their managedFields):",
          dict(op["resync_written"]) or "none")
    show_requests("background (same window, operator stopped)", op["background"])
    print(f"  restart: every server resumed in {op['restart_seconds']:.1f} s; peak RSS "
          f"{op['rss_after_restart']['VmHWM'] / mb:.0f} MB")
    print(f"  restart with kopf's own ToggleSet (baseline): {op['restart_seconds_kopf_toggles']:.1f} s, "
          f"{op['restart_seconds_kopf_toggles'] / op['restart_seconds']:.1f}x; peak RSS "
          f"{op['rss_after_restart_kopf_toggles']['VmHWM'] / mb:.0f} MB")
    show_requests("requests during the restart", op["restart"])
    print(f"  operator log: {op['log']}")
    if args.json:
        keyed = {k: ({f"{a} {b}": c for (a, b), c in v.items()} if isinstance(v, Counter) else v)
                 for k, v in op.items()}
        Path(args.json).write_text(json.dumps({"args": vars(args), "floor": floor, "operator": keyed}, indent=2))
    return 0 if op["converged"] else 1


if __name__ == "__main__":
    sys.exit(main())

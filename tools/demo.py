"""The README's main job: a local control plane, the operator, and an example VLLMServer.

    make demo                    # or: python -m tools.demo [EXAMPLE.yaml] [--once]

Starts etcd + kube-apiserver + kube-controller-manager (e2e/testbed/controlplane.py), installs
the CRD, starts `vllm-operator run`, applies the example and prints what the operator
created and the vLLM args it derived. There is no GPU or kubelet here, so a fake kubelet
(e2e/testbed/fakekubelet.py) binds the pods to a fake GPU node and marks them Running/Ready; no
vLLM process runs. Everything stays up until Ctrl-C (or exits at once with --once).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

import yaml

from e2e.testbed.controlplane import ControlPlane, wait_for
from e2e.testbed.convergence import install_crd
from e2e.testbed.fakekubelet import FakeKubelet
from e2e.testbed.operator_process import OperatorProcess
from vllm_operator import catalog

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EXAMPLE = ROOT / "examples" / "llama-8b-single-gpu.yaml"


def say(text: str) -> None:
    print(f"\n### {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("example", nargs="?", default=str(DEFAULT_EXAMPLE))
    parser.add_argument("--once", action="store_true", help="print and exit instead of waiting for Ctrl-C")
    args = parser.parse_args(argv)
    doc = yaml.safe_load(Path(args.example).read_text())
    name = doc["metadata"]["name"]
    ns = doc["metadata"].get("namespace", "default")
    written = (doc["spec"].get("gpu") or {}).get("product") or "NVIDIA-L4"
    match = catalog.match_gpu(written)  # the fake node carries the label GPU feature discovery would write
    product = match.products[0].product if match else written

    workdir = Path(tempfile.mkdtemp(prefix="vllm-operator-demo-"))
    say("starting a local control plane (etcd, kube-apiserver, kube-controller-manager)")
    with ControlPlane(workdir=workdir / "cp") as cp:
        print(f"kubeconfig: {cp.kubeconfig}")
        install_crd(cp)
        say(f"starting the operator (log: {workdir / 'operator.log'})")
        with OperatorProcess(cp.kubeconfig, workdir / "operator.log", resync_seconds=10) as op, \
                FakeKubelet(cp.api_client(), node_name="gpu-node-1", gpu_product=product):
            say(f"kubectl apply -f {args.example}")
            print(cp.kubectl("apply", "-f", args.example).stdout.strip())

            def ready() -> bool:
                out = cp.kubectl("get", "vllms", name, "-n", ns, "-o",
                                 "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}", check=False)
                return out.stdout.strip() == "True"

            try:
                wait_for(ready, 90, f"VLLMServer {name} Ready")
            except TimeoutError as e:
                print(f"{e}\n--- operator log ---\n{op.log_tail(40)}", file=sys.stderr)
                return 1
            say("kubectl get vllms,statefulsets,daemonsets,services,pods")
            print(cp.kubectl("get", "vllms,statefulsets,daemonsets,services,pods", "-n", ns, "-o", "wide").stdout)
            say(f"what the operator derived (kubectl get vllms {name} -o jsonpath='{{.status.plan}}')")
            plan = yaml.safe_load(cp.kubectl("get", "vllms", name, "-n", ns, "-o", "jsonpath={.status.plan}").stdout)
            print("vllm serve " + " ".join(plan["args"]))
            for note in plan.get("notes", []):
                print(f"  - {note}")
            say("conditions")
            print(cp.kubectl("get", "vllms", name, "-n", ns, "-o",
                             "jsonpath={range .status.conditions[*]}{.type}={.status} ({.reason}): {.message}{\"\\n\"}{end}"
                             ).stdout)
            if args.once:
                return 0
            say(f"running. Try: export KUBECONFIG={cp.kubeconfig}; kubectl get vllms -A; "
                f"kubectl scale vllms {name} -n {ns} --replicas 3. Ctrl-C stops everything.")
            stop = threading.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
            while not stop.wait(1):
                if not op.alive():
                    print("the operator exited:\n" + op.log_tail(40), file=sys.stderr)
                    return 1
            say("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())

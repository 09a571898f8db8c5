"""docs/troubleshooting.md's procedures, as written, on the test bed's real API server and kube-controller-manager
(its garbage collector): no operator runs, which is the situation they are for."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from e2e.testbed.controlplane import wait_for
from vllm_operator import operator_main
from vllm_operator.controller.reconcile import Reconciler

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "troubleshooting.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end > 0 else None]


def test_a_server_stuck_deleting_goes_with_the_documented_patch_and_leaves_nothing(control_plane, crd_installed,
                                                                                  namespace, kube):
    """"A server stuck deleting": the operator's finalizer (the name the docs give) holds a deleted server while no
    operator runs; the documented `kubectl patch` releases it, and the garbage collector deletes its children."""
    section = _section("A server stuck deleting")
    assert f"`{operator_main.FINALIZER}`" in section
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["metadata"] = {"name": "stuck", "namespace": namespace, "finalizers": [operator_main.FINALIZER]}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
    Reconciler(kube).reconcile(namespace, "stuck")  # what the operator did while it ran: the children
    control_plane.kubectl("get", "statefulset,service", "stuck", "-n", namespace)

    control_plane.kubectl("delete", "vllms", "stuck", "-n", namespace, "--wait=false")
    held = json.loads(control_plane.kubectl("get", "vllms", "stuck", "-n", namespace, "-o", "json").stdout)
    assert held["metadata"].get("deletionTimestamp") and held["metadata"]["finalizers"] == [operator_main.FINALIZER]

    [patch] = [line for line in section.splitlines() if line.startswith("kubectl patch vllms")]
    argv = [namespace if a == "<namespace>" else "stuck" if a == "<name>" else a for a in shlex.split(patch)]
    assert re.search(r"<\w+>", " ".join(argv)) is None, argv
    control_plane.kubectl(*argv[1:])
    wait_for(lambda: control_plane.kubectl("get", "vllms", "stuck", "-n", namespace, check=False).returncode != 0,
             60, "the server gone once its finalizer is removed")
    for kind in ("statefulset", "service"):
        wait_for(lambda: control_plane.kubectl("get", kind, "stuck", "-n", namespace, check=False).returncode != 0,
                 120, f"its {kind} garbage-collected (owner references)")

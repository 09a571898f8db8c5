"""The strategic-merge subset (strategic_merge.py) merges as Kubernetes does: compared with `kubectl patch --local
--type=strategic` of the test bed's kubectl.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e.testbed.controlplane import KUBECTL
from vllm_operator import strategic_merge
from tests.unit.test_escape_hatches import POD, PATCHES

ROOT = Path(__file__).resolve().parents[2]


def kubectl_patch(original: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    pod = {"apiVersion": "v1", "kind": "Pod", **json.loads(json.dumps(original))}
    pod["metadata"]["name"] = "p"
    p = subprocess.run([KUBECTL, "patch", "--local", "-f", "-", "--type=strategic", "-p", json.dumps(patch),
                        "-o", "json"], input=json.dumps(pod), capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    out["metadata"].pop("name")
    return {"metadata": out["metadata"], "spec": out["spec"]}


@pytest.mark.skipif(not Path(KUBECTL).exists(), reason="the test bed's kubectl is not built")
@pytest.mark.parametrize("patch", PATCHES, ids=[str(i) for i in range(len(PATCHES))])
def test_the_subset_merges_as_kubernetes_does(patch):
    assert strategic_merge.apply(POD, patch) == kubectl_patch(POD, patch)

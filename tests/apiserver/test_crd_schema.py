"""The CRD's schema on the real API server refuses wrong types and enums."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.testbed.operator_install import load_example as example

pytestmark = pytest.mark.apiserver

ROOT = Path(__file__).resolve().parents[2]


def test_schema_rejects_wrong_types_and_enums(control_plane, crd_installed, namespace):
    for change, needle in (({"workload": "Deployment"}, "workload"), ({"replicas": "two"}, "replicas"),
                           ({"gpu": {"count": 0}}, "gpu.count"), ({"ipc": "Shared"}, "ipc")):
        doc = example("schema", namespace)
        doc["spec"].update(change)
        # --validate=false: the API server's own schema check answers, not kubectl's
        p = control_plane.kubectl("apply", "--validate=false", "-f", "-", input=json.dumps(doc), check=False)
        assert p.returncode != 0, change
        assert needle in p.stderr, p.stderr
    doc = example("schema", namespace)
    del doc["spec"]["model"]["name"]
    p = control_plane.kubectl("apply", "--validate=false", "-f", "-", input=json.dumps(doc), check=False)
    assert p.returncode != 0 and "spec.model.name" in p.stderr and "Required value" in p.stderr, p.stderr

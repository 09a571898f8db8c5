"""A tenant's spec cannot stop or mislead the operator: values out of any sane range end as a problem naming
the field, never an exception out of the planner (the rest of the tenant-safety suite lands with the fetch
helper on the tenant-safety branch)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_operator import pipeline

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- quantities
@pytest.mark.parametrize("path", [("gpu", "memory"), ("gpu", "reservedMemory"), ("shmSize",), ("cache", "size"),
                                  ("resources", "requests", "memory"), ("resources", "limits", "cpu")])
@pytest.mark.parametrize("value", ["1e400", "1e-400", "1e1.5", "1e9999999", "9" * 400])
def test_a_quantity_out_of_range_is_a_problem_naming_the_field(path, value):
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    node = doc["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    spec, errors = pipeline.parse_spec(doc["spec"])  # the operator's way; the current code raised OverflowError,
    assert spec is None                              # decimal.Overflow or decimal.InvalidOperation in the planner
    assert [e.split(":", 1)[0] for e in errors] == ["spec." + ".".join(path)]
    assert "out of range" in errors[0]
    [document] = pipeline.load_documents(yaml.safe_dump(doc))  # the CLI's
    assert [e.split(":", 1)[0] for e in document.errors] == ["spec." + ".".join(path)]

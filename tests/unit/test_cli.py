"""The offline CLI: `vllm-operator plan` and `render`, with good input and with the mistakes
a new user makes. Bad inputs live in tests/data/bad/ (one small file per mistake) so they
can be tried by hand: `vllm-operator plan tests/data/bad/typo-spec-modle.yaml`.

Most tests call `vllm_operator.cli.main([...])` in-process (capsys); a few run the
installed console script to check the entry point itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_operator import cli, documents, pipeline

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BAD = Path(__file__).resolve().parents[1] / "data" / "bad"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def example_fits(path: Path) -> bool:
    [doc] = documents.load_documents(path.read_text())
    s = doc.server
    return pipeline.plan_server(s.metadata.name, s.metadata.namespace, s.spec).fits


# --------------------------------------------------------------------------- plan
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_plan_table(capsys, path):
    assert example_fits(path), "every shipped example must fit"
    rc, out, err = run(capsys, "plan", str(path))
    assert rc == 0, err
    assert err == ""
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    assert f"default/{name}:" in out and "[fits]" in out
    for needle in ("memory per GPU", "--gpu-memory-utilization", "--max-model-len", "--max-num-seqs",
                   "--max-num-batched-tokens", "capacity", "KV tokens", "args: vllm serve"):
        assert needle in out, needle
    assert "ERROR" not in out


EXPECTED_ESTIMATES = ("weightBytesPerGpu", "kvBytesPerToken", "kvCacheTokens", "maxModelLen", "maxConcurrency",
                      "gpuMemoryUtilization")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_plan_json(capsys, path):
    rc, out, err = run(capsys, "plan", str(path), "-o", "json")
    assert rc == 0, err
    [p] = json.loads(out)
    assert p["name"] == yaml.safe_load(path.read_text())["metadata"]["name"]
    assert p["fits"] is True and p["problems"] == []
    args, est = p["args"], p["estimates"]
    assert args and args[0] == yaml.safe_load(path.read_text())["spec"]["model"]["name"]
    for key in EXPECTED_ESTIMATES:
        assert est[key], key
    assert args[args.index("--max-model-len") + 1] == str(est["maxModelLen"])
    assert float(args[args.index("--gpu-memory-utilization") + 1]) == pytest.approx(est["gpuMemoryUtilization"])
    assert est["maxModelLen"] <= est["kvCacheTokens"]
    assert est["maxConcurrency"] == pytest.approx(est["kvCacheTokens"] / est["maxModelLen"], abs=0.01)
    assert {d["flag"] for d in p["decisions"]} >= {"--max-model-len", "--gpu-memory-utilization"}


def test_plan_json_reports_problems(capsys):
    rc, out, _ = run(capsys, "plan", str(BAD / "model-does-not-fit.yaml"), "-o", "json")
    assert rc == 1
    [p] = json.loads(out)
    assert p["fits"] is False and p["args"] == []
    assert any(msg.startswith("spec.gpu:") for msg in p["problems"])


def test_plan_reads_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", open(EXAMPLES[0]))
    rc, out, _ = run(capsys, "plan", "-")
    assert rc == 0 and "[fits]" in out


def test_several_documents_one_bad(capsys, tmp_path):
    f = tmp_path / "two.yaml"
    f.write_text(EXAMPLES[0].read_text() + "\n---\n" + (BAD / "tp-does-not-divide-heads.yaml").read_text())
    rc, out, err = run(capsys, "plan", str(f))
    assert rc == 1
    assert "[fits]" in out and "DOES NOT FIT" in out
    assert "three-gpus: spec.gpu.count" in err


# --------------------------------------------------------------------------- render
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_render_is_valid_multidoc_yaml(capsys, path):
    rc, out, err = run(capsys, "render", str(path))
    assert rc == 0, err
    docs = list(yaml.safe_load_all(out))
    assert len(docs) >= 2
    kinds = [d["kind"] for d in docs]
    assert "Service" in kinds and ("StatefulSet" in kinds or "DaemonSet" in kinds or "LeaderWorkerSet" in kinds)
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"] and d["metadata"]["namespace"]


def test_crd(capsys):
    rc, out, _ = run(capsys, "crd")
    assert rc == 0
    crd = yaml.safe_load(out)
    assert crd["kind"] == "CustomResourceDefinition"


# --------------------------------------------------------------------------- bad input
# file -> what the one-line message must say (the field path first, then the gist).
BAD_CASES = {
    "yaml-syntax-error.yaml": ["YAML error: line 9", "indentation", "servedName"],
    "typo-spec-modle.yaml": ["spec.modle: unknown field", "did you mean 'model'"],
    "typo-model-nmae.yaml": ["spec.model.nmae: unknown field", "did you mean 'name'"],
    "wrong-type-replicas.yaml": ["spec.replicas:", "integer", "'two'"],
    "missing-model-name.yaml": ["spec.model.name: required field is missing"],
    "tp-does-not-divide-heads.yaml": ["spec.gpu.count:", "32 attention heads", "1, 2, 4, 8, 16"],
    "model-does-not-fit.yaml": ["spec.gpu:", "does not fit", "gpu.count: 8", "quantized"],
    "context-too-long.yaml": ["spec.workloadProfile.maxContextTokens:", "1000000", "131072"],
    "plaintext-hf-token.yaml": ["spec.engine.env[0]:", "credential", "hfTokenSecretRef"],
    "autoscaling-daemonset.yaml": ["spec.autoscaling.enabled:", "StatefulSet"],
    "unknown-extra-arg.yaml": ["spec.engine.extraArgs[0]:", "has no flag --max-batch-size", "crash-loop"],
    "unknown-model-no-architecture.yaml": [
        "spec.model.architecture:", "example-org/mystery-model-13b", "numLayers", "numAttentionHeads", "hiddenSize",
        "maxPositionEmbeddings", "vocabSize", "configURL",
    ],
}


def test_every_bad_file_has_a_case():
    assert sorted(p.name for p in BAD.glob("*.yaml")) == sorted(BAD_CASES)


@pytest.mark.parametrize("command", ["plan", "render"])
@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_bad_input_is_one_clear_message(capsys, command, name):
    path = BAD / name
    rc, out, err = run(capsys, command, str(path))
    assert rc == 1
    assert "Traceback" not in err and "Traceback" not in out
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, "no message on stderr"
    assert all(line.startswith(f"{path}: ") for line in lines), lines
    assert len(set(lines)) <= 2, lines  # one mistake, one (at most two) lines
    text = " ".join(lines)
    for needle in BAD_CASES[name]:
        assert needle in text, f"{needle!r} not in {text!r}"
    if command == "render":
        assert out.strip() in ("", "[]", "{}")


@pytest.mark.parametrize("command", ["plan", "render"])
def test_missing_file(capsys, command, tmp_path):
    missing = tmp_path / "nope.yaml"
    rc, out, err = run(capsys, command, str(missing))
    assert rc == 1
    assert err.strip() == f"{missing}: No such file or directory"
    assert "Traceback" not in err


@pytest.mark.parametrize("content", [b"", b"# only a comment\n", b"\xff\xfe\x00\x01", b"- a\n- b\n", b"kind: Pod\n"])
def test_odd_files(capsys, tmp_path, content):
    f = tmp_path / "odd.yaml"
    f.write_bytes(content)
    rc, _, err = run(capsys, "plan", str(f))
    assert rc == 1
    assert err.strip() and "Traceback" not in err


def test_unknown_option_is_argparse_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["plan", str(EXAMPLES[0]), "--bogus"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


# --------------------------------------------------------------------------- the console script
def _console_script() -> str:
    script = shutil.which("vllm-operator") or str(Path(sys.executable).parent / "vllm-operator")
    assert Path(script).exists(), "the vllm-operator console script is not installed (pip install -e .)"
    return script


def test_console_script_plan():
    proc = subprocess.run([_console_script(), "plan", "examples/llama-8b-single-gpu.yaml"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "default/llama-8b:" in proc.stdout and "[fits]" in proc.stdout
    assert "args: vllm serve meta-llama/Llama-3.1-8B-Instruct" in proc.stdout


def test_console_script_bad_input():
    proc = subprocess.run([_console_script(), "render", "tests/data/bad/typo-spec-modle.yaml"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "spec.modle: unknown field (did you mean 'model'?)" in proc.stderr


def test_plan_takes_several_files_and_directories(capsys, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "nested").mkdir()
    shutil.copy(ROOT / "tests" / "data" / "bad" / "typo-spec-modle.yaml", bad / "nested" / "a.yml")
    shutil.copy(ROOT / "tests" / "data" / "bad" / "missing-model-name.yaml", bad / "b.yaml")
    (bad / "README.txt").write_text("not a manifest")
    code, out, err = run(capsys, "plan", str(ROOT / "examples"), str(EXAMPLES[0]), str(bad))
    assert code == 1
    assert out.count("args: vllm serve") == len(EXAMPLES) + 1  # the directory's examples, then the file again
    lines = err.splitlines()
    assert lines == [f"{bad / 'b.yaml'}: nameless: spec.model.name: required field is missing",
                     f"{bad / 'nested' / 'a.yml'}: typo: spec.modle: unknown field (did you mean 'model'?)"]
    code, out, err = run(capsys, "render", str(ROOT / "examples"))
    assert code == 0 and err == "" and len([d for d in yaml.safe_load_all(out) if d]) > len(EXAMPLES)


def test_each_problem_is_one_line_once(capsys, tmp_path):
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["workloadProfile"]["maxContextTokens"] = 10_000_000  # beyond the model and the GPU
    doc["spec"]["engine"] = {"extraArgs": ["--max-model-len", "5"]}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run(capsys, "plan", str(path))
    lines = err.splitlines()
    assert code == 1 and len(lines) >= 2 and len(set(lines)) == len(lines)
    assert all(line.startswith(f"{path}: llama-8b: spec.") for line in lines), lines
    assert "ERROR" not in out and f"{len(lines)} problems: see the error output" in out


def test_catalog_lists_models_and_gpus(capsys):
    from vllm_operator import catalog

    code, out, _ = run(capsys, "catalog")
    assert code == 0
    for name in catalog.known_models():
        assert f"\n{name} " in out
    assert "NVIDIA-L4 " in out and "L4" in out.split("NVIDIA-L4 ", 1)[1].splitlines()[0]
    code, out, _ = run(capsys, "catalog", "gpus", "-o", "json")
    gpus = json.loads(out)["gpus"]
    assert code == 0 and len(gpus) == len(catalog.known_gpus()) and "models" not in json.loads(out)
    l4 = next(g for g in gpus if g["product"] == "NVIDIA-L4")
    assert l4["computeCapability"] == "8.9" and l4["fp8"] and l4["source"]


def test_version(capsys):
    from vllm_operator import __version__, vllm_flags

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith(f"vllm-operator {__version__} ") and vllm_flags.VERSION in out


def test_an_image_release_without_a_snapshot_is_a_warning_not_a_refusal(capsys, tmp_path):
    """plan shows the loose check's warning (table and JSON), render prints it on stderr and still renders."""
    doc = yaml.safe_load(EXAMPLES[0].read_text())
    doc["spec"]["image"] = "vllm/vllm-openai:v0.35.1"
    doc["spec"].setdefault("engine", {})["extraArgs"] = ["--a-flag-of-0-35", "1"]
    f = tmp_path / "newer.yaml"
    f.write_text(yaml.safe_dump(doc))
    name = doc["metadata"]["name"]
    rc, out, err = run(capsys, "plan", str(f))
    assert rc == 0 and "note: warning: image vllm/vllm-openai:v0.35.1 runs vLLM 0.35.1" in out and not err
    rc, out, _ = run(capsys, "plan", "-o", "json", str(f))
    [check] = [p["flagCheck"] for p in json.loads(out)]
    assert rc == 0 and check["imageRelease"] == "0.35.1" and not check["exact"]
    assert check["unchecked"] == ["--a-flag-of-0-35"] and "passed unchecked: --a-flag-of-0-35" in check["warning"]
    rc, out, err = run(capsys, "render", str(f))
    assert rc == 0 and any(o["kind"] == "StatefulSet" for o in yaml.safe_load_all(out) if o)
    assert err.startswith(f"{f}: {name}: warning: image vllm/vllm-openai:v0.35.1 runs vLLM 0.35.1")

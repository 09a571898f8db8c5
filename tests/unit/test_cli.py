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
    assert "[fits]" in out and "[INVALID SPEC]" in out  # 3 GPUs for 32 heads: not a memory problem
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


# --------------------------------------------------------------------------- issue 20: the first hour's CLI
def _without_namespace(tmp_path: Path, namespace: str | None = None) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["metadata"].pop("namespace", None)
    if namespace:
        doc["metadata"]["namespace"] = namespace
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _namespaces(out: str) -> set[str]:
    return {d["metadata"]["namespace"] for d in yaml.safe_load_all(out)}


def test_render_without_a_namespace_uses_n_or_the_kube_context_and_says_so(capsys, tmp_path, monkeypatch):
    path = _without_namespace(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    rc, out, err = run(capsys, "render", str(path))
    assert rc == 0 and _namespaces(out) == {"default"}
    assert "no metadata.namespace: planned in 'default'" in err and "-n to choose" in err
    rc, out, err = run(capsys, "render", "-n", "team-a", str(path))
    assert rc == 0 and _namespaces(out) == {"team-a"} and err == ""
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump({
        "current-context": "work", "contexts": [{"name": "work", "context": {"cluster": "c", "namespace": "team-b"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    rc, out, err = run(capsys, "render", str(path))
    assert rc == 0 and _namespaces(out) == {"team-b"} and "the kubeconfig's current context's namespace" in err


def test_a_document_namespace_and_another_n_are_refused_as_kubectl_does(capsys, tmp_path):
    path = _without_namespace(tmp_path, "team-a")
    rc, out, err = run(capsys, "render", "-n", "team-b", str(path))
    assert rc == 1 and out.strip() == "" and "does not match -n 'team-b'" in err
    rc, out, _ = run(capsys, "render", "-n", "team-a", str(path))
    assert rc == 0 and _namespaces(out) == {"team-a"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_render_json_is_the_yaml_render_as_a_list_and_neither_has_anchors(capsys, path):
    rc, out_yaml, _ = run(capsys, "render", str(path))
    assert rc == 0 and "&id" not in out_yaml and "*id" not in out_yaml
    rc, out_json, _ = run(capsys, "render", "-o", "json", str(path))
    assert rc == 0
    listed = json.loads(out_json)
    assert listed["kind"] == "List" and listed["items"] == list(yaml.safe_load_all(out_yaml))


def test_a_local_config_goes_through_model_config_not_config_url(capsys, tmp_path):
    """Issue 20 item 3: the operator refuses a configURL that is not http(s), so `plan` does too, and names the flag
    that reads a local config.json."""
    config = tmp_path / "config.json"
    config.write_text((ROOT / "tests" / "data" / "configs" / "Qwen2-7B-Instruct.config.json").read_text())
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"] = {"name": "acme/local-7b", "configURL": str(config)}
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(doc))
    rc, _, err = run(capsys, "plan", "--offline", str(path))
    assert rc == 1 and "spec.model.configURL: must be an http(s) URL" in err and "--model-config PATH" in err
    del doc["spec"]["model"]["configURL"]
    path.write_text(yaml.safe_dump(doc))
    rc, out, err = run(capsys, "plan", "--offline", "--model-config", str(config), str(path))
    assert rc == 0, err
    assert f"config.json ({config})" in out


def test_an_annotation_the_crd_bounds_is_refused_by_plan(capsys, tmp_path):
    """Issue 20 item 3: the CRD's bounds (a value's length, a map's entries) are the API server's; `plan` applies
    them from the same schema."""
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["podAnnotations"] = {"big": "x" * 300_000, **{f"k{i}": "v" for i in range(64)}}
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(doc))
    rc, _, err = run(capsys, "plan", str(path))
    assert rc == 1
    assert "spec.podAnnotations: may not have more than 64 entries (it has 65)" in err
    assert "spec.podAnnotations.big: may not be longer than 4096 characters (it has 300000)" in err


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_one_kv_figure_per_plan(capsys, path):
    """Issue 20 item 6: the KV cache's size in --max-model-len's reason is the capacity line's (the Gemma 3 example
    said 418,224 in the reason, the longest request its sliding-window layers hold, and 278,998 as capacity)."""
    import re

    rc, out, _ = run(capsys, "plan", str(path))
    assert rc == 0
    [capacity] = re.findall(r"capacity(?: per group)?: ([\d,]+) KV tokens", out)
    [reason] = re.findall(r"the KV cache \(?(?:holds )?([\d,]+) tokens", out)
    assert reason == capacity


@pytest.mark.parametrize(("model", "gpu", "header", "reason"), [
    ("meta-llama/Llama-3.3-70B-Instruct", {"count": 1, "product": "NVIDIA-L4"}, "[DOES NOT FIT]", "DoesNotFit"),
    ("meta-llama/Llama-3.1-8B-Instruct", {"count": 3, "product": "NVIDIA-L4"}, "[INVALID SPEC]", "InvalidSpec"),
    ("meta-llama/Llama-3.1-8B-Instruct", {"count": 1, "product": "H100x"}, "[GPU UNKNOWN]", "GPUUnknown"),
    ("acme/unknown-7b", {"count": 1, "product": "NVIDIA-L4"}, "[MODEL UNKNOWN]", "ModelUnknown"),
])
def test_the_header_names_the_kind_of_problem(capsys, tmp_path, model, gpu, header, reason):
    """Issue 20 item 6: [DOES NOT FIT] heads memory problems only; the others say what they are, in the words of
    the reasons the cluster shows (api.SPEC_REASONS)."""
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"], doc["spec"]["gpu"] = {"name": model}, gpu
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(doc))
    rc, out, _ = run(capsys, "plan", "--offline", str(path))
    assert rc == 1 and header in out.splitlines()[0]
    rc, out, _ = run(capsys, "plan", "--offline", "-o", "json", str(path))
    assert json.loads(out)[0]["problemKinds"] == [reason]  # the reason SpecValid and Ready carry in the cluster


def test_a_model_too_large_is_told_what_would_fit_not_a_smaller_batch(capsys, tmp_path):
    """Issue 20 item 6: a 70B model on one L4: more GPUs, a bigger GPU, quantization; a smaller
    maxNumBatchedTokens would not help when the weights alone overflow the budget."""
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"], doc["spec"]["gpu"] = {"name": "meta-llama/Llama-3.3-70B-Instruct"}, {"count": 1,
                                                                                               "product": "NVIDIA-L4"}
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(doc))
    _, _, err = run(capsys, "plan", "--offline", str(path))
    assert "more GPUs (gpu.count: 8" in err and "a GPU with more memory" in err and "4-bit weights" in err
    assert "maxNumBatchedTokens" not in err


def test_min_replicas_below_one_is_told_in_words(capsys, tmp_path):
    doc = yaml.safe_load((ROOT / "examples" / "llama-3b-autoscaled.yaml").read_text())
    doc["spec"]["autoscaling"]["minReplicas"] = -1
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(doc))
    rc, _, err = run(capsys, "plan", "--offline", str(path))
    assert rc == 1 and "spec.autoscaling.minReplicas: replicas cannot be negative" in err
    assert "docs/scale-to-zero.md" in err and "greater than or equal" not in err
    doc["spec"]["autoscaling"]["minReplicas"] = 0  # scale to zero: it needs the picker's signal to wake
    path.write_text(yaml.safe_dump(doc))
    rc, _, err = run(capsys, "plan", "--offline", str(path))
    assert rc == 1 and "routing.inferencePool.enabled" in err


def _unknown(tmp_path: Path, architecture: dict | None = None) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"] = {"name": "acme/unknown-7b", **({"architecture": architecture} if architecture else {})}
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_outside_the_catalog_the_message_names_offline_a_mirror_and_a_local_config(capsys, tmp_path):
    rc, _, err = run(capsys, "plan", "--offline", str(_unknown(tmp_path)))
    assert rc == 1
    for words in ("--model-config PATH", "spec.model.configURL", "--hf-endpoint URL", "--offline",
                  "under spec.model.architecture"):
        assert words in err, words


def test_a_hub_that_fails_is_a_note_with_how_to_plan_without_it(capsys, tmp_path):
    """Issue 20 item 6: the Hub's failure is said, with how to plan offline or against a mirror (port 9 of the
    loopback: nothing listens, the lookup fails at once)."""
    path = _unknown(tmp_path, {"numLayers": 32, "numAttentionHeads": 32, "hiddenSize": 4096, "intermediateSize": 11008,
                               "vocabSize": 32000, "maxPositionEmbeddings": 32768})
    rc, out, err = run(capsys, "plan", "--hf-endpoint", "http://127.0.0.1:9", str(path))
    assert rc == 0, err
    [note] = [line for line in out.splitlines() if "the Hub at http://127.0.0.1:9" in line]
    assert "planned from spec.model.architecture" in note and "--offline" in note and "--hf-endpoint URL" in note


def test_plan_takes_the_operators_url_settings(capsys, tmp_path):
    """docs/security.md: `plan` refuses a configURL outside the operator's allowed URLs (by default the public Hub
    and --hf-endpoint), and --allowed-config-url allows it as it does on `run` (then the fetch itself fails here:
    nothing listens on port 9 of the loopback)."""
    doc = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
    doc["spec"]["model"] = {"name": "acme/x", "configURL": "http://127.0.0.1:9/x/config.json"}
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(doc))
    rc, _, err = run(capsys, "plan", "--offline", str(path))
    assert rc == 1 and "the operator fetches only under the URLs its settings allow" in err
    rc, _, err = run(capsys, "plan", "--offline", "--allowed-config-url", "http://127.0.0.1:9/x", str(path))
    assert rc == 1 and "settings allow" not in err and "spec.model.configURL: could not fetch" in err

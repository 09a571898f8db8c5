"""What README.md and docs/ promise in so many words, held to the code (issue 20: every sentence that promises
behaviour has a test). The larger claims have their own tests, named where the docs make them."""

from __future__ import annotations

import json
import re
import shlex
import socket
from pathlib import Path

import yaml

from vllm_operator import cli

ROOT = Path(__file__).resolve().parents[2]


def _block_after(text: str, words: str) -> list[str]:
    """The lines of the first ```bash block after `words`."""
    start = text.index(words)
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    assert block, f"no bash block after {words!r}"
    return block.group(1).splitlines()


def test_the_readme_offline_commands_run_with_no_cluster_and_no_network_as_their_comments_say(capsys, monkeypatch,
                                                                                              tmp_path):
    """README: "Offline, with no cluster at all": each `vllm-operator` line as written (no kubeconfig; any
    connection attempt fails the test), its output what the comment beside it says."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.chdir(ROOT)

    def no_network(self, address):
        raise AssertionError(f"the offline command connected to {address}")
    monkeypatch.setattr(socket.socket, "connect", no_network)

    lines = _block_after((ROOT / "README.md").read_text(), "Offline, with no cluster at all")
    commands = {}
    for line in lines:
        command, _, comment = line.partition("#")
        argv = shlex.split(command)
        if argv[:1] != ["vllm-operator"]:
            continue
        assert cli.main(argv[1:]) == 0, (line, capsys.readouterr().err)
        commands[argv[1]] = (capsys.readouterr().out, comment)
    assert set(commands) == {"plan", "render", "catalog"}, commands

    out, comment = commands["plan"]
    assert "memory per GPU, flags and why, capacity" in comment
    assert "memory per GPU" in out and "\n  flags\n" in out and "\n  capacity: " in out
    assert re.search(r"^    --tensor-parallel-size 2 +\S", out, re.M), out  # each flag with its reason

    out, comment = commands["render"]
    assert "every Kubernetes object, as YAML" in comment
    kinds = [doc["kind"] for doc in yaml.safe_load_all(out) if doc]
    assert {"StatefulSet", "Service", "PodDisruptionBudget"} <= set(kinds), kinds

    out, comment = commands["catalog"]
    assert "the built-in models and GPUs" in comment
    assert out.startswith("MODEL ") and "\nGPU " in out and "NVIDIA-L4 " in out, out[:200]
    assert "-o json" in comment and "catalog gpus: GPUs only" in comment
    assert cli.main(["catalog", "-o", "json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"models", "gpus"}
    assert cli.main(["catalog", "gpus"]) == 0
    gpus_only = capsys.readouterr().out
    assert gpus_only.startswith("GPU ") and "MODEL " not in gpus_only


def _reasons_in_the_package() -> set[str]:
    """Every string literal of the operator's package that looks like a condition reason (CamelCase)."""
    found: set[str] = set()
    for path in (ROOT / "operator" / "vllm_operator").rglob("*.py"):
        found |= set(re.findall(r"[\"']([A-Z][A-Za-z]+)[\"']", path.read_text()))
    return found


def test_the_troubleshooting_docs_reasons_are_the_operators():
    """docs/troubleshooting.md's REASON table names reasons the operator sets (a renamed reason would send a
    reader to a row that never shows), and docs/failures.md has a row for each."""
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    table = text[text.index("| `REASON` |"):text.index("## The operator's logs")]
    named = set(re.findall(r"`([A-Z][A-Za-z]+)`", table)) - {"REASON"}
    assert {"InvalidSpec", "DoesNotFit", "NoReplicasReady", "NameConflict", "OOMKilled"} <= named, named
    missing = named - _reasons_in_the_package()
    assert not missing, f"docs/troubleshooting.md names reasons the operator never sets: {missing}"
    failures = (ROOT / "docs" / "failures.md").read_text()
    undocumented = {r for r in named - {"NoReplicasReady"} if f"`{r}`" not in failures}
    assert not undocumented, f"docs/failures.md has no row for {undocumented}"


def test_the_install_docs_run_commands_parse_as_written():
    """docs/install.md "Running the operator outside the cluster": each `vllm-operator run` line (continuations
    joined, comments dropped) is what the run command accepts, and -n twice watches both namespaces."""
    text = (ROOT / "docs" / "install.md").read_text()
    lines = " \n".join(_block_after(text, "## Running the operator outside the cluster")).replace("\\ \n", " ")
    runs = [shlex.split(line.partition("#")[0]) for line in lines.split(" \n") if line.startswith("vllm-operator run")]
    assert len(runs) == 3, runs
    parser = cli.build_parser()
    parsed = [parser.parse_args(argv[1:]) for argv in runs]
    assert parsed[1].namespace == ["team-a", "team-b"]
    assert (parsed[2].log_format, parsed[2].resync_seconds, parsed[2].hf_endpoint) == (
        "json", 60, "https://hf-mirror.corp.example")
    assert parser.parse_args(["run", "--offline"]).offline

"""The README's "Quickstart on a GPU cluster", held to the code it names.

bash runs the quickstart's commands exactly as a reader pastes them, with helm, kubectl, curl and
sleep on PATH as recorders: what they receive is what the reader's tools would (and any other
command fails). Each command is then checked against what it names, computed by the real thing
rather than re-derived: the example through `vllm-operator plan` and `vllm-operator render`, the
chart through Helm's own code, the release workflow's OCI location and the chart's version, the
CRD's names and the conditions the operator sets. The chart is packaged and pushed as the release
workflow does, to a real OCI registry on loopback in ghcr.io's place, and the README's reference
pulls it back. On the test bed's API server the kubectl commands run for real (the operator as a
process, a fake kubelet for the L4 node), and the curl runs against a real vLLM serving the
example's model name.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from vllm_operator import api, generate
from vllm_operator import server_status

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yaml"
CHART = ROOT / generate.CHART
HEADING = "## Quickstart on a GPU cluster"
RECORDED = ("helm", "kubectl", "curl", "sleep")


# --------------------------------------------------------------------------- reading the README
def quickstart() -> str:
    text = README.read_text()
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return text[start:end if end != -1 else len(text)]


def shell_text(section: str) -> str:
    """The section's ```bash blocks, then its inline `helm install ...` alternatives, as one script."""
    blocks = [textwrap.dedent(b) for b in re.findall(r"^[ \t]*```bash\n(.*?)^[ \t]*```", section, re.S | re.M)]
    inline = re.findall(r"`(helm install [^`]+)`", section)
    return "\n".join(blocks + inline) + "\n"


def record(script: str, workdir: Path) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """Run `script` in bash with only recorders on PATH; returns bash's result and every argv, in order."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    log = workdir / "argv.jsonl"
    for name in RECORDED:
        stub = bin_dir / name
        stub.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                        "with open(os.environ['QUICKSTART_ARGV'], 'a') as f:\n"
                        "    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + '\\n')\n")
        stub.chmod(0o755)
    env = {"PATH": str(bin_dir), "QUICKSTART_ARGV": str(log), "HF_TOKEN": "hf_quickstart", "HOME": str(workdir)}
    p = subprocess.run(["/bin/bash", "-euo", "pipefail", "-c", script + "wait\n"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    argvs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return p, argvs


@pytest.fixture(scope="module")
def commands(tmp_path_factory) -> list[list[str]]:
    p, argvs = record(shell_text(quickstart()), tmp_path_factory.mktemp("quickstart"))
    assert p.returncode == 0, f"the quickstart's commands fail in bash (only {RECORDED} exist):\n{p.stderr}"
    return argvs


def words(argv: list[str]) -> list[str]:
    """The program and its positional arguments (subcommands, names), without options and their values."""
    return [argv[0], *positional(argv)]


def one(commands: list[list[str]], *prefix: str) -> list[str]:
    found = [c for c in commands if words(c)[:len(prefix)] == list(prefix)]
    assert len(found) == 1, f"expected one `{' '.join(prefix)}` in the quickstart, found {found}"
    return found[0]


def option(argv: list[str], *names: str) -> str | None:
    """The value of --name VALUE or --name=VALUE (the last one wins, as for kubectl and helm)."""
    value = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                value = argv[i + 1]
            elif a.startswith(n + "="):
                value = a[len(n) + 1:]
    return value


def positional(argv: list[str], takes_value: tuple[str, ...] = ("-n", "--namespace", "--version", "-H", "-d",
                                                                  "--timeout", "--for", "-f")) -> list[str]:
    out, skip = [], False
    for a in argv[1:]:
        if skip:
            skip = False
        elif a in takes_value:
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


# --------------------------------------------------------------------------- what the code says
def the_example(commands) -> tuple[Path, dict]:
    apply = one(commands, "kubectl", "apply")
    path = ROOT / option(apply, "-f", "--filename")
    assert path.is_file() and path.parent == ROOT / "examples", path
    return path, yaml.safe_load(path.read_text())


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_operator.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"})


def plan_of(path: Path) -> dict:
    p = cli("plan", str(path), "-o", "json")
    assert p.returncode == 0, p.stderr
    (plan,) = json.loads(p.stdout)
    return plan


def rendered(path: Path) -> list[dict]:
    p = cli("render", str(path))
    assert p.returncode == 0, p.stderr
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def client_service(objects: list[dict]) -> dict:
    (svc,) = [o for o in objects if o["kind"] == "Service" and o["spec"].get("clusterIP") != "None"]
    return svc


def workflow_env() -> dict[str, str]:
    return yaml.safe_load(WORKFLOW.read_text())["env"]


def chart_metadata() -> dict:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def served_name(plan: dict) -> str:
    args = plan["args"]
    return args[args.index("--served-model-name") + 1] if "--served-model-name" in args else plan["model"]


# --------------------------------------------------------------------------- the README's shape
def test_the_readme_opens_with_make_demo_and_make_test_then_the_quickstart():
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert [line.split()[:2] for line in first.splitlines()] == [["make", "demo"], ["make", "test"]]
    assert text.index(first) < text.index(HEADING) < text.index("\n## What it does")


def test_the_quickstart_runs_only_helm_kubectl_curl_and_sleep(commands):
    # (as a multiset: the port-forward runs in the background, so its place in the record may vary)
    assert sorted(" ".join(words(c)[:2]) for c in commands if c[0] != "sleep") == sorted([
        "helm install", "helm install", "kubectl rollout", "kubectl create", "kubectl apply", "kubectl wait",
        "kubectl port-forward", "curl localhost:8000/v1/chat/completions"])


# --------------------------------------------------------------------------- 1. install
def test_helm_installs_the_chart_the_release_workflow_pushes_at_the_charts_version(commands):
    installs = [c for c in commands if c[:2] == ["helm", "install"]]
    oci = [c for c in installs if any(a.startswith("oci://") for a in c)]
    assert len(oci) == 1 and len(installs) == 2, installs
    release, ref = positional(oci[0])[1:3]
    chart = chart_metadata()
    assert ref == f"{workflow_env()['CHART_REPOSITORY']}/{chart['name']}"
    assert option(oci[0], "--version") == chart["version"]
    (checkout,) = [c for c in installs if c is not oci[0]]
    assert positional(checkout)[1:3] == [release, str(generate.CHART)]
    for c in installs:
        assert option(c, "-n", "--namespace") == "vllm-operator" and "--create-namespace" in c


def test_the_chart_pushed_as_the_release_workflow_does_is_what_the_readme_installs(commands, tmp_path):
    """`helm package` and `helm push` to CHART_REPOSITORY as the workflow runs them, into a real OCI registry
    standing in for ghcr.io: the README's reference and version pull the checkout's chart back."""
    from e2e.testbed.oci_registry import OciRegistry

    hp = generate.helm_python()
    env = workflow_env()
    (install,) = [c for c in commands if c[:2] == ["helm", "install"] and any(a.startswith("oci://") for a in c)]
    ref, version = positional(install)[2], option(install, "--version")
    released = urlsplit(env["CHART_REPOSITORY"]).netloc
    with OciRegistry(tmp_path / "registry") as registry:
        def here(reference: str) -> str:
            assert reference.startswith(f"oci://{released}/"), reference
            return reference.replace(released, registry.host, 1)

        archive = hp.package(str(CHART), destination=str(tmp_path / "dist"))
        hp.push(archive, here(env["CHART_REPOSITORY"]), plain_http=True)
        assert hp.RegistryClient(plain_http=True).tags(here(ref)) == [version]
        hp.pull(here(ref), version=version, destination=str(tmp_path / "pulled"), untar=True, plain_http=True)
    pulled = tmp_path / "pulled" / chart_metadata()["name"]
    assert generate.render_chart(pulled) == generate.render_chart(CHART)
    assert yaml.safe_load((pulled / "values.yaml").read_text())["image"]["repository"] == env["IMAGE"]


def test_rollout_status_names_the_deployment_the_chart_installs(commands):
    install = next(c for c in commands if c[:2] == ["helm", "install"])
    release, namespace = positional(install)[1], option(install, "-n", "--namespace")
    status = one(commands, "kubectl", "rollout", "status")
    objects = generate.render_chart(CHART, release=release, namespace=namespace)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert positional(status)[2] == f"deployment/{deployment['metadata']['name']}"
    assert option(status, "-n", "--namespace") == deployment["metadata"]["namespace"]
    # and that Deployment pulls what the release workflow pushes, at the version helm installs
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"{workflow_env()['IMAGE']}:{chart_metadata()['appVersion']}"


# --------------------------------------------------------------------------- 2. the token
def test_the_secret_is_the_one_the_example_references(commands):
    _, example = the_example(commands)
    create = one(commands, "kubectl", "create", "secret", "generic")
    ref = api.SecretKeyRef.model_validate(example["spec"]["hfTokenSecretRef"])  # the CRD's defaults apply
    assert positional(create)[3] == ref.name
    assert option(create, "-n", "--namespace") == example["metadata"]["namespace"]
    literal = option(create, "--from-literal")
    assert literal == f"{ref.key}=hf_quickstart", "the token comes from $HF_TOKEN, under the referenced key"


def test_the_rendered_pods_read_hf_token_from_that_secret(commands):
    path, _ = the_example(commands)
    create = one(commands, "kubectl", "create", "secret", "generic")
    (workload,) = [o for o in rendered(path) if o["kind"] in ("StatefulSet", "DaemonSet")]
    (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    (env,) = [e for e in container["env"] if e["name"] == "HF_TOKEN"]
    key = option(create, "--from-literal").split("=", 1)[0]
    assert env["valueFrom"]["secretKeyRef"] == {"name": positional(create)[3], "key": key}


# --------------------------------------------------------------------------- 3. the server
def test_the_example_plans_offline_and_fits(commands):
    path, example = the_example(commands)
    plan = plan_of(path)
    assert plan["fits"] and plan["problems"] == [], plan["problems"]
    assert (plan["name"], plan["namespace"]) == (example["metadata"]["name"], example["metadata"]["namespace"])
    assert f"`{path.relative_to(ROOT)}`" in quickstart()


def test_kubectl_wait_is_for_the_condition_the_operator_sets_when_a_replica_serves(commands):
    _, example = the_example(commands)
    wait = one(commands, "kubectl", "wait")
    crd = yaml.safe_load((ROOT / "crds" / generate.CRD_FILE).read_text())
    names = crd["spec"]["names"]
    kind, name = positional(wait)[1].split("/")
    assert kind in [names["plural"], names["singular"], *names["shortNames"]]
    assert name == example["metadata"]["name"]
    assert option(wait, "-n", "--namespace") == example["metadata"]["namespace"]
    condition = option(wait, "--for")
    assert condition == "condition=Ready"
    assert condition.split("=", 1)[1] in server_status.OWN_CONDITIONS
    ready_column = next(c for c in crd["spec"]["versions"][0]["additionalPrinterColumns"] if c["name"] == "Ready")
    assert ready_column["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'


# --------------------------------------------------------------------------- 4. the API
def test_port_forward_targets_the_client_service_and_its_port(commands):
    path, example = the_example(commands)
    forward = one(commands, "kubectl", "port-forward")
    target, ports = positional(forward)[1:3]
    service = client_service(rendered(path))
    assert target == f"svc/{service['metadata']['name']}"
    assert option(forward, "-n", "--namespace") == service["metadata"]["namespace"]
    local, remote = ports.split(":")
    assert int(remote) in [p["port"] for p in service["spec"]["ports"]]
    assert int(local) > 0


def test_curl_asks_the_forwarded_port_for_the_served_model(commands):
    path, _ = the_example(commands)
    forward = one(commands, "kubectl", "port-forward")
    curl = one(commands, "curl")
    local = positional(forward)[2].split(":")[0]
    (url,) = positional(curl)
    parts = urlsplit(url if "://" in url else f"http://{url}")
    assert (parts.hostname, str(parts.port), parts.path) == ("localhost", local, "/v1/chat/completions")
    assert option(curl, "-H") == "Content-Type: application/json"
    body = json.loads(option(curl, "-d", "--data"))
    assert body["model"] == served_name(plan_of(path))
    assert body["messages"][0]["role"] == "user" and body["messages"][0]["content"]

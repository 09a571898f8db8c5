"""Security checks, pure: credentials never live in a spec, extraArgs cannot move the pod's address
without the documented escape hatch, and every generated pod template passes a privilege review.

The review runs over every example and over fuzzed plausible specs (tests/unit/test_fuzz.py's strategy).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_operator import api, builders, documents, pipeline, validation
from vllm_operator.validation import CREDENTIAL_FLAGS

from tests.unit.test_fuzz import plausible

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BASE = yaml.safe_load((ROOT / "examples" / "llama-8b-single-gpu.yaml").read_text())
UNSAFE = {api.ALLOW_UNSAFE_ARGS_ANNOTATION: "true"}


def document(spec_changes: dict[str, Any] | None = None, annotations: dict[str, str] | None = None,
             engine: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    doc["spec"].update(spec_changes or {})
    if engine is not None:
        doc["spec"]["engine"] = engine
    if annotations:
        doc["metadata"]["annotations"] = annotations
    return doc


def offline_fetch(url: str) -> dict:
    raise ValueError(f"could not fetch config.json from {url}: no network in tests")


def refusals(doc: dict[str, Any]) -> list[str]:
    """The lines the CLI and the operator would show for `doc` (empty: it renders)."""
    [d] = documents.load_documents(yaml.safe_dump(doc))
    if d.errors:
        return d.errors
    s = d.server
    plan = pipeline.plan_server(s.metadata.name, s.metadata.namespace, s.spec, fetch=offline_fetch,
                                allow_unsafe_args=api.allows_unsafe_args(s.metadata))
    return [str(p) for p in plan.problems]


def render(doc: dict[str, Any]) -> list[dict[str, Any]]:
    [d] = documents.load_documents(yaml.safe_dump(doc))
    assert not d.errors, d.errors
    s = d.server
    plan = pipeline.plan_server(s.metadata.name, s.metadata.namespace, s.spec,
                                allow_unsafe_args=api.allows_unsafe_args(s.metadata))
    assert plan.fits, plan.problems
    return builders.build_all(plan, {"metadata": {"name": s.metadata.name, "uid": "u"}})


# --------------------------------------------------------------------------- credentials
TOKENS = {
    "hugging face": "hf_AbCdEfGhIjKlMnOpQrStUvWx12",
    "openai": "sk-proj-abcdefghijklmnopqrstuvwx",
    "github": "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl",
    "pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIE...",
    "url with password": "https://user:s3cret@models.example.com/config.json",
}


@pytest.mark.parametrize("kind", sorted(TOKENS))
@pytest.mark.parametrize(("where", "field"), [
    ("env", "spec.engine.env[0]"),
    ("extraArgs", "spec.engine.extraArgs[1]"),
    ("podAnnotations", "spec.podAnnotations.note"),
    ("servedName", "spec.model.servedName"),
    ("configURL", "spec.model.configURL"),
])
def test_plaintext_credentials_anywhere_in_the_spec_are_refused(kind, where, field):
    token = TOKENS[kind]
    if where == "env":
        doc = document(engine={"env": [{"name": "SOME_SETTING", "value": token}]})
    elif where == "extraArgs":
        doc = document(engine={"extraArgs": ["--seed", token]})
    elif where == "podAnnotations":
        doc = document({"podAnnotations": {"note": token}})
    elif where == "servedName":
        doc = document()
        doc["spec"]["model"]["servedName"] = token
    else:
        doc = document()
        doc["spec"]["model"]["configURL"] = token
    lines = refusals(doc)
    mine = [line for line in lines if line.startswith(field)]
    assert mine, lines
    if where == "servedName" and token.startswith("-"):  # a PEM key: refused by the API's pattern first
        assert mine == [f"{field}: must not start with '-': vLLM would read it as a flag (got {token!r})"]
        return
    assert any("credential" in line and ("Secret" in line or "hfTokenSecretRef" in line) for line in mine), mine


#: The credential expression before it was made linear, as the reference for what it must keep finding.
QUADRATIC_CREDENTIAL_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|(AKIA|ASIA)[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\."
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----|[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@)")
#: Every credential shape, with its lengths and characters around the boundaries of what it takes.
_TOKENISH = "aZ0_-.J"
SHAPES = st.one_of(
    *[st.builds(str.__add__, st.just(prefix), st.text(_TOKENISH, min_size=n - 3, max_size=n + 1))
      for prefix, n in (("hf_", 16), ("sk-", 16), ("ghp_", 20), ("gho_", 20), ("github_pat_", 20), ("xoxb-", 10))],
    st.builds(str.__add__, st.sampled_from(["AKIA", "ASIA", "AKIa"]), st.text("AZ09a", min_size=14, max_size=17)),
    st.builds(lambda a, b, c, end: f"{a}eyJ{b}.eyJ{c}{end}", st.text("aZ0_-.eyJ", max_size=3),
              st.text("aZ0_-eyJ", min_size=7, max_size=9), st.text("aZ0_-eyJ", min_size=7, max_size=9),
              st.sampled_from([".", "", "-", " ."])),
    st.builds(lambda scheme, user, colon, password, at: f"{scheme}://{user}{colon}{password}{at}",
              st.text("az09+.-A", max_size=4), st.text("a:@/ ", max_size=3), st.sampled_from([":", ""]),
              st.text("ab:@/ \n", max_size=3), st.sampled_from(["@", "", "/@"])),
    st.builds(lambda kind, end: f"-----BEGIN {kind}{end}", st.text("AZ -", max_size=5),
              st.sampled_from(["PRIVATE KEY-----", "PRIVATE KEY----", "PRIVATE KEY", ""])),
)
SEPARATORS = st.sampled_from(["", " ", "a", "-", ":", "/", "@", ".", "\n", "eyJ", "x://"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(SHAPES | SEPARATORS, max_size=5).map("".join))
def test_the_linear_credential_check_finds_exactly_what_the_quadratic_one_did(text):
    assert bool(validation._CREDENTIAL_VALUE.search(text)) == bool(QUADRATIC_CREDENTIAL_VALUE.search(text)), text


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_every_token_shape_is_still_found_inside_other_text(kind):
    for text in (TOKENS[kind], f"note: {TOKENS[kind]} (rotated)", f"x{TOKENS[kind]}", f"a-{TOKENS[kind]}"):
        assert validation._CREDENTIAL_VALUE.search(text), text


@pytest.mark.parametrize("text", ["a" * 2**17, "eyJ" * 2**15, "a://b:" + "c" * 2**17, "-----BEGIN " + "A" * 2**17,
                                  "x1" * 2**16, "eyJabcdefg." * 2**13])
def test_no_annotation_makes_the_credential_check_slow(text):
    # With the quadratic expression the first took about 17 s; a 400 KB annotation froze the operator. The CRD
    # bounds spec.podAnnotations' values (refused by the schema, in `plan` as by the API server); the pod template
    # patch's annotations are free-form (its whole size bounded at 64 KiB), so the credential check walks them.
    # The CPU time of this thread, not the wall clock: what other processes on a loaded machine take is not counted
    # (2.30 s of wall clock was seen at load 18 on 2 cores, for about 0.2 s of CPU).
    t0 = time.thread_time()
    assert refusals(document({"podAnnotations": {"note": text}})) == [
        f"spec.podAnnotations.note: may not be longer than {api.MAX_ANNOTATION_VALUE} characters (it has {len(text)})"]
    assert refusals(document({"podTemplatePatch": {"metadata": {"annotations": {"note": text[:60_000]}}}})) == []
    assert time.thread_time() - t0 < 2.0


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD",
                                  "AWS_SECRET_ACCESS_KEY", "MY_PRIVATE_KEY"])
def test_credential_named_env_values_are_refused_but_secret_references_are_not(name):
    lines = refusals(document(engine={"env": [{"name": name, "value": "whatever-it-is"}]}))
    assert any(line.startswith("spec.engine.env[0]") for line in lines), lines
    if name not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):  # set by the operator from hfTokenSecretRef
        ref = {"name": name, "valueFrom": {"secretKeyRef": {"name": "vllm-secrets", "key": name.lower()}}}
        assert refusals(document(engine={"env": [ref]})) == []
        container = next(o for o in render(document(engine={"env": [ref]})) if o["kind"] == "StatefulSet")[
            "spec"]["template"]["spec"]["containers"][0]
        assert {"name": name, "valueFrom": {"secretKeyRef": {"name": "vllm-secrets", "key": name.lower()}}} in \
            container["env"]


def test_value_and_value_from_together_are_refused():
    env = {"name": "VLLM_API_KEY", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    assert any(line.startswith("spec.engine.env[0]") and "not both" in line
               for line in refusals(document(engine={"env": [env]})))


@pytest.mark.parametrize("flag", sorted(CREDENTIAL_FLAGS))
@pytest.mark.parametrize("form", ["separate", "inline"])
def test_credential_flags_with_a_literal_value_are_refused(flag, form):
    args = [flag, "not-even-token-shaped"] if form == "separate" else [f"{flag}=not-even-token-shaped"]
    for extra in (None, UNSAFE):  # the escape hatch does not cover credentials
        lines = refusals(document(engine={"extraArgs": args}, annotations=extra))
        assert any(line.startswith("spec.engine.extraArgs[0]") and "credential" in line for line in lines), lines


# --------------------------------------------------------------------------- --host / --port
@pytest.mark.parametrize("args", [["--port", "9000"], ["--port=9000"], ["--host", "127.0.0.1"], ["--host=::"]])
def test_host_and_port_are_refused_without_the_escape_hatch(args):
    lines = refusals(document(engine={"extraArgs": args}))
    assert any(line.startswith("spec.engine.extraArgs[0]") and api.ALLOW_UNSAFE_ARGS_ANNOTATION in line
               for line in lines), lines
    for value in ("false", "yes", ""):
        assert refusals(document(engine={"extraArgs": args}, annotations={api.ALLOW_UNSAFE_ARGS_ANNOTATION: value}))


def test_the_escape_hatch_lets_port_through_and_the_pod_follows_it():
    doc = document(engine={"extraArgs": ["--port", "9000"]}, annotations=UNSAFE)
    assert refusals(doc) == []
    objects = render(doc)
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-2:] == ["--port", "9000"]  # after the operator's: vLLM takes the last one
    assert container["ports"] == [{"name": "http", "containerPort": 9000, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "http"  # by name: follows the container port
    service = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "llama-8b")
    assert service["spec"]["ports"][0]["port"] == 8000 and service["spec"]["ports"][0]["targetPort"] == "http"


def test_the_escape_hatch_still_checks_the_port_value():
    lines = refusals(document(engine={"extraArgs": ["--port", "http"]}, annotations=UNSAFE))
    assert any(line.startswith("spec.engine.extraArgs") for line in lines), lines


def test_the_escape_hatch_does_not_open_derived_flags():
    lines = refusals(document(engine={"extraArgs": ["--max-model-len", "4096"]}, annotations=UNSAFE))
    assert any("spec.engine.maxModelLen" in line for line in lines), lines


# --------------------------------------------------------------------------- privilege review
def privilege_problems(spec: api.VLLMServerSpec, objects: list[dict[str, Any]]) -> list[str]:
    problems = []
    for obj in objects:
        if obj["kind"] not in ("StatefulSet", "DaemonSet"):
            continue
        pod = obj["spec"]["template"]["spec"]
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if pod.get("hostIPC") and spec.ipc != "Host":
            problems.append(f"{where}: hostIPC without ipc: Host")
        if spec.ipc == "Host" and not pod.get("hostIPC"):
            problems.append(f"{where}: ipc: Host without hostIPC")
        if pod.get("hostNetwork") and not (spec.host_network and obj["kind"] == "DaemonSet"):
            problems.append(f"{where}: hostNetwork without hostNetwork: true on a DaemonSet")
        if pod.get("hostPID"):
            problems.append(f"{where}: hostPID")
        if pod.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: the service account token is mounted")
        for volume in pod.get("volumes") or []:
            if "hostPath" in volume:
                problems.append(f"{where}: hostPath volume {volume['name']}")
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c.get("securityContext") or {}
            if sc.get("privileged") is not False:
                problems.append(f"{where}: container {c['name']} may be privileged")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: container {c['name']} allows privilege escalation")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []) or (sc.get("capabilities") or {}).get(
                    "add"):
                problems.append(f"{where}: container {c['name']} keeps capabilities")
            for port in c.get("ports") or []:
                if "hostPort" in port and not pod.get("hostNetwork"):
                    problems.append(f"{where}: hostPort without hostNetwork")
            for env in c.get("env") or []:
                if env["name"] in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") and "secretKeyRef" not in (
                        env.get("valueFrom") or {}):
                    problems.append(f"{where}: {env['name']} not from a secretKeyRef")
    return problems


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_the_privilege_review(path):
    doc = yaml.safe_load(path.read_text())
    objects = render(doc)
    spec = api.VLLMServer.model_validate(doc).spec
    assert privilege_problems(spec, objects) == []
    env = {e["name"]: e for o in objects if o["kind"] in ("StatefulSet", "DaemonSet")
           for e in o["spec"]["template"]["spec"]["containers"][0]["env"]}
    if spec.hf_token_secret_ref:
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == spec.hf_token_secret_ref.name


def test_the_review_catches_what_it_looks_for():
    doc = yaml.safe_load((ROOT / "examples" / "gemma-3-4b-2x-a2000.yaml").read_text())
    objects = render(doc)
    spec = api.VLLMServer.model_validate(doc).spec.model_copy(update={"ipc": "SharedMemory"})
    pod = next(o for o in objects if o["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    pod["containers"][0]["securityContext"]["privileged"] = True
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    found = privilege_problems(spec, objects)
    assert any("hostIPC" in p for p in found) and any("privileged" in p for p in found) and any(
        "hostPath" in p for p in found)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plausible())
def test_fuzzed_specs_pass_the_privilege_review(doc):
    [d] = documents.load_documents(yaml.safe_dump(doc, allow_unicode=True))
    if d.errors:
        return
    s = d.server
    plan = pipeline.plan_server(s.metadata.name, s.metadata.namespace, s.spec)
    if not plan.fits:
        return
    objects = builders.build_all(plan, {"metadata": {"name": s.metadata.name, "uid": "u"}})
    assert privilege_problems(s.spec, objects) == []

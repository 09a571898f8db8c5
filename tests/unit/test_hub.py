"""Model facts from the Hub (issue 12 item 1): the real huggingface_hub client, through the operator's bounded
client (hub.py), against the local Hub stand-in (e2e/hub_http.py) serving real config.json files and the Hub's
safetensors metadata of real models (tests/data/hub, sources in tests/data/README.md), plus the adversarial cases:
a redirect to another host, a trickle, a stall, an oversized answer, a gated model without and with the token."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
import yaml

from e2e.testbed.hub_http import HubServer
from vllm_operator import api, catalog, cli, pipeline
from vllm_operator.sources import hub, model_facts

DATA = Path(__file__).resolve().parents[1] / "data" / "hub"
SAFETENSORS = json.loads((DATA / "safetensors.json").read_text())
QWEN_MOE, LLAMA_GATED = "Qwen/Qwen3-30B-A3B", "meta-llama/Llama-3.2-1B"
TOKEN = "hf_operator_token_for_tests"


@pytest.fixture
def stand_in():
    with HubServer({repo: DATA / repo for repo in SAFETENSORS}, safetensors=SAFETENSORS,
                   gated={LLAMA_GATED: TOKEN}, renamed={"Qwen/Qwen3-MoE-old-name": QWEN_MOE}) as server:
        yield server


def spec(name: str, **model) -> api.VLLMServerSpec:
    return api.VLLMServerSpec.model_validate({"model": {"name": name, **model},
                                              "gpu": {"count": 1, "product": "NVIDIA-H100-80GB-HBM3"},
                                              "workloadProfile": {"maxContextTokens": 32768}})


def test_the_models_are_outside_the_catalog():
    assert catalog.lookup_model(QWEN_MOE) is None and catalog.lookup_model(LLAMA_GATED) is None


def test_where_models_are_looked_up():
    assert hub.endpoint_setting(None, environ={}) == "https://huggingface.co"
    assert hub.endpoint_setting(None, environ={"HF_ENDPOINT": "https://mirror.corp"}) == "https://mirror.corp"
    assert hub.endpoint_setting(None, environ={"HF_HUB_OFFLINE": "1"}) is None
    assert hub.endpoint_setting("https://mirror.corp", environ={"HF_HUB_OFFLINE": "1"}) == "https://mirror.corp"
    assert hub.endpoint_setting("https://mirror.corp", offline=True, environ={}) is None


# --------------------------------------------------------------------------- the lookup
def test_a_lookup_reads_config_json_and_the_exact_parameter_count(stand_in):
    facts = hub.lookup(QWEN_MOE, endpoint=stand_in.base)
    assert facts.config == json.loads((DATA / QWEN_MOE / "config.json").read_text())
    assert facts.parameters == {"BF16": 30_532_122_624} and facts.total == 30_532_122_624
    assert facts.sha and len(facts.sha) == 40
    # the model API once (no weight file, no LFS), then config.json at the commit it resolved to
    assert stand_in.requests == [("GET", f"/api/models/{QWEN_MOE}"),
                                 ("GET", f"/{QWEN_MOE}/resolve/{facts.sha}/config.json")]


def test_a_revision_is_asked_for_by_name(stand_in):
    hub.lookup(QWEN_MOE, "main", endpoint=stand_in.base)
    assert stand_in.requests[0] == ("GET", f"/api/models/{QWEN_MOE}/revision/main")


def test_a_renamed_repo_is_followed_on_the_same_host(stand_in):
    assert hub.lookup("Qwen/Qwen3-MoE-old-name", endpoint=stand_in.base).total == 30_532_122_624
    assert stand_in.requests[:2] == [("GET", "/api/models/Qwen/Qwen3-MoE-old-name"), ("GET", f"/api/models/{QWEN_MOE}")]


def test_a_gated_model_needs_the_operators_token_and_it_goes_only_to_the_hub(stand_in):
    with pytest.raises(hub.HubError) as no_token:
        hub.lookup(LLAMA_GATED, endpoint=stand_in.base)
    assert no_token.value.gated and "operator.hfTokenSecret" in str(no_token.value)
    with pytest.raises(hub.HubError, match="^the operator's token does not open this gated model$"):
        hub.lookup(LLAMA_GATED, endpoint=stand_in.base, token="hf_wrong")
    assert hub.lookup(LLAMA_GATED, endpoint=stand_in.base, token=TOKEN).total == 1_235_814_400
    assert stand_in.authorizations == ["", "Bearer hf_wrong", f"Bearer {TOKEN}", f"Bearer {TOKEN}"]
    # and never off the Hub: a redirect elsewhere is refused before anything is sent there
    stand_in.fault = "redirect-offhost"
    with pytest.raises(hub.HubError, match="^redirect to another host refused$"):
        hub.lookup(LLAMA_GATED, endpoint=stand_in.base, token=TOKEN)


def test_the_operator_sends_no_token_of_the_environment(stand_in, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # the operator's pod environment is not its token (token=False)
    with pytest.raises(hub.HubError):
        hub.lookup(LLAMA_GATED, endpoint=stand_in.base)
    assert stand_in.authorizations == [""]


@pytest.mark.parametrize(("fault", "category"), [
    ("redirect-offhost", "redirect to another host refused"),
    ("trickle", "timed out"),
    ("stall", "timed out"),
    ("oversized", "response larger than 1048576 bytes"),
])
def test_a_misbehaving_hub_fails_within_the_deadline_with_a_category(stand_in, fault, category):
    stand_in.fault = fault
    started = time.monotonic()
    with pytest.raises(hub.HubError) as info:
        hub.lookup(QWEN_MOE, endpoint=stand_in.base, seconds=1.5)
    took = time.monotonic() - started
    assert str(info.value) == category
    assert took < 1.5 + 0.5, f"{fault}: {took:.2f} s for a 1.5 s deadline"
    assert len(stand_in.requests) == 1, "no retry inside one lookup: the cache retries after a minute"


def test_failures_never_quote_the_answer(stand_in):
    for name in ("acme/missing", "not a repo id"):
        with pytest.raises(hub.HubError) as info:
            hub.lookup(name, endpoint=stand_in.base)
        assert "acme" not in str(info.value) and "Repository" not in str(info.value), str(info.value)


def test_no_request_leaves_outside_a_bounded_lookup(stand_in):
    from huggingface_hub.utils import get_session

    hub.lookup(QWEN_MOE, endpoint=stand_in.base)  # installs the client
    seen = len(stand_in.requests)
    with pytest.raises(Exception, match="outside a bounded lookup"):
        get_session().get(f"{stand_in.base}/api/models/{QWEN_MOE}")
    assert len(stand_in.requests) == seen


def test_the_token_file(tmp_path: Path):
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    assert hub.read_token_file(str(path)) == TOKEN and hub.read_token_file(None) is False
    path.write_text("two words")
    with pytest.raises(ValueError) as info:
        hub.read_token_file(str(path))
    assert "words" not in str(info.value) and str(path) in str(info.value)
    assert hub.token_reader(str(tmp_path / "missing"))() is False  # logged, and planning goes on without one


# --------------------------------------------------------------------------- planning with the Hub's facts
def test_the_plan_uses_the_hubs_exact_count_and_says_so(stand_in):
    plan = pipeline.plan_server("moe", "ns", spec(QWEN_MOE), hf_endpoint=stand_in.base)
    assert plan.fits, plan.problems
    assert plan.model.source == f"Hub ({stand_in.base}/{QWEN_MOE}: config.json, safetensors metadata)"
    assert plan.model.architecture.parameter_count == 30_532_122_624
    assert "parameter_count" not in plan.model.estimated
    # the shapes miss the routers (48 x 128 x 2048) and the q/k norms (48 x 2 x 128): 12,595,200 parameters
    assert "weights sized with the Hub's exact parameter count 30,532,122,624 (safetensors metadata); config.json's " \
           "shapes give 30,519,527,424 (-0.04%)" in plan.notes
    assert plan.model.architecture.num_experts == 128 and plan.model.architecture.intermediate_size == 768


def test_a_gated_model_without_the_token_is_a_problem_that_says_how_to_fix_it(stand_in):
    plan = pipeline.plan_server("llama", "ns", spec(LLAMA_GATED), hf_endpoint=stand_in.base)
    assert not plan.fits
    [problem] = [str(p) for p in plan.problems]
    assert "operator.hfTokenSecret" in problem and "spec.model.configURL" in problem
    assert "restricted" not in problem, "the Hub's own words are not echoed"
    with_token = pipeline.plan_server("llama", "ns", spec(LLAMA_GATED), hf_endpoint=stand_in.base, hf_token=TOKEN)
    assert with_token.fits and with_token.model.architecture.parameter_count == 1_235_814_400


def test_a_spec_that_gives_the_facts_needs_no_hub(stand_in):
    url = f"{stand_in.base}/{QWEN_MOE}/resolve/main/config.json"
    plan = pipeline.plan_server("moe", "ns", spec(QWEN_MOE, configURL=url), hf_endpoint=stand_in.base,
                                hf_token=TOKEN)
    assert plan.fits and plan.model.source == f"config.json ({url})"
    assert stand_in.requests == [("GET", f"/{QWEN_MOE}/resolve/main/config.json")]
    assert stand_in.authorizations == [""], "a configURL is the tenant's: no token goes with it"


def test_the_operator_keeps_the_last_good_facts_through_a_hub_outage(stand_in):
    clock = [1_000_000.0]
    configs = model_facts.ConfigCache(ttl=600, retry=60, clock=lambda: clock[0])

    def plan():
        return pipeline.plan_server("moe", "ns", spec(QWEN_MOE), hf_endpoint=stand_in.base, configs=configs)

    first = plan()
    clock[0] += 300
    assert plan().args == first.args and len(stand_in.requests) == 2, "within the TTL: no request"
    clock[0] += 301
    stand_in.fault = "oversized"  # any failure; a stall would cost the lookup's whole deadline (10 s)
    stale = plan()
    assert stale.fits and stale.args == first.args
    assert any(n.startswith(f"warning: the Hub at {stand_in.base}: response larger than 1048576 bytes; planned with "
                            "the facts it gave at ")
               for n in stale.notes), stale.notes
    asked = len(stand_in.requests)
    clock[0] += 30
    assert plan().notes == stale.notes and len(stand_in.requests) == asked, "the retry waits its minute"
    clock[0] += 31
    stand_in.fault = None
    assert plan().notes == first.notes and len(stand_in.requests) == asked + 2


# --------------------------------------------------------------------------- the CLI
def write_spec(tmp_path: Path, name: str) -> str:
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": api.API_VERSION, "kind": api.KIND,
                                    "metadata": {"name": "moe", "namespace": "default"},
                                    "spec": spec(name).model_dump(by_alias=True, exclude_defaults=True)}))
    return str(path)


def run_cli(*argv: str) -> tuple[int, str, str]:
    args = cli.build_parser().parse_args(list(argv))
    out, err = io.StringIO(), io.StringIO()
    return args.func(args, out, err), out.getvalue(), err.getvalue()


def test_cli_plan_and_render_a_model_outside_the_catalog(stand_in, tmp_path):
    path = write_spec(tmp_path, QWEN_MOE)
    code, out, err = run_cli("plan", path, "--hf-endpoint", stand_in.base, "-o", "json")
    assert code == 0, err
    [plan] = json.loads(out)
    assert plan["modelSource"].startswith("Hub (") and plan["fits"]
    assert any("exact parameter count 30,532,122,624" in n for n in plan["notes"])
    code, out, err = run_cli("render", path, "--hf-endpoint", stand_in.base)
    assert code == 0, err
    kinds = [o["kind"] for o in yaml.safe_load_all(out)]
    assert "StatefulSet" in kinds
    [workload] = [o for o in yaml.safe_load_all(out) if o["kind"] == "StatefulSet"]
    assert QWEN_MOE in json.dumps(workload)


def test_cli_offline_looks_nothing_up_and_says_what_to_set(stand_in, tmp_path):
    code, _, err = run_cli("plan", write_spec(tmp_path, QWEN_MOE), "--hf-endpoint", stand_in.base, "--offline")
    assert code == 1 and "spec.model.configURL" in err and "numLayers" in err
    assert stand_in.requests == []


def test_cli_token_file_opens_a_gated_model(stand_in, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    path = write_spec(tmp_path, LLAMA_GATED)
    code, _, err = run_cli("plan", path, "--hf-endpoint", stand_in.base)
    assert code == 1 and "gated" in err
    code, _, err = run_cli("plan", path, "--hf-endpoint", stand_in.base, "--hf-token-file", str(token))
    assert code == 0, err
    code, _, err = run_cli("plan", path, "--hf-endpoint", stand_in.base, "--hf-token-file", str(tmp_path / "none"))
    assert code == 1 and "cannot be read" in err


# --------------------------------------------------------------------------- the operator's reconciler
def test_the_reconciler_plans_a_gated_hub_model_once_the_operator_has_its_token(stand_in, tmp_path):
    from e2e.testbed.memory_world import World
    from vllm_operator.conditions import condition

    clock = [1_000_000.0]
    token_file = tmp_path / "hf-token" / "token"  # where the chart mounts operator.hfTokenSecret
    world = World({"model": {"name": LLAMA_GATED}})
    world.reconciler.hf_endpoint = stand_in.base
    world.reconciler.hf_token = hub.token_reader(str(token_file))
    world.reconciler.hf_token_repos = (LLAMA_GATED.split("/")[0],)  # operator.hfTokenRepos
    world.reconciler.configs = model_facts.ConfigCache(clock=lambda: clock[0])

    status = world.reconcile()["status"]
    valid = condition(status, "SpecValid")
    assert valid["status"] == "False" and "operator.hfTokenSecret" in valid["message"]
    assert "restricted" not in valid["message"], "the Hub's own words are not echoed"
    assert not any(k[0] == "StatefulSet" for k in world.kube.objects), "nothing applied"
    token_file.parent.mkdir()
    token_file.write_text(TOKEN)  # the Secret appears (or rotates): read at the next lookup
    clock[0] += 61  # a failed lookup is tried again after a minute, not at every reconcile
    status = world.reconcile()["status"]
    assert condition(status, "SpecValid")["status"] == "True", condition(status, "SpecValid")
    assert status["plan"]["modelSource"].startswith(f"Hub ({stand_in.base}/{LLAMA_GATED}")
    assert any(k[0] == "StatefulSet" for k in world.kube.objects)
    assert stand_in.authorizations[0] == "" and set(stand_in.authorizations[1:]) == {f"Bearer {TOKEN}"}


# --------------------------------------------------------------------------- a quantized checkpoint
def awq_gemm_counts(config: dict) -> dict[str, int]:
    """The safetensors counts of a 4-bit AWQ GEMM checkpoint, from its config.json by the format's layout (computed
    here, not copied from the Hub): per linear layer qweight int32 [in, out/8], qzeros int32 [in/g, out/8], scales
    float16 [in/g, out]; biases, norms, the embeddings and lm_head in float16."""
    h, inter, kv = config["hidden_size"], config["intermediate_size"], config["num_key_value_heads"] * 128
    g = config["quantization_config"]["group_size"]
    linears = [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]
    i32 = sum(i * o // 8 + i // g * o // 8 for i, o in linears) * config["num_hidden_layers"]
    f16 = (sum(i // g * o for i, o in linears) + h + 2 * kv + 2 * h) * config["num_hidden_layers"] + h \
        + 2 * config["vocab_size"] * h
    return {"I32": i32, "F16": f16}


def test_a_quantized_checkpoint_is_sized_as_stored_by_the_hubs_counts(tmp_path):
    config = json.loads((DATA.parent / "configs" / "Qwen2.5-7B-Instruct-AWQ.config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    counts = awq_gemm_counts(config)
    stored = counts["I32"] * 4 + counts["F16"] * 2
    repo = "acme/qwen-7b-awq"  # outside the catalog
    with HubServer({repo: tmp_path}, safetensors={repo: {"parameters": counts, "total": sum(counts.values())}}) \
            as server:
        plan = pipeline.plan_server("awq", "ns", spec(repo), hf_endpoint=server.base)
        estimated = pipeline.plan_server("awq", "ns", spec(repo, configURL=f"{server.base}/{repo}/resolve/main/"
                                                                           "config.json"), hf_endpoint=server.base)
    assert plan.fits and plan.weight_bytes_total == stored == 5_570_747_392
    assert [n for n in plan.notes if n.startswith("weights sized as the checkpoint stores them (awq): 5.19 GiB by the "
                                                  "Hub's safetensors metadata")]
    # the packed count is not a parameter count: the shapes' estimate stays for it
    assert "parameter_count" in plan.model.estimated and plan.model.architecture.parameter_count > 7e9
    # without the Hub's counts, the 4-bit estimate with its overhead
    assert estimated.weight_bytes_total != stored
    print(f"AWQ Qwen2.5-7B weights: stored {stored:,} B, estimated {estimated.weight_bytes_total:,} B "
          f"({(estimated.weight_bytes_total - stored) / stored:+.1%})")


def test_the_operators_token_is_sent_only_for_the_repos_its_settings_list(stand_in, tmp_path):
    """Issue 18: the operator's token answered for any repo a tenant named, an existence and architecture oracle for
    the platform's private models. Now a repo outside operator.hfTokenRepos is looked up anonymously (none listed:
    the token is sent for none), so a gated or private one is refused as for anyone."""
    from e2e.testbed.memory_world import World
    from vllm_operator.conditions import condition

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    for repos in ((), ("other-org",), (LLAMA_GATED.split("/")[0] + "x",)):
        world = World({"model": {"name": LLAMA_GATED}})
        world.reconciler.hf_endpoint = stand_in.base
        world.reconciler.hf_token = hub.token_reader(str(token_file))
        world.reconciler.hf_token_repos = repos
        valid = condition(world.reconcile()["status"], "SpecValid")
        assert valid["status"] == "False" and "operator.hfTokenRepos" in valid["message"], (repos, valid)
    assert stand_in.authorizations and set(stand_in.authorizations) == {""}, "the token never went out"
    assert hub.token_for("org/m", TOKEN, ("org",)) == TOKEN and hub.token_for("org/m", TOKEN, ("org/m",)) == TOKEN
    assert hub.token_for("orgx/m", TOKEN, ("org",)) is False and hub.token_for("org/m", TOKEN, ()) is False
    assert hub.token_for("any/m", TOKEN, None) == TOKEN  # the CLI: the user's own token

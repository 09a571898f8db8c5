"""spec.adapters, pure: the API's bounds, what the planner derives from each adapter_config.json (flags, the LoRA
slots' memory), what it refuses and why, the pods' environment, and status.adapters / AdaptersReady."""

from __future__ import annotations

from typing import Any, Optional

import pydantic
import pytest

from vllm_operator import adapters, api, builders, pipeline
from vllm_operator.planner import Plan

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def spec_with(adapter_list: list[dict[str, Any]], **spec: Any) -> api.VLLMServerSpec:
    spec.setdefault("gpu", {"count": 1, "product": "NVIDIA-L4"})
    spec.setdefault("model", {"name": LLAMA_8B, "servedName": "llama"})
    return api.VLLMServerSpec.model_validate({**spec, "adapters": adapter_list})


def hub(configs: dict[str, Any]):
    """A Hub that serves these adapter_config.json files (repo id -> config, or an exception to raise)."""
    def read(repo: str, filename: str, revision: Optional[str] = None, *, endpoint: str = "") -> Any:
        assert filename == "adapter_config.json"
        found = configs[repo]
        if isinstance(found, Exception):
            raise found
        return found
    return read


def plan(spec: api.VLLMServerSpec, configs: Optional[dict[str, Any]] = None) -> Plan:
    return pipeline.plan_server("srv", "default", spec, hf_endpoint="https://hub.example" if configs else None,
                                read_file=hub(configs or {}))


def arg(p: Plan, flag: str) -> str:
    return p.args[p.args.index(flag) + 1]


def lora_config(r: int = 16, base: str = LLAMA_8B, **kw: Any) -> dict[str, Any]:
    return {"peft_type": "LORA", "r": r, "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": base, **kw}


# --------------------------------------------------------------------------- the API
@pytest.mark.parametrize("bad", [
    {"name": "-flag", "source": "org/a"}, {"name": "a b", "source": "org/a"}, {"name": "x" * 65, "source": "org/a"},
    {"name": "a", "source": "https://example.com/a"}, {"name": "a", "source": "/cache/../etc"},
    {"name": "a", "source": "/cache/a", "revision": "main"},
    {"name": "a", "source": "org/a/b"}, {"name": "a", "source": "/cache/a\nb"}, {"name": "a", "source": "org/a", "rank": 0},
])
def test_the_api_refuses_a_bad_adapter(bad):
    with pytest.raises(pydantic.ValidationError):
        spec_with([bad])


def test_the_api_bounds_the_number_of_adapters():
    many = [{"name": f"a{i}", "source": f"org/a{i}", "rank": 8} for i in range(api.MAX_ADAPTERS + 1)]
    with pytest.raises(pydantic.ValidationError, match="at most 32"):
        spec_with(many)
    assert len(spec_with(many[:-1]).adapters) == api.MAX_ADAPTERS


def test_the_crd_lists_adapters_by_name_and_refuses_a_revision_of_a_path():
    from vllm_operator import crd
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert schema["adapters"]["x-kubernetes-list-map-keys"] == ["name"]
    assert schema["adapters"]["maxItems"] == 32
    rules = [r["rule"] for r in schema["adapters"]["items"]["x-kubernetes-validations"]]
    assert any("self.source.startsWith('/')" in r for r in rules)


# --------------------------------------------------------------------------- the plan
def test_flags_and_the_slots_memory_from_the_adapters_configs():
    p = plan(spec_with([{"name": "sql", "source": "org/sql"}, {"name": "chat", "source": "org/chat"}]),
             {"org/sql": lora_config(8), "org/chat": lora_config(32)})
    assert p.fits, p.problems
    assert "--enable-lora" in p.args
    assert (arg(p, "--max-loras"), arg(p, "--max-cpu-loras"), arg(p, "--max-lora-rank")) == ("4", "32", "32")
    # Llama 3.1 8B per layer, per slot and unit of rank: qkv_proj 3 x 4096 in + (4096 + 2 x 1024) out, o_proj
    # 4096 + 4096, gate_up_proj 2 x 4096 + 2 x 14336, down_proj 14336 + 4096 = 81920 elements; 32 layers; then
    # embed_tokens and lm_head, 2 x (128256 + 4096); 4 slots of rank 32, bfloat16.
    per_rank = 32 * 81920 + 2 * (128256 + 4096)
    assert p.memory is not None and p.memory.lora == per_rank * 4 * 32 * 2 == 738_852_864
    assert p.estimates()["loraBytesPerGpu"] == 738_852_864
    without = plan(spec_with([]))
    assert without.memory is not None
    assert without.memory.kv_cache - p.memory.kv_cache == p.memory.lora
    assert any("LoRA slots: 4 slot(s) x rank 32" in n for n in p.notes)


def test_the_flags_do_not_follow_the_number_of_adapters():
    """Adding an adapter must not change the pods' args (a changed arg restarts every pod)."""
    one = plan(spec_with([{"name": "a", "source": "/cache/a", "rank": 8}]))
    three = plan(spec_with([{"name": n, "source": f"/cache/{n}", "rank": 16} for n in ("a", "b", "c")]))
    assert one.fits and three.fits
    assert one.args == three.args
    assert arg(one, "--max-lora-rank") == "16"  # vLLM's default, the floor
    # the first adapter (and the last one's removal) does change them: docs/adapters.md says it restarts the pods
    assert "--enable-lora" not in plan(spec_with([])).args


def test_pinned_slots_and_rank():
    p = plan(spec_with([{"name": "a", "source": "/cache/a", "rank": 8}], engine={"maxLoras": 1, "maxLoraRank": 8}))
    assert p.fits, p.problems
    assert (arg(p, "--max-loras"), arg(p, "--max-lora-rank")) == ("1", "8")
    assert p.memory is not None and p.memory.lora == (32 * 81920 + 2 * (128256 + 4096)) * 1 * 8 * 2


@pytest.mark.parametrize("engine, field, text", [
    ({"maxLoraRank": 24}, "spec.engine.maxLoraRank", "not one of vLLM's choices"),
    ({"maxLoraRank": 8}, "spec.engine.maxLoraRank", "below the largest adapter's rank 16"),
])
def test_a_pinned_rank_is_checked(engine, field, text):
    p = plan(spec_with([{"name": "a", "source": "/cache/a", "rank": 16}], engine=engine))
    assert any(text in x.message for x in p.problems if x.field == field), p.problems


def test_an_adapter_for_another_base_model_is_refused_with_the_reason():
    p = plan(spec_with([{"name": "sql", "source": "org/sql"}]), {"org/sql": lora_config(base="Qwen/Qwen2.5-7B")})
    [problem] = p.problems
    assert problem.field == "spec.adapters[0].source"
    assert "trained for Qwen/Qwen2.5-7B" in problem.message and LLAMA_8B in problem.message


@pytest.mark.parametrize("base, model, refused", [
    (LLAMA_8B, LLAMA_8B, False), ("meta-llama/llama-3.1-8b-instruct", LLAMA_8B, False),
    ("meta-llama/Llama-3.1-8B-Instruct", "hugging-quants/Llama-3.1-8B-Instruct-AWQ-INT4", False),
    ("/home/me/llama", LLAMA_8B, False), (LLAMA_8B, "/cache/models/llama", False), (None, LLAMA_8B, False),
    ("meta-llama/Llama-3.1-70B-Instruct", LLAMA_8B, True), ("Qwen/Qwen2.5-7B", LLAMA_8B, True),
])
def test_base_mismatch(base, model, refused):
    assert adapters.base_mismatch(base, model) is refused


def test_an_unreadable_config_needs_a_rank_in_the_spec():
    spec = spec_with([{"name": "sql", "source": "org/sql"}, {"name": "x", "source": "/cache/x"}])
    p = plan(spec, {"org/sql": ValueError("could not be read from https://hub.example: HTTP 404")})
    assert {x.field for x in p.problems} == {"spec.adapters[0].rank", "spec.adapters[1].rank"}
    assert any("HTTP 404" in x.message for x in p.problems)
    assert any("a path in the pod" in x.message for x in p.problems)
    ok = plan(spec_with([{"name": "sql", "source": "org/sql", "rank": 8}]),
              {"org/sql": ValueError("could not be read from https://hub.example: HTTP 404")})
    assert ok.fits, ok.problems
    assert any("sized with spec.adapters rank 8" in n for n in ok.notes)


def test_a_larger_rank_in_the_config_wins():
    p = plan(spec_with([{"name": "sql", "source": "org/sql", "rank": 8}]), {"org/sql": lora_config(64)})
    assert arg(p, "--max-lora-rank") == "64"
    assert any("says rank 64, spec says 8" in n for n in p.notes)


@pytest.mark.parametrize("config, error", [
    ([], "not a JSON object"), ({"peft_type": "IA3", "r": 8}, "not a LoRA"), ({"peft_type": "LORA"}, "no rank"),
    ({"r": True}, "no rank"), ({"r": 10**6}, "no rank"),
])
def test_parse_config_refuses_what_is_not_a_lora_config(config, error):
    assert error in (adapters.parse_config(config).error or "")


def test_names_must_be_unique_and_not_the_base_models():
    p = plan(spec_with([{"name": "llama", "source": "/cache/a", "rank": 8}, {"name": "b", "source": "/cache/b", "rank": 8},
                        {"name": "b", "source": "/cache/c", "rank": 8}]))
    assert {x.field for x in p.problems} == {"spec.adapters[0].name", "spec.adapters[2].name"}


def test_adapters_that_do_not_fit_are_refused_naming_the_slots():
    p = plan(spec_with([{"name": "a", "source": "/cache/a", "rank": 512}], engine={"maxLoras": 32},
                       gpu={"count": 1, "product": "NVIDIA-L4"}))
    assert any("LoRA adapters' slots" in x.message and "maxLoras" in x.message for x in p.problems), p.problems


def test_a_vocabulary_larger_than_vllms_lora_limit_is_refused():
    p = plan(spec_with([{"name": "a", "source": "/cache/a", "rank": 8}], model={"name": "google/gemma-3-4b-it"}))
    assert any(x.field == "spec.adapters" and "258048" in x.message for x in p.problems), p.problems


def test_a_mixture_of_experts_model_is_refused():
    p = plan(spec_with([{"name": "a", "source": "/cache/a", "rank": 8}], model={"name": "mistralai/Mixtral-8x7B-Instruct-v0.1"},
                       gpu={"count": 4, "product": "H100"}))
    assert any(x.field == "spec.adapters" and "mixture-of-experts" in x.message for x in p.problems), p.problems


@pytest.mark.parametrize("extra", [["--enable-lora"], ["--max-loras", "2"], ["--max-lora-rank=64"],
                                   ["--lora-modules", "a=/cache/a"]])
def test_extra_args_cannot_set_the_lora_flags(extra):
    p = plan(spec_with([], engine={"extraArgs": extra}))
    assert any("spec.adapters" in x.message or "maxLora" in x.message for x in p.problems), p.problems


def test_the_slot_settings_need_adapters():
    p = plan(spec_with([], engine={"maxLoras": 2}))
    assert [x.field for x in p.problems] == ["spec.engine.maxLoras"]


def test_runtime_updating_is_in_the_pods_env_only_with_adapters():
    def env(spec: api.VLLMServerSpec) -> dict[str, str]:
        return {e["name"]: e.get("value", "") for e in builders.container_env(plan(spec))}
    assert env(spec_with([{"name": "a", "source": "/cache/a", "rank": 8}]))[adapters.RUNTIME_ENV] == "True"
    assert adapters.RUNTIME_ENV not in env(spec_with([]))
    p = plan(spec_with([], engine={"env": [{"name": adapters.RUNTIME_ENV, "value": "True"}]}))
    assert [x.field for x in p.problems] == ["spec.engine.env[0].name"]


# --------------------------------------------------------------------------- status
def test_status_rows_served_models_and_the_condition():
    pods = [adapters.PodAdapters("srv-0", listed=frozenset({"sql", "chat"})),
            adapters.PodAdapters("srv-1", listed=frozenset({"sql"}), errors={"chat": "load: HTTP 404"}),
            adapters.PodAdapters("srv-2")]  # not reached yet: not counted
    rows = adapters.adapter_rows(["sql", "chat"], pods)
    assert rows == [{"name": "sql", "loaded": 2, "replicas": 2},
                    {"name": "chat", "loaded": 1, "replicas": 2, "lastError": "srv-1: load: HTTP 404"}]
    assert adapters.served_models("llama", ["sql", "chat"], pods) == ["llama", "sql"]
    assert adapters.served_models("llama", ["sql", "chat"], pods[:1]) == ["llama", "sql", "chat"]  # srv-1 held back
    assert adapters.served_models("llama", ["sql"], []) == ["llama"]
    status, reason, message = adapters.condition(rows)
    assert (status, reason) == ("False", "AdapterLoadFailed")
    assert "chat (srv-1: load: HTTP 404)" in message and "keep serving" in message
    loaded = adapters.adapter_rows(["sql"], pods[:2])
    assert adapters.condition(loaded)[:2] == ("True", "Loaded")
    assert adapters.condition(adapters.adapter_rows(["sql"], []))[:2] == ("Unknown", "NoReadyReplica")
    loading = adapters.adapter_rows(["chat"], [adapters.PodAdapters("srv-0", listed=frozenset())])
    assert adapters.condition(loading)[:2] == ("False", "Loading")


# --------------------------------------------------------------------------- the readiness gate
def gated_pod(*, containers_ready: bool = True, gate: Optional[tuple[str, str]] = None, restarts: int = 0,
              gates: bool = True, deleting: bool = False) -> dict:
    """A pod of a server with adapters as the API server returns it; `gate`: its gate condition (status, message)."""
    conditions = [{"type": "ContainersReady", "status": "True" if containers_ready else "False"},
                  {"type": "Ready", "status": "False"}]
    if gate is not None:
        conditions.append({"type": adapters.GATE, "status": gate[0], "message": gate[1]})
    meta = {"name": "srv-0", "namespace": "ns", "uid": "u1", "resourceVersion": "42"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T15:00:00Z"
    return {"metadata": meta,
            "spec": {"readinessGates": [{"conditionType": adapters.GATE}] if gates else []},
            "status": {"conditions": conditions, "containerStatuses": [{"name": "vllm", "restartCount": restarts}]}}


def test_the_gate_is_in_the_pod_template_only_with_adapters():
    """A server without adapters keeps its pod template (no readiness gate: no roll of the servers that do not use
    adapters); with adapters, the gate comes with --enable-lora (one change of the template, no extra roll)."""
    with_adapters = builders.base_pod_template(plan(spec_with([{"name": "a", "source": "/cache/a", "rank": 8}])))
    assert with_adapters["spec"]["readinessGates"] == [{"conditionType": adapters.GATE}]
    assert "--enable-lora" in with_adapters["spec"]["containers"][0]["args"]
    assert "readinessGates" not in builders.base_pod_template(plan(spec_with([])))["spec"]
    # On the node's network the operator never calls the pods (tenant safety): no gate that could never open.
    daemon = spec_with([{"name": "a", "source": "/cache/a", "rank": 8}])
    daemon = daemon.model_copy(update={"workload": "DaemonSet", "host_network": True})
    assert "readinessGates" not in builders.base_pod_template(plan(daemon))["spec"]


def test_the_gate_opens_once_every_adapter_was_tried_on_the_pods_vllm():
    names = ["sql", "chat"]
    pod = gated_pod()
    assert adapters.gate_due(pod)
    assert adapters.gate_wanted(pod, None, names) is None  # not read yet
    assert adapters.gate_wanted(pod, adapters.PodAdapters("srv-0"), names) is None  # not reached
    half = adapters.PodAdapters("srv-0", listed=frozenset({"sql"}))
    assert adapters.gate_wanted(pod, half, names) is None  # chat not tried yet
    status, reason, message = adapters.gate_wanted(pod, adapters.PodAdapters(
        "srv-0", listed=frozenset({"sql", "chat"})), names)
    assert (status, reason) == ("True", "AdaptersLoaded") and "2 of 2" in message and "(container restarts 0)" in message
    # A refused adapter counts as tried: a bad adapter never keeps a replica out of service.
    status, _, message = adapters.gate_wanted(pod, adapters.PodAdapters(
        "srv-0", listed=frozenset({"sql"}), errors={"chat": "load: HTTP 404"}), names)
    assert status == "True" and "1 of 2" in message and "1 failed" in message
    # vLLM not answering yet: nothing to do, the kubelet keeps the pod out anyway.
    assert not adapters.gate_due(gated_pod(containers_ready=False))
    # No gate in the pod's spec (a pod of the template before the gate), or a pod being deleted: never touched.
    loaded = adapters.PodAdapters("srv-0", listed=frozenset(names))
    assert adapters.gate_wanted(gated_pod(gates=False), loaded, names) is None
    assert adapters.gate_wanted(gated_pod(deleting=True), loaded, names) is None


def test_the_gate_closes_when_the_vllm_under_it_restarted():
    names = ["sql"]
    loaded = adapters.PodAdapters("srv-0", listed=frozenset(names))
    set_at_0 = ("True", "1 of 1 adapter(s) loaded on this pod's vLLM (container restarts 0)")
    assert not adapters.gate_due(gated_pod(gate=set_at_0))  # current: nothing to do
    assert adapters.gate_wanted(gated_pod(gate=set_at_0), loaded, names) is None
    # The container restarted (restart count 1), its new vLLM still loading: the gate closes before it answers.
    restarted = gated_pod(containers_ready=False, gate=set_at_0, restarts=1)
    assert adapters.gate_due(restarted)
    status, reason, message = adapters.gate_wanted(restarted, None, names)
    assert (status, reason) == ("False", "VLLMRestarted") and "(container restarts 1)" in message
    # The new vLLM answers and lists the adapters: open again, for restart 1.
    status, _, message = adapters.gate_wanted(gated_pod(gate=("False", message), restarts=1), loaded, names)
    assert status == "True" and "(container restarts 1)" in message
    # A True gate whose message is not ours is not trusted: it is checked again like a stale one.
    assert adapters.gate_due(gated_pod(gate=("True", "set by hand")))


def test_the_gate_patch_merges_by_type_and_is_conditional():
    patch = adapters.gate_patch(gated_pod(), "True", "AdaptersLoaded", "m", now="2026-12-02T15:00:00Z")
    assert patch == {"metadata": {"resourceVersion": "42"},
                     "status": {"conditions": [{"type": adapters.GATE, "status": "True", "reason": "AdaptersLoaded",
                                                "message": "m", "lastTransitionTime": "2026-12-02T15:00:00Z"}]}}


def test_set_gates_patches_only_the_pods_whose_gate_changes():
    from vllm_operator.controller.adapters import set_gates
    from vllm_operator.kube.client import ApiError

    class Kube:
        def __init__(self, fail: bool = False):
            self.calls, self.fail = [], fail

        def request(self, method, path, *, body=None, content_type=""):
            self.calls.append((method, path, content_type, body["status"]["conditions"][0]["status"]))
            if self.fail:
                raise ApiError(409, "{}", method, path)

    done = gated_pod(gate=("True", "x (container restarts 0)"))
    done["metadata"]["name"] = "srv-1"
    kube = Kube()
    known = [adapters.PodAdapters("srv-0", listed=frozenset({"sql"})), adapters.PodAdapters(
        "srv-1", listed=frozenset({"sql"}))]
    assert set_gates(kube, [gated_pod(), done], known, ["sql"]) == 1
    assert kube.calls == [("PATCH", "/api/v1/namespaces/ns/pods/srv-0/status",
                           "application/strategic-merge-patch+json", "True")]
    assert set_gates(Kube(fail=True), [gated_pod()], known, ["sql"]) == 0  # a conflict: the next reconcile retries


def test_the_docs_figure_for_llama_8b():
    """docs/adapters.md: Llama 3.1 8B in bfloat16 with the default 4 slots of rank 16 takes 0.34 GiB per GPU."""
    p = plan(spec_with([{"name": "a", "source": "/cache/a", "rank": 16}]))
    assert p.memory is not None and round(p.memory.lora / 2**30, 2) == 0.34


# --------------------------------------------------------------------------- the sync, against a hostile pod
def test_the_sync_loads_unloads_and_keeps_only_categories():
    """controller/adapters.AdapterSync against a fake pod (e2e/testbed/hostile_http.py: its error pages quote a
    secret): it lists, loads what is missing, unloads what the spec dropped, and records a failed load as its
    category only."""
    import json
    import threading

    from e2e.testbed.hostile_http import SECRET, HostileServer, Reply
    from vllm_operator.controller.adapters import AdapterSync
    from vllm_operator.sources.vllm_metrics import PodRef

    models = {"data": [{"id": "llama", "parent": None}, {"id": "old", "parent": "llama"}, {"id": "sql", "parent": "llama"}]}
    routes = {"/v1/models": Reply(200, json.dumps(models).encode()),
              "/v1/load_lora_adapter": Reply(400, f"no such adapter; {SECRET}".encode()),
              "/v1/unload_lora_adapter": Reply(200, b"ok")}
    changed = threading.Event()
    with HostileServer(routes) as s:
        sync = AdapterSync(notify=lambda ns, name: changed.set())
        try:
            ref = PodRef("srv-0", "ns", "127.0.0.1", s.port)
            wanted = (("sql", "org/sql"), ("chat", "/cache/chat"))
            assert sync.observe("ns", "srv", [ref], {"srv-0": ("uid", 0)}, wanted)[0].listed is None  # not yet read
            assert changed.wait(10)
            [known] = sync.observe("ns", "srv", [ref], {"srv-0": ("uid", 0)}, wanted)
        finally:
            sync.close()
    assert known.listed == frozenset({"old", "sql"}) and known.errors == {"chat": "load: HTTP 400"}
    assert [json.loads(b) for b in s.bodies] == [{"lora_name": "chat", "lora_path": "/cache/chat"},
                                                 {"lora_name": "old"}]
    assert s.requests == ["/v1/models", "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/models"]
    rows = adapters.adapter_rows(["sql", "chat"], [known])
    assert rows[1]["lastError"] == "srv-0: load: HTTP 400" and SECRET not in json.dumps(rows)


def test_the_sync_reads_a_pod_again_when_it_restarts_and_not_before_it_is_due():
    """A fresh read is not repeated before refresh_seconds; a restarted container (its restart count) or a new pod
    (its uid) is read at once: its new vLLM holds none of the old one's adapters."""
    import json
    import threading

    from e2e.testbed.hostile_http import HostileServer, Reply
    from vllm_operator.controller.adapters import AdapterSync
    from vllm_operator.sources.vllm_metrics import PodRef

    models = {"data": [{"id": "llama"}, {"id": "sql", "parent": "llama"}]}
    synced = threading.Semaphore(0)
    with HostileServer({"/v1/models": Reply(200, json.dumps(models).encode())}) as s:
        sync = AdapterSync(notify=lambda ns, name: synced.release(), refresh_seconds=3600)
        ref, wanted = PodRef("srv-0", "ns", "127.0.0.1", s.port), (("sql", "org/sql"),)
        try:
            def observe(incarnation: tuple[str, int]) -> None:
                sync.observe("ns", "srv", [ref], {"srv-0": incarnation}, wanted)
            observe(("uid-1", 0))
            assert synced.acquire(timeout=10)
            observe(("uid-1", 0))  # fresh: no read
            observe(("uid-1", 1))  # the container restarted
            assert synced.acquire(timeout=10)
            observe(("uid-2", 0))  # the pod was recreated
            assert synced.acquire(timeout=10)
        finally:
            sync.close()
    assert s.requests == ["/v1/models"] * 3


def test_hub_file_json_reads_a_resolve_url_and_refuses_a_redirect():
    """sources/hub.file_json: the Hub's resolve URL of the file at the revision, through the bounded GET; a redirect
    (an LFS file on the Hub's CDN) and an error are categories, never the answer's bytes."""
    import json

    from e2e.testbed.hostile_http import SECRET, HostileServer, Reply, redirect_to
    from vllm_operator.sources import hub as hub_source

    config = lora_config(8)
    with HostileServer({"/org/sql/resolve/v2/adapter_config.json": Reply(200, json.dumps(config).encode()),
                        "/org/lfs/resolve/main/adapter_config.json": redirect_to("/cdn", 302)}) as s:
        assert hub_source.file_json("org/sql", "adapter_config.json", "v2", endpoint=s.base) == config
        for repo, category in (("org/lfs", "redirect refused"), ("org/none", "HTTP 404")):
            with pytest.raises(hub_source.HubError) as info:
                hub_source.file_json(repo, "adapter_config.json", endpoint=s.base)
            assert str(info.value) == f"could not be read from {s.base}: {category}"
            assert SECRET not in str(info.value)
    assert "/cdn" not in s.requests

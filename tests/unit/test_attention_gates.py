"""The attention backend and FP8 KV cache gates (issue 12 item 3): what each vLLM release's backend selection
refuses on a GPU's compute capability, read from its code into its flag snapshot (tools/dump_vllm_flags.py), and
refused before anything is deployed, naming the field and what runs there instead."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_planner import LLAMA_8B, messages, plan_for
from vllm_operator import api, validation, vllm_flags

KV = "spec.engine.kvCacheDtype"


def plan(gpu: str, engine: dict[str, Any], image: str = api.DEFAULT_IMAGE, model: Any = LLAMA_8B):
    return plan_for(model, gpu={"count": 1, "product": gpu}, engine=engine, image=image)


def backend_args(name: str) -> dict[str, Any]:
    return {"extraArgs": ["--attention-backend", name]}


# --------------------------------------------------------------------------- what the snapshots say


@pytest.mark.parametrize("release", vllm_flags.releases())
def test_each_release_records_its_backends_gates(release):
    """Read from the release's code (the drift test in test_vllm_parser.py regenerates them): FlashAttention
    stores FP8 only with FA3 on Hopper or FA4 on SM100, and never e5m2; FlashInfer from 8.0 to 12.x; Triton's
    implementation refuses FP8 below 8.9 (native fp8e4nv); FlexAttention stores none."""
    snap = vllm_flags.snapshot(release)
    fa, fi, triton = (snap.attention_backends[n] for n in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"))
    assert fa.capabilities == {80, 86, 89, 90, 100, 120}
    # 0.26.0 stores FP8 in FlashAttention with FA3 on Hopper only (its FA4 has no FP8 KV cache)
    assert fa.kv_cache_capabilities["fp8"] == ({90} if release == "0.26.0" else {90, 100})
    assert not fa.kv_cache_capabilities["fp8_e5m2"]
    assert fi.capabilities == fi.kv_cache_capabilities["fp8_e5m2"] == {80, 86, 89, 90, 100, 120}
    assert triton.capabilities == {70, 75, 80, 86, 89, 90, 100, 120}
    assert triton.kv_cache_capabilities["fp8"] == {89, 90, 100, 120}
    assert not snap.attention_backends["FLEX_ATTENTION"].kv_cache_capabilities["fp8"]
    assert snap.attention_default_backends[90][:3] == ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
    assert snap.attention_default_backends[100][0] == "FLASHINFER"  # Blackwell prefers FlashInfer
    for cap in (70, 75):
        assert snap.kv_cache_backends("fp8", cap) == [], (release, cap)
    assert not snap.attention_backend_env  # VLLM_ATTENTION_BACKEND is gone from vllm/envs.py in all of them


def test_the_releases_differ_where_their_code_does():
    has = {r: set(vllm_flags.snapshot(r).attention_backends) for r in vllm_flags.releases()}
    assert "TRITON_FLASHINFER" not in has["0.29.0"] and "TRITON_FLASHINFER" in has["0.30.0"]
    # TritonFlashAttention (Hopper) took FP8 KV in 0.31
    fp8 = {r: vllm_flags.snapshot(r).attention_backends["TRITON_FLASH_ATTN"].kv_cache_capabilities["fp8"]
           for r in ("0.30.0", "0.31.0")}
    assert fp8 == {"0.30.0": frozenset(), "0.31.0": {90}}


# --------------------------------------------------------------------------- FP8 KV cache


@pytest.mark.parametrize("gpu, product", [("T4", "Tesla-T4"), ("V100-SXM2-32GB", "Tesla-V100-SXM2-32GB")])
@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_an_fp8_kv_cache_no_backend_stores_on_the_gpu_is_refused(gpu, product, kv):
    p = plan(gpu, {"kvCacheDtype": kv})
    [message] = messages(p, KV)
    assert message.startswith(f"{kv}: none of the attention backends vLLM 0.32.0 picks from on {product} (compute "
                              f"capability {'7.5' if gpu == 'T4' else '7.0'}) stores an {kv} KV cache (FLASH_ATTN, "
                              "FLASHINFER, TRITON_ATTN, FLEX_ATTENTION, TURBOQUANT)"), message
    assert message.endswith("(they do from compute capability 8.0): use kvCacheDtype auto (the KV cache in the "
                            "model's dtype)"), message


@pytest.mark.parametrize("gpu, kv", [
    ("A100-SXM4-40GB", "fp8"),         # FlashInfer (FlashAttention 2 has no FP8 KV; vLLM passes it over)
    ("A10", "fp8_e5m2"),               # FlashInfer
    ("L4", "fp8"), ("H100-SXM5-80GB", "fp8_e5m2"), ("B200", "fp8_e4m3"),
    ("T4", "auto"), ("V100-SXM2-32GB", None),
])
def test_an_fp8_kv_cache_a_backend_stores_is_accepted(gpu, kv):
    engine = {"kvCacheDtype": kv} if kv else {}
    assert not messages(plan(gpu, engine), KV)


def test_an_mla_models_fp8_kv_cache_is_not_checked():
    """vLLM picks among its MLA backends for those (not the standard decoder's order the snapshot holds)."""
    mla = {"name": LLAMA_8B, "architecture": {"kvLoraRank": 512, "qkRopeHeadDim": 64}}
    assert not messages(plan("T4", {"kvCacheDtype": "fp8"}, model=mla), KV)


# --------------------------------------------------------------------------- a chosen backend


@pytest.mark.parametrize("backend", ["FLASHINFER", "FLASH_ATTN", "flash_attn"])
def test_a_backend_the_gpu_cannot_run_is_refused_naming_those_that_run(backend):
    p = plan("T4", backend_args(backend))
    assert messages(p, "spec.engine.extraArgs[1]") == [
        f"attention backend {backend.upper()} does not run on Tesla-T4 (compute capability 7.5) in vLLM 0.32.0 (its "
        "supports_compute_capability): choose one that does, TRITON_ATTN, FLEX_ATTENTION, or auto (vLLM picks the "
        "first backend that fits the model and the GPU)"]


@pytest.mark.parametrize("gpu, extra", [
    ("T4", ["--attention-backend", "TRITON_ATTN"]), ("T4", ["--attention-backend", "auto"]),
    ("T4", ["--attention-backend=flex_attention"]),
    ("A100-SXM4-40GB", ["--attention-backend", "FLASH_ATTN"]), ("A100-SXM4-40GB", ["--attention-backend=FLASHINFER"]),
    ("H100-SXM5-80GB", ["--attention-config.backend", "FLASH_ATTN"]),
])
def test_a_backend_the_gpu_runs_is_accepted(gpu, extra):
    p = plan(gpu, {"extraArgs": extra})
    assert not [q for q in p.problems if q.field.startswith("spec.engine")], p.problems


@pytest.mark.parametrize("extra, field", [
    (["--attention-backend", "FLASHINFER"], "spec.engine.extraArgs[1]"),
    (["--attention-backend=FLASH_ATTN"], "spec.engine.extraArgs[0]"),
    (["--attention-config", '{"backend": "flash_attn"}'], "spec.engine.extraArgs[1]"),
    (["--attention-config={\"backend\": \"FLASHINFER\"}"], "spec.engine.extraArgs[0]"),
])
def test_every_way_of_choosing_a_backend_is_checked(extra, field):
    p = plan("T4", {"extraArgs": extra})
    [message] = messages(p, field)
    assert " does not run on Tesla-T4 (compute capability 7.5)" in message


@pytest.mark.parametrize("gpu, backend, kv, words", [
    ("A100-SXM4-40GB", "TRITON_ATTN", "fp8",
     "fp8: attention backend TRITON_ATTN (spec.engine.extraArgs[1]) stores no fp8 KV cache on NVIDIA-A100-SXM4-40GB "
     "(compute capability 8.0) in vLLM 0.32.0: choose backend FLASHINFER or auto (they store it), or use "
     "kvCacheDtype auto (the KV cache in the model's dtype)"),
    ("H100-SXM5-80GB", "FLASH_ATTN", "fp8_e5m2",
     "fp8_e5m2: attention backend FLASH_ATTN (spec.engine.extraArgs[1]) stores no fp8_e5m2 KV cache on "
     "NVIDIA-H100-80GB-HBM3 (compute capability 9.0) in vLLM 0.32.0: choose backend FLASHINFER, TRITON_ATTN or auto "
     "(they store it), or use kvCacheDtype fp8 or fp8_e4m3 (it stores those) or auto"),
    ("L4", "FLEX_ATTENTION", "fp8",
     "fp8: attention backend FLEX_ATTENTION (spec.engine.extraArgs[1]) stores no fp8 KV cache on NVIDIA-L4 (compute "
     "capability 8.9) in vLLM 0.32.0: choose backend FLASHINFER, TRITON_ATTN or auto (they store it), or use "
     "kvCacheDtype auto (the KV cache in the model's dtype)"),
])
def test_a_chosen_backend_without_the_fp8_kv_cache_is_refused(gpu, backend, kv, words):
    p = plan(gpu, {"kvCacheDtype": kv, **backend_args(backend)})
    assert messages(p, KV) == [words]


@pytest.mark.parametrize("gpu, backend, kv", [
    ("L4", "TRITON_ATTN", "fp8"), ("A100-SXM4-40GB", "FLASHINFER", "fp8_e5m2"), ("H100-SXM5-80GB", "FLASH_ATTN", "fp8"),
])
def test_a_chosen_backend_with_the_fp8_kv_cache_is_accepted(gpu, backend, kv):
    assert not messages(plan(gpu, {"kvCacheDtype": kv, **backend_args(backend)}), KV)


# --------------------------------------------------------------------------- backend names, per release


def test_an_unknown_backend_is_refused_with_the_near_names():
    p = plan("L4", backend_args("FLASH_ATEN"))
    assert messages(p, "spec.engine.extraArgs[1]") == [
        "vLLM 0.32.0 has no attention backend 'FLASH_ATEN' and would exit at start: did you mean FLASH_ATTN, "
        "FLASH_ATTN_MLA, TRITON_FLASH_ATTN? Name one of its backends, or auto (vLLM picks the best one for the GPU)"]


@pytest.mark.parametrize("release, known", [("0.29.0", False), ("0.30.0", True), ("0.32.0", True)])
def test_a_backend_name_is_checked_against_the_images_release(release, known):
    p = plan("B200", backend_args("TRITON_FLASHINFER"), image=f"vllm/vllm-openai:v{release}")
    refused = messages(p, "spec.engine.extraArgs[1]")
    assert (not refused) == known, refused
    if not known:
        assert refused[0].startswith(f"vLLM {release} has no attention backend 'TRITON_FLASHINFER'")


def test_a_release_without_a_snapshot_is_not_refused_a_name_another_release_may_have():
    p = plan("L4", backend_args("SOME_NEW_BACKEND"), image="vllm/vllm-openai:v0.34.0")
    assert not messages(p, "spec.engine.extraArgs[1]")


def test_the_environment_variable_vllm_no_longer_reads_is_refused():
    p = plan("L4", {"env": [{"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}]})
    assert messages(p, "spec.engine.env[0]") == [
        "vLLM 0.32.0 does not read VLLM_ATTENTION_BACKEND: the server would ignore it and pick its own backend. "
        "Choose one with extraArgs ['--attention-backend', NAME] instead"]


@pytest.mark.parametrize("value", ["[1", "[\"FLASHINFER\"]", "{\"backend\": 7}", "{}", "{\"backend\": \"auto\"}"])
def test_an_attention_config_without_a_backend_name_chooses_none(value):
    """The tenant's JSON is read, never trusted: not an object, no backend, not a name, auto: no choice to check
    (vLLM's parser refuses what is not an AttentionConfig; the flag check passes it to vLLM as it stands)."""
    spec = api.VLLMServerSpec.model_validate({"model": {"name": LLAMA_8B},
                                              "engine": {"extraArgs": ["--attention-config", value]}})
    assert validation.chosen_attention_backends(spec) == []


def test_an_unknown_gpu_is_not_checked_against_the_backends():
    p = plan_for(LLAMA_8B, gpu={"count": 1, "product": "NVIDIA-Future-GPU", "memory": "48Gi"},
                 engine={"kvCacheDtype": "fp8", **backend_args("FLASHINFER")})
    assert not messages(p, KV) and not messages(p, "spec.engine.extraArgs[1]")

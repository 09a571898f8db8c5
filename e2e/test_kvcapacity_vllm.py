"""status.kvCapacity's number from a real vLLM CPU server: what its 1 GiB KV cache holds."""

from __future__ import annotations


import pytest

from e2e.testbed.memory_world import NS
from vllm_operator.sources.vllm_metrics import (Observations, PodRef)


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_the_real_cpu_server_reports_what_its_1_gib_kv_cache_holds(tmp_path):
    """The operator's own scrape (PodsSource in its bounded pool, through Observations) of a real vLLM 0.32 CPU
    server: VLLM_CPU_KVCACHE_SPACE=1 GiB over the tiny model's 2 x 2 layers x 2 KV heads x 64 x 4 bytes per token."""
    import json
    import time

    from e2e.testbed.vllm_env import free_port, start_vllm, tiny_model_dir
    from vllm_operator.sources.vllm_metrics import PodsSource

    cfg = json.loads((tiny_model_dir() / "config.json").read_text())
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4  # float32
    expected = 2**30 // per_token
    host = "127.0.0.44"
    proc = start_vllm(host, free_port(host), log_path=tmp_path / "vllm.log", stop_grace=5)
    source = PodsSource(timeout=5)
    try:
        proc.wait_healthy(300)
        obs = Observations(submit=source.submit)
        ref = PodRef("tiny-0", NS, host, proc.port)
        deadline = time.monotonic() + 30
        while not (found := obs.measure([ref])):
            assert time.monotonic() < deadline, proc.log_tail()
            time.sleep(0.2)
        print(f"measured {found['tiny-0']} KV cache tokens, expected {expected}")
        assert expected == 524288
        assert found == {"tiny-0": expected}
        assert f"CPU KV cache size: {expected:,} tokens" in proc.log_path.read_text(errors="replace")
    finally:
        source.close()
        proc.stop(grace=5)

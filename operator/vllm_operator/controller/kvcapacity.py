"""Plan vs reality: the KV cache capacity vLLM allocated on the ready pods, beside the plan's estimate.

vLLM exports ``vllm:cache_config_info``, an info gauge whose labels include ``num_gpu_blocks`` and
``block_size``: their product is the KV cache's capacity in tokens, what the planner estimated as
``status.plan.estimates.kvCacheTokens``. The readings come from ``sources/vllm_metrics.py`` (`Observations`);
this module turns them into ``status.kvCapacity`` and its Warning event. Pure.
"""

from __future__ import annotations

from typing import Any, Optional

#: Measured below this fraction of the plan: the plan was optimistic (a Warning event, once per transition).
BELOW_PLAN_RATIO = 0.9
EVENT_REASON = "KVCapacityBelowPlan"


def status(planned: Optional[int], measured: dict[str, int], ready: int,
           previous: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """status.kvCapacity: the plan's tokens, the smallest measured over the ready pods, how many pods reported.

    With no reading now, the previous measurement stays while the plan is the same (a rollout or a restart
    does not blank it, nor re-emit its event)."""
    if not planned:
        return None
    if not measured:
        if previous and previous.get("planned") == planned and previous.get("measured"):
            return previous
        return {"planned": planned}
    smallest = min(measured.values())
    return {"planned": planned, "measured": smallest, "ratio": round(smallest / planned, 3),
            "pods": len(measured), "readyPods": ready}


def below_plan(kv: Optional[dict[str, Any]]) -> bool:
    return bool(kv and kv.get("measured") and kv["measured"] < BELOW_PLAN_RATIO * kv["planned"])


def warning(kv: dict[str, Any]) -> str:
    return (f"vLLM allocated {kv['measured']} KV cache tokens (vllm:cache_config_info num_gpu_blocks x block_size, "
            f"the smallest of {kv['pods']} pod(s)), {kv['ratio']:.0%} of the plan's {kv['planned']}: the plan was "
            "optimistic, so the server holds fewer or shorter requests at once than planned (queueing and "
            "preemption start earlier). Check gpu.memory and gpu.reservedMemory against the GPU's real free memory, "
            "or pin engine.gpuMemoryUtilization")

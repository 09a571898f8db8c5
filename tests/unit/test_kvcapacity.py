"""Plan vs reality: vllm:cache_config_info parsed from a real vLLM 0.32 /metrics, status.kvCapacity and its
Warning event (kvcapacity.py, the reconciler)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path


from e2e.testbed.memory_world import NS, World
from vllm_operator.sources.vllm_metrics import (REFRESH_SECONDS, Observations, PodRef, Sample, kv_capacity_tokens,
                                                parse_vllm_metrics)

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = (DATA / "vllm-0.32.0-cpu-tiny-metrics.txt").read_text()


def test_the_real_servers_kv_capacity_is_num_gpu_blocks_times_block_size():
    sample = parse_vllm_metrics("tiny-0", REAL, 0.0)
    assert sample.ok and sample.waiting == 0 and sample.running == 0
    # 4096 blocks of 128 tokens: what vLLM's own kv_cache_size_tokens label and its log line say
    assert sample.kv_capacity_tokens == 4096 * 128 == 524288
    assert 'kv_cache_size_tokens="524288"' in REAL


def test_engines_add_up_and_a_cache_not_allocated_yet_is_no_number():
    line = next(l for l in REAL.splitlines() if l.startswith("vllm:cache_config_info{"))
    two = REAL.replace(line, line + "\n" + line.replace('engine="0"', 'engine="1"').replace(
        'num_gpu_blocks="4096"', 'num_gpu_blocks="1000"'))
    assert parse_vllm_metrics("p", two, 0.0).kv_capacity_tokens == 524288 + 128000
    unset = REAL.replace('num_gpu_blocks="4096"', 'num_gpu_blocks="None"')
    assert parse_vllm_metrics("p", unset, 0.0).kv_capacity_tokens is None
    assert kv_capacity_tokens({"num_gpu_blocks": "0", "block_size": "16"}) is None


class FakeScrapes:
    """PodsSource.submit stand-in: futures completed by the test, one per scrape started."""

    def __init__(self):
        self.started: list[tuple[PodRef, Future]] = []

    def __call__(self, ref: PodRef) -> Future:
        f: Future = Future()
        self.started.append((ref, f))
        return f

    def answer(self, text: str) -> None:
        for ref, f in self.started:
            if not f.done():
                f.set_result(parse_vllm_metrics(ref.name, text, 0.0))


def test_observations_scrape_each_pod_once_per_refresh_in_the_background():
    now = [1000.0]
    scrapes = FakeScrapes()
    obs = Observations(submit=scrapes, clock=lambda: now[0])
    a, b = PodRef("s-0", NS, "10.0.0.1"), PodRef("s-1", NS, "10.0.0.2")
    assert obs.measure([a, b]) == {}  # nothing known yet: the scrapes start, the caller does not wait
    assert [r.name for r, _ in scrapes.started] == ["s-0", "s-1"]
    assert obs.measure([a, b]) == {} and len(scrapes.started) == 2  # pending: not started twice
    scrapes.answer(REAL)
    assert obs.measure([a, b]) == {"s-0": 524288, "s-1": 524288}
    now[0] += 60
    assert obs.measure([a, b]) and len(scrapes.started) == 2  # fresh: no scrape
    now[0] += REFRESH_SECONDS
    obs.measure([a, b])
    assert len(scrapes.started) == 4  # stale: scraped again, the old numbers meanwhile
    for _, f in scrapes.started[2:]:
        f.set_exception(TimeoutError("timed out"))
    assert obs.measure([a, b]) == {"s-0": 524288, "s-1": 524288}  # a failed scrape keeps a pod's number
    moved = PodRef("s-0", NS, "10.0.0.9")  # a new pod by the same name
    assert obs.measure([moved]) == {} and scrapes.started[-1][0] == moved


def test_the_autoscalers_scrapes_are_readings_so_no_second_scrape():
    scrapes = FakeScrapes()
    obs = Observations(submit=scrapes)
    a = PodRef("s-0", NS, "10.0.0.1")
    obs.record([a], [parse_vllm_metrics("s-0", REAL, 0.0)])
    obs.record([a], [Sample.failed("s-0", "timed out")])  # a failed tick is no reading
    assert obs.measure([a]) == {"s-0": 524288} and scrapes.started == []


def _ready(world: World, name: str, ip: str) -> None:
    world.add_pod(name, status={"phase": "Running", "podIP": ip,
                                "conditions": [{"type": "Ready", "status": "True"}]})


def test_status_shows_plan_beside_measurement_and_warns_once_when_below():
    world = World()
    scrapes = FakeScrapes()
    world.reconciler.kv_capacity = Observations(submit=scrapes)
    status = world.reconcile()["status"]
    planned = status["plan"]["estimates"]["kvCacheTokens"]
    assert status["kvCapacity"] == {"planned": planned}  # no ready pod: nothing measured yet
    _ready(world, "srv-0", "10.0.0.1")
    world.workload_reports(ready=1)
    world.reconcile()
    assert [r.name for r, _ in scrapes.started] == ["srv-0"]

    # vLLM allocated 95% of the plan: reported, no warning
    blocks = int(planned * 0.95) // 16
    scrapes.answer(REAL.replace('num_gpu_blocks="4096"', f'num_gpu_blocks="{blocks}"').replace(
        'block_size="128"', 'block_size="16"'))
    kv = world.reconcile()["status"]["kvCapacity"]
    assert kv == {"planned": planned, "measured": blocks * 16, "ratio": round(blocks * 16 / planned, 3),
                  "pods": 1, "readyPods": 1}
    assert world.warning_events() == []

    # a second pod allocated 80%: the smallest counts, one Warning event, not repeated
    _ready(world, "srv-1", "10.0.0.2")
    world.reconcile()
    low = int(planned * 0.8) // 16
    scrapes.answer(REAL.replace('num_gpu_blocks="4096"', f'num_gpu_blocks="{low}"').replace(
        'block_size="128"', 'block_size="16"'))
    kv = world.reconcile()["status"]["kvCapacity"]
    assert kv["measured"] == low * 16 and kv["pods"] == 2 and kv["ratio"] < 0.9
    (reason, message), = world.warning_events()
    assert reason == "KVCapacityBelowPlan"
    assert f"vLLM allocated {low * 16} KV cache tokens" in message and f"plan's {planned}" in message
    world.reconcile()
    assert len(world.warning_events()) == 1

    # the pods go away (a restart): the measurement stays, and no second event when they come back low
    for name in ("srv-0", "srv-1"):
        del world.kube.objects[("Pod", NS, name)]
    assert world.reconcile()["status"]["kvCapacity"]["measured"] == low * 16
    assert len(world.warning_events()) == 1


def test_no_observer_no_field():
    assert "kvCapacity" not in World().reconcile()["status"]

"""kopf's start-up index wait: its ToggleSet against vllm_operator.kopfext.toggles.ToggleSet, side by side.

    python bench/toggles.py                  # N = 500, 1000, 2000, 4000 watched objects
    python bench/toggles.py --n 1000 5000

Prints figures; it is not a test. It replays, in one process and with no API server, what
kopf's reactor does with its `operator_indexed` toggle set when the operator starts
(kopf/_core/reactor/orchestration.py, queueing.py, processing.py): a blocker toggle until
every watcher is spawned, a toggle per resource kind until its listing ends, and a toggle
per listed object; each object's worker runs its index handlers, drops its toggle and waits
until the whole set is on. The time from the first listed object until the last worker is
released is the silence a restarted operator shows before resuming anything. Both classes
run the same script alternately in the same process; the ratio is kopf's time over ours.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from vllm_operator.kopfext import toggles  # noqa: E402

KINDS = ("vllmservers", "statefulsets", "services", "poddisruptionbudgets", "pods")


async def prepopulate(toggle_set_class: type, n: int) -> tuple[float, int]:
    """Seconds until every one of n objects' workers is released, and how many were released early."""
    indexed = toggle_set_class(all)
    blocker = await indexed.make_toggle(name="orchestration blocker")
    kinds = {kind: await indexed.make_toggle(name=kind) for kind in KINDS}
    released = 0
    early = 0
    listing_over = False

    async def worker(toggle) -> None:
        nonlocal released, early
        await asyncio.sleep(0)  # the index handlers (a dict update each)
        await indexed.drop_toggle(toggle)
        await indexed.wait_for(True)
        released += 1
        early += not listing_over

    started = time.perf_counter()
    tasks = []
    for i in range(n):
        kind = KINDS[i * len(KINDS) // n]
        tasks.append(asyncio.create_task(worker(await indexed.make_toggle(name=f"{kind}/{i}"))))
        await asyncio.sleep(0)  # kopf's watcher awaits the worker's queue and its spawn per object
    listing_over = True
    for toggle in kinds.values():
        await indexed.drop_toggle(toggle)
    await indexed.drop_toggle(blocker)
    await asyncio.gather(*tasks)
    assert released == n
    return time.perf_counter() - started, early


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[500, 1000, 2000, 4000], help="watched objects")
    args = parser.parse_args()
    print(f"{'objects':>8}  {'kopf ToggleSet':>15}  {'kopfext':>12}  {'ratio':>7}")
    for n in args.n:
        times = {}
        for cls in (toggles.KopfToggleSet, toggles.ToggleSet):
            gc.collect()
            seconds, early = asyncio.run(prepopulate(cls, n))
            assert early == 0, f"{cls.__module__}: {early} workers released before the listing ended"
            times[cls] = seconds
        kopf_s, ours_s = times[toggles.KopfToggleSet], times[toggles.ToggleSet]
        print(f"{n:>8}  {kopf_s:>13.3f} s  {ours_s:>10.3f} s  {kopf_s / ours_s:>6.0f}x", flush=True)


if __name__ == "__main__":
    main()

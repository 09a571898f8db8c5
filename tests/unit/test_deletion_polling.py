"""A server deleted while its resync timer still runs: how long until kopf looks at it again.

The operator's finalizer stays until every timer and daemon of the server has stopped. A timer whose sync
reconcile is running (or waiting for one of kopf's threads) cannot stop at once, and kopf then looks again only
after `settings.background.cancellation_polling`: 60 s by default. A loaded run's `kubectl delete --wait
--timeout=60s` timed out on exactly that (e2e/test_adopt.py). kopf's own stop_daemons() is run here on the
operator's real timer handler, with the settings Operator.configure() gives kopf; only the reconcile still
running is stood in for (a task that has not ended).
"""

from __future__ import annotations

import asyncio
import logging

import kopf
from kopf._core.engines import daemons
from kopf._core.intents import handlers as kopf_handlers
from kopf._core.intents import stoppers

from e2e.testbed.memory_world import MemoryKube
from vllm_operator import api
from vllm_operator.controller.reconcile import Reconciler
from vllm_operator.operator_main import DELETE_POLL_SECONDS, Operator, register_handlers


def _timer_of_a_registered_operator() -> tuple[Operator, kopf_handlers.TimerHandler]:
    op = Operator(reconciler=Reconciler(MemoryKube()))  # type: ignore[arg-type] - nothing is reconciled here
    registry = kopf.OperatorRegistry()
    register_handlers(registry, op, resync_seconds=60)
    resource = kopf.Resource(api.GROUP, api.VERSION, api.PLURAL)
    [timer] = [h for h in registry._spawning.get_all_handlers() if isinstance(h, kopf_handlers.TimerHandler)
               and h.selector is not None and h.selector.check(resource)]
    return op, timer


def _next_look(settings: kopf.OperatorSettings, timer: kopf_handlers.TimerHandler) -> list[float]:
    async def run() -> list[float]:
        still_running = asyncio.Event()
        task = asyncio.create_task(still_running.wait())  # the tick's reconcile, not ended yet
        try:
            daemon = daemons.Daemon(task=task, logger=logging.getLogger(__name__),
                                    handler=timer, stopper=stoppers.DaemonStopper())
            return list(await daemons.stop_daemons(settings=settings, daemons={timer.id: daemon}))
        finally:
            task.cancel()
    return asyncio.run(run())


def test_a_deleted_server_whose_timer_still_runs_is_looked_at_again_in_seconds_not_a_minute():
    op, timer = _timer_of_a_registered_operator()
    baseline = kopf.OperatorSettings()
    assert _next_look(baseline, timer) == [60.0]  # kopf's default: what the loaded run waited for
    settings = kopf.OperatorSettings()
    op.configure(settings)
    assert _next_look(settings, timer) == [DELETE_POLL_SECONDS]
    assert DELETE_POLL_SECONDS <= 5

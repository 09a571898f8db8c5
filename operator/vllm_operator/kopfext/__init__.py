"""Every adaptation of kopf in one place, each behind a self-test that falls back to kopf's own behaviour.

kopf is pinned to 1.45.x (`kopf~=1.45.2` in pyproject.toml): the toggles adaptation uses
private parts of kopf, which a minor release may change. `install(settings, ...)` runs
before `kopf.run`: each adaptation's self-test runs (a few milliseconds in all), a passing
one is applied, a failing one leaves kopf's own behaviour with a warning in the log and
`vllm_operator_kopf_adaptation{adaptation="..."} 0` on /metrics (1 when applied).

| adaptation | what it changes | kopf | upstream | self-test | fallback |
|---|---|---|---|---|---|
| `toggles` (toggles.py) | kopf's start-up wait for its indices: linear instead of quadratic (a restart with 1,000 servers: 20 s instead of 91 s); only the set kopf's orchestrator builds (`orchestration.aiotoggles`), not every ToggleSet | 1.45.2, private (`aiotoggles.ToggleSet`, `orchestration`) | the wait: nolar/kopf#661, #1243; its cost: none reported | one waiter scenario on kopf's class and ours, same trace; the orchestrator still builds through that name | kopf's ToggleSet (a quadratic wait) |
| `progress` (persistence.py) | kopf's progress annotations without the lone `kopf-managed` marker after a successful handling (one patch per server fewer) | 1.45.2, public storage (`settings.persistence.progress_storage`), private marker name | the marker: nolar/kopf#539 (zalando-incubator/kopf#372) | kopf's storage still ends a success with the lone marker, ours with nothing, both write a retry alike | kopf's `AnnotationsProgressStorage` |
| `diffbase` (persistence.py) | kopf's diff base in memory, not an annotation (no patch per server); the essence built without deep-copying the status and managedFields first (kopf builds it on every event) | 1.45.2, public storage (`settings.persistence.diffbase_storage`) | own storages: nolar/kopf#702 | kopf's annotation is read back as the essence; new, remembered and restarted objects read as kopf needs; the essence equals kopf's build | kopf's `AnnotationsDiffBaseStorage` |
| `session` (session.py) | kopf's HTTP connections in a bounded pool (login handler) | 1.45.2, public (`kopf.on.login`, `AiohttpSession`) | nolar/kopf#1230 (#909, #1011) | the public names exist | kopf's own login (unbounded pool) |

HA's peering objects and each replica's priority, made through kopf's public arguments, adapt nothing: they
are ../peering.py. kopf's public settings (watch timeouts,
workers, event level, the finalizer's name) stay in operator_main.py's startup handler.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import kopf

from .. import telemetry
from . import persistence, session, toggles

log = logging.getLogger("vllm_operator.kopfext")

ADAPTATIONS = ("toggles", "progress", "diffbase", "session")


def _outcome(name: str, failed: Optional[str], fallback: str) -> bool:
    telemetry.record_kopf_adaptation(name, failed is None)
    if failed is not None:
        log.warning("kopf adaptation %r not applied: %s; %s (kopf %s)", name, failed, fallback, kopf.__version__)
    return failed is None


def install(settings: kopf.OperatorSettings, *, finalizer: str, prefix: str, connections: int,
            registry: Optional[Any] = None) -> dict[str, bool]:
    """Apply every adaptation whose self-test passes to `settings` (the object given to kopf.run) and kopf's
    registry; returns {adaptation: applied}."""
    applied = {
        "toggles": _outcome("toggles", toggles.install(),
                            "kopf's own ToggleSet kept: the start-up wait for its indices is quadratic in the "
                            "objects watched (minutes with thousands)"),
    }
    progress = persistence.self_test_progress()
    settings.persistence.progress_storage = (persistence.ProgressAnnotationsStorage if progress is None
                                             else kopf.AnnotationsProgressStorage)(prefix=prefix)
    applied["progress"] = _outcome("progress", progress, "kopf's progress storage used (a patch with its marker "
                                   "after each successful handling)")
    key = "last-handled-configuration"
    diffbase = persistence.self_test_diffbase(finalizer)
    settings.persistence.diffbase_storage = (
        persistence.MemoryDiffBaseStorage(prefix=prefix, key=key, finalizer=finalizer) if diffbase is None
        else kopf.AnnotationsDiffBaseStorage(prefix=prefix, key=key))
    applied["diffbase"] = _outcome("diffbase", diffbase, "kopf's annotation diff base used (a patch per handled "
                                   "change)")
    login = session.self_test()
    if login is None:
        kopf.on.login(registry=registry)(session.make_login(connections))
    applied["session"] = _outcome("session", login, "kopf's own login used (no bound on its connections)")
    log.info("kopf %s adaptations: %s", kopf.__version__,
             ", ".join(f"{name} {'applied' if ok else 'NOT applied'}" for name, ok in applied.items()))
    return applied

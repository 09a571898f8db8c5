"""kopfext.install(): every adaptation of kopf whose self-test passes is applied, the others fall back to kopf's
own behaviour with a warning and a 0 on /metrics."""

from __future__ import annotations

import logging

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._core.intents.causes import Activity
from kopf._core.reactor import orchestration

from vllm_operator import kopfext, telemetry
from vllm_operator.kopfext import persistence, session, toggles

PREFIX = "vllm-operator.io"
FINALIZER = f"{PREFIX}/finalizer"


@pytest.fixture
def kopf_as_shipped(monkeypatch):
    monkeypatch.setattr(orchestration, "aiotoggles", aiotoggles)
    monkeypatch.delenv(toggles.BASELINE_ENV, raising=False)
    yield


def metric(name: str) -> float | None:
    return telemetry.REGISTRY.get_sample_value("vllm_operator_kopf_adaptation", {"adaptation": name})


def logins(registry: kopf.OperatorRegistry) -> list:
    return list(registry._activities.get_handlers(activity=Activity.AUTHENTICATION))


def install(**overrides):
    settings, registry = kopf.OperatorSettings(), kopf.OperatorRegistry()
    applied = kopfext.install(settings, finalizer=FINALIZER, prefix=PREFIX, connections=40, registry=registry,
                              **overrides)
    return applied, settings, registry


def test_on_the_installed_kopf_every_adaptation_is_applied(kopf_as_shipped, caplog):
    with caplog.at_level(logging.INFO, logger="vllm_operator.kopfext"):
        applied, settings, registry = install()
    assert applied == {name: True for name in kopfext.ADAPTATIONS}
    assert toggles.installed()
    assert type(settings.persistence.progress_storage) is persistence.ProgressAnnotationsStorage
    assert settings.persistence.progress_storage.prefix == PREFIX
    diffbase = settings.persistence.diffbase_storage
    assert type(diffbase) is persistence.MemoryDiffBaseStorage and diffbase.finalizer == FINALIZER
    assert len(logins(registry)) == 1
    assert all(metric(name) == 1 for name in kopfext.ADAPTATIONS)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "kopf %s adaptations" % kopf.__version__ in caplog.text


def test_failed_self_tests_fall_back_to_kopfs_own_behaviour_with_a_warning(kopf_as_shipped, monkeypatch, caplog):
    monkeypatch.setattr(toggles, "self_test", lambda: "the waiter scenario went otherwise")
    monkeypatch.setattr(persistence, "self_test_progress", lambda: "no lone marker")
    monkeypatch.setattr(persistence, "self_test_diffbase", lambda finalizer: "not read back")
    monkeypatch.setattr(session, "self_test", lambda: "kopf has no AiohttpSession")
    with caplog.at_level(logging.WARNING, logger="vllm_operator.kopfext"):
        applied, settings, registry = install()
    assert applied == {name: False for name in kopfext.ADAPTATIONS}
    assert orchestration.aiotoggles is aiotoggles  # kopf's own ToggleSet
    assert type(settings.persistence.progress_storage) is kopf.AnnotationsProgressStorage
    assert settings.persistence.progress_storage.prefix == PREFIX
    assert type(settings.persistence.diffbase_storage) is kopf.AnnotationsDiffBaseStorage
    assert settings.persistence.diffbase_storage.prefix == PREFIX
    assert logins(registry) == []  # kopf logs in its own way
    assert all(metric(name) == 0 for name in kopfext.ADAPTATIONS)
    warned = {r.getMessage().split("'")[1] for r in caplog.records if r.levelno == logging.WARNING}
    assert warned == set(kopfext.ADAPTATIONS)
    assert "the waiter scenario went otherwise" in caplog.text


def test_a_reshaped_kopf_class_is_found_by_the_real_self_test(kopf_as_shipped, monkeypatch):
    """Not the stubbed self-test: kopf's progress storage that stopped writing the lone marker."""
    purge = kopf.AnnotationsProgressStorage.purge

    def purge_all(self, *, key, body, patch):
        purge(self, key=key, body=body, patch=patch)
        patch.pop("metadata", None)

    monkeypatch.setattr(kopf.AnnotationsProgressStorage, "purge", purge_all)
    applied, settings, _ = install()
    assert applied["progress"] is False and applied["diffbase"] is True
    assert type(settings.persistence.progress_storage) is kopf.AnnotationsProgressStorage


def test_the_session_self_test_passes_on_the_installed_kopf_and_fails_without_custom_sessions(monkeypatch):
    assert session.self_test() is None
    monkeypatch.delattr(kopf, "AiohttpSession")
    assert "AiohttpSession" in session.self_test()

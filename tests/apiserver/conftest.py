"""The apiserver tier (e2e/testbed/pytest_tiers.py): every test here is marked `apiserver`, and one that asks for or starts
what a heavier tier needs fails."""

import pytest

from e2e.testbed import pytest_tiers

TIER = "apiserver"


def pytest_collection_modifyitems(items):
    pytest_tiers.claim(items, __file__, TIER)


def pytest_runtest_setup(item):
    pytest_tiers.check(item, TIER)


@pytest.fixture(autouse=True)
def _stays_in_its_tier(monkeypatch):
    pytest_tiers.refuse_processes(monkeypatch, TIER)

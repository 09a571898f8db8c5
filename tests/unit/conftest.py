"""The unit tier (e2e/testbed/pytest_tiers.py): every test here is marked `unit`, and one that asks for or starts
what a heavier tier needs fails."""

from e2e.testbed import pytest_tiers

pytest_collection_modifyitems, pytest_runtest_setup, _stays_in_its_tier = pytest_tiers.hooks("unit", __file__)

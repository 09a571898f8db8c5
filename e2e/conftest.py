"""The e2e tier (e2e/testbed/pytest_tiers.py): every test here is marked `e2e` (those that run real vLLM also carry
`vllm`); the test bed they run on is e2e/testbed/."""

from e2e.testbed import pytest_tiers


def pytest_collection_modifyitems(items):
    pytest_tiers.claim(items, __file__, "e2e")

import os

import pytest

# No test looks a model up on the public Hub: the CLI and the operator processes the tests start read
# HF_HUB_OFFLINE as huggingface_hub does (hub.endpoint_setting). A test that wants the Hub names its stand-in
# (e2e/testbed/hub_http.py) with --hf-endpoint, which wins.
os.environ["HF_HUB_OFFLINE"] = "1"

pytest_plugins = ["e2e.testbed.pytest_fixtures", "e2e.testbed.pytest_stress"]


# A module marked `story` is one scenario told in steps (each test continues the previous
# one's state): once a step fails, the later ones are skipped with the failed step's name,
# so the report shows the first failure and not the cascade it would cause.
def pytest_runtest_makereport(item, call):
    if call.excinfo is not None and item.get_closest_marker("story") is not None \
            and not call.excinfo.errisinstance(pytest.skip.Exception):
        item.module._story_failed = item.name


def pytest_runtest_setup(item):
    if item.get_closest_marker("story") is not None:
        failed = getattr(item.module, "_story_failed", None)
        if failed is not None:
            pytest.skip(f"an earlier step of this story failed: {failed}")

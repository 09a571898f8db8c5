"""pytest plugin for the stress tests (crash, fuzz, HA): the --long switch and a figures report.

* ``--long`` (or ``VLLM_OPERATOR_LONG=1``): more iterations than the CI-sized default.
* ``long_mode`` fixture: whether --long is on.
* ``stress_report`` fixture: ``stress_report("crash", "kills survived", 8)`` records a figure;
  every figure is printed in pytest's terminal summary, so a plain run shows what ran.
"""

from __future__ import annotations

import os

import pytest

_FIGURES: list[tuple[str, str, object]] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="stress tests (crash, fuzz, HA) run more iterations; also VLLM_OPERATOR_LONG=1")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--long", default=False):
        os.environ["VLLM_OPERATOR_LONG"] = "1"  # test modules size themselves at import (hypothesis settings)


def is_long(config: pytest.Config) -> bool:
    return bool(config.getoption("--long")) or os.environ.get("VLLM_OPERATOR_LONG", "") not in ("", "0")


@pytest.fixture(scope="session")
def long_mode(request: pytest.FixtureRequest) -> bool:
    return is_long(request.config)


@pytest.fixture(scope="session")
def stress_report():
    def record(test: str, what: str, value: object) -> None:
        _FIGURES.append((test, what, value))

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("stress figures" + (" (--long)" if is_long(config) else ""))
    for test, what, value in _FIGURES:
        terminalreporter.write_line(f"{test}: {what}: {value}")

"""Repository-wide pytest policy: a missing component fails the run, it never skips quietly.

Every suite here (unit, property, contract against the pinned vLLM, e2e on the
real local control plane and real Prometheus) has its components installed by
`make test`. A test that skips therefore means an install step is missing, so
the session fails and names the skipped tests and their reasons.
"""

from __future__ import annotations

import pytest

_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _skipped:
        terminalreporter.section("skipped tests fail this run (a component is missing)", red=True)
        for line in _skipped:
            terminalreporter.write_line(line)

"""The layering rules in ``.importlinter`` hold, and would catch a tuner module doing I/O.

``lint-imports`` runs against the real package; then the same contracts run
against a throw-away copy of the layout (``probe``) with one offending module,
to show the contract is not vacuous.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".importlinter"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

MUST_BE_FORBIDDEN = {
    "os", "time", "datetime", "pathlib", "subprocess", "urllib", "http", "socket",
    "kopf", "kubernetes", "prometheus_client", "prometheus_api_client", "requests", "httpx",
}  # fmt: skip


def _lint(config: Path, cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: install the dev extra (make install)")
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_contracts_forbid_io_in_the_tuner() -> None:
    parser = configparser.ConfigParser()
    parser.read(CONFIG)
    contract = parser["importlinter:contract:tuner-is-pure"]
    assert contract["source_modules"].split() == ["kvpilot.tuner"]
    assert set(contract["forbidden_modules"].split()) >= MUST_BE_FORBIDDEN
    layers = parser["importlinter:contract:layers"]["layers"].split()
    assert layers == ["kvpilot.cli", "kvpilot.operator", "kvpilot.tuner"]


def test_the_package_keeps_its_contracts() -> None:
    result = _lint(CONFIG, ROOT, ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def _probe(tmp_path: Path, *, offending: str | None) -> subprocess.CompletedProcess[str]:
    package = tmp_path / "probe"
    for sub in ("tuner", "operator"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "tuner" / "core.py").write_text("import math\n")
    (package / "operator" / "edge.py").write_text("import os\n\nfrom probe.tuner import core\n")
    (package / "cli.py").write_text("import pathlib\n\nfrom probe.operator import edge\n")
    if offending:
        (package / "tuner" / "leak.py").write_text(offending)
    config = tmp_path / ".importlinter"
    config.write_text(CONFIG.read_text().replace("kvpilot", "probe"))
    return _lint(config, tmp_path, tmp_path)


def test_a_clean_probe_passes(tmp_path: Path) -> None:
    result = _probe(tmp_path, offending=None)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os\n", "probe.tuner.leak -> os"),
        ("from datetime import datetime\n", "probe.tuner.leak -> datetime"),
        ("from probe.operator import edge\n", "probe.tuner.leak -> probe.operator"),
    ],
)
def test_the_contract_catches_a_tuner_module_doing_io(tmp_path: Path, source: str, expected: str) -> None:
    result = _probe(tmp_path, offending=source)
    assert result.returncode != 0
    assert expected in result.stdout

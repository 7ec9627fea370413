"""The locks under requirements/ (``make lock``): pinned and hashed, in step with pyproject.toml, and what
this environment runs.

``make install`` installs requirements/pip.txt, then requirements/dev.txt (``--require-hashes``), then kvpilot
with ``--no-deps``; the Dockerfile installs requirements/operator.txt. So a dependency added to
pyproject.toml without ``make lock``, an operator pin that differs from the tested one, or a venv that is not
the locked set fails here.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
REQS = ROOT / "requirements"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@dataclass(frozen=True)
class Pin:
    version: str
    hashes: frozenset[str]


def read_lock(path: Path) -> dict[str, Pin]:
    """name -> pin; fails on a line that is not `name==version` followed by its `--hash` options."""
    text = re.sub(r"\\\n", " ", path.read_text())
    pins: dict[str, Pin] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *options = line.split(" --hash=")
        req = Requirement(spec.strip())
        (specifier,) = req.specifier
        assert specifier.operator == "==" and not req.marker and not req.extras, f"{path.name}: {line[:80]}"
        name = canonicalize_name(req.name)
        assert name not in pins, f"{path.name}: {name} twice"
        assert options and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h.strip()) for h in options), name
        pins[name] = Pin(specifier.version, frozenset(h.strip() for h in options))
    return pins


DEV = read_lock(REQS / "dev.txt")
OPERATOR = read_lock(REQS / "operator.txt")
PIP = read_lock(REQS / "pip.txt")


def requirements(*extras: str) -> list[Requirement]:
    specs = PROJECT["dependencies"] + [r for e in extras for r in PROJECT["optional-dependencies"][e]]
    return [Requirement(s) for s in specs]


@pytest.mark.parametrize(
    ("lock", "extras"), [(DEV, ("dev", "vllm")), (OPERATOR, ())], ids=["dev+vllm", "operator"]
)
def test_the_lock_satisfies_pyproject(lock: dict[str, Pin], extras: tuple[str, ...]) -> None:
    for req in requirements(*extras):
        name = canonicalize_name(req.name)
        assert name in lock, f"{req} is not locked: run `make lock`"
        assert req.specifier.contains(lock[name].version, prereleases=True), f"{req} vs {lock[name].version}"


def test_the_operator_lock_is_the_tested_subset_and_has_no_vllm() -> None:
    for name, pin in OPERATOR.items():
        assert DEV.get(name) == pin, f"{name}: operator {pin.version}, dev {DEV.get(name)}"
    dev_only = {canonicalize_name(r.name) for r in requirements("dev", "vllm")} - {
        canonicalize_name(r.name) for r in requirements()
    }
    assert not dev_only & set(OPERATOR)
    assert not {"vllm", "torch", "pip", "setuptools", "wheel"} & set(OPERATOR)


def test_the_pip_lock_pins_what_pip_in_asks() -> None:
    lines = [ln for ln in (REQS / "pip.in").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    (wanted,) = [Requirement(ln) for ln in lines]
    assert set(PIP) == {"pip"} and wanted.specifier.contains(PIP["pip"].version)


def test_this_environment_is_the_locked_set() -> None:
    """The tests run on what the lock installs (the Makefile reinstalls when the lock changes)."""

    def installed(name: str) -> str | None:  # the first on sys.path, as import finds it (setuptools puts
        # its vendored packaging etc. later on sys.path)
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    locked = {**DEV, **PIP}
    wrong = {n: (p.version, installed(n)) for n, p in locked.items() if installed(n) != p.version}
    assert not wrong, f"locked vs installed (reinstall: rm -rf .venv && make install): {wrong}"


def test_the_dev_lock_holds_the_build_backend() -> None:
    """``make install`` builds the editable kvpilot with ``--no-build-isolation``: from the locked backend."""
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for req in map(Requirement, build):
        name = canonicalize_name(req.name)
        assert name in DEV, f"{req} is not in requirements/dev.txt"
        assert req.specifier.contains(DEV[name].version), f"{req} vs {DEV[name].version}"

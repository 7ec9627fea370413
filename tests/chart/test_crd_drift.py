"""crds/ is the single source of the InferenceService and TuningProfile CRDs; the chart carries copies. Keep
them identical.

Refresh the copies with `make chart-crds`
(cp crds/inferenceservices.kvpilot.io.yaml crds/tuningprofiles.kvpilot.io.yaml charts/kvpilot/files/crds/).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml
from helmchart import CHART, ROOT, by_kind

Render = Callable[..., list[dict[str, Any]]]


CRDS = ["inferenceservices.kvpilot.io", "tuningprofiles.kvpilot.io"]


@pytest.mark.parametrize("crd", CRDS)
def test_chart_copy_is_byte_identical_to_the_source(crd: str) -> None:
    source, copy = ROOT / "crds" / f"{crd}.yaml", CHART / "files" / "crds" / f"{crd}.yaml"
    assert copy.read_bytes() == source.read_bytes(), (
        "charts/kvpilot/files/crds/ drifted from crds/: run `make chart-crds`"
        " (cp crds/*.kvpilot.io.yaml charts/kvpilot/files/crds/)"
    )


@pytest.mark.parametrize("name", CRDS)
def test_rendered_crd_spec_equals_the_source(rendered: Render, name: str) -> None:
    source = yaml.safe_load((ROOT / "crds" / f"{name}.yaml").read_text())
    (crd,) = [o for o in by_kind(rendered(), "CustomResourceDefinition") if o["metadata"]["name"] == name]
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["name"] == source["metadata"]["name"]
    assert source["metadata"].get("labels", {}).items() <= crd["metadata"]["labels"].items()
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_crds_enabled_and_keep_toggles(rendered: Render) -> None:
    def names(objs: list[dict[str, Any]]) -> set[str]:
        return {o["metadata"]["name"] for o in by_kind(objs, "CustomResourceDefinition")}

    assert not set(CRDS) & names(rendered(sets=["crds.enabled=false"]))
    objs = rendered(sets=["crds.keep=false"])
    for name in CRDS:
        (crd,) = [o for o in objs if o["metadata"]["name"] == name]
        assert "annotations" not in crd["metadata"]


def test_kopf_peering_crds_are_in_crds_folder_only() -> None:
    """Shared by every kopf operator: Helm installs them when absent and never upgrades or deletes them."""
    docs = list(yaml.safe_load_all((CHART / "crds" / "kopf-peering.yaml").read_text()))
    assert {d["metadata"]["name"] for d in docs} == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert [p.name for p in (CHART / "crds").iterdir()] == ["kopf-peering.yaml"]

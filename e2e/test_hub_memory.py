"""The operator's peak memory under 200 hostile Hub configs stays under the chart's limit (issue 31).

The attack: InferenceServices naming public Hub repositories whose config.json is 1 MiB of ``[{},{},...]``
(about 26 MB of Python objects each when parsed). 15 of them OOM-killed the operator at the chart's 512Mi.
Here a stand-in Hub (``huggingface_hub``'s own protocol: a HEAD with the commit and ETag, then the file)
serves 200 such configs, the operator runs on the host against it (``HF_ENDPOINT``), and 200
InferenceServices name them. Each must end ConfigResolved=False (the config refused before it is parsed,
:data:`kvpilot.tuner.model.MAX_JSON_VALUES`), and the operator process's peak RSS (``VmHWM``) must stay
under the chart's memory limit, read from ``charts/kvpilot/values.yaml``. The in-process measurement of the
same path is ``tests/operator/test_operator_memory.py``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.cluster import LocalCluster
from e2e.fleet.kopf_process import OperatorProcess
from e2e.fleet.stack import ISVC, install_crd
from e2e.hub_standin import StandInHub
from e2e.waits import wait_for

REPO = Path(__file__).resolve().parents[1]
HOSTILE = ("[" + ",".join(["{}"] * 349_000) + "]").encode()
"""1,047,001 bytes (just under 1 MiB) of empty objects: 349,000 JSON values, 26 MB or so of objects parsed."""
SERVICES = 200


def _hostile(repo: str, name: str) -> bytes | None:
    """:data:`HOSTILE` as the config.json of every ``evil/*`` repository."""
    return HOSTILE if repo.startswith("evil/") and name == "config.json" else None


@pytest.fixture
def hub() -> Iterator[StandInHub]:
    with StandInHub(_hostile) as server:
        yield server


def _chart_memory_limit() -> int:
    limit = str(
        yaml.safe_load((REPO / "charts/kvpilot/values.yaml").read_text())["resources"]["limits"]["memory"]
    )
    assert limit.endswith("Mi"), limit
    return int(limit[:-2]) << 20


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise AssertionError(f"no VmHWM for pid {pid}")


def _refusals(cluster: LocalCluster, ns: str) -> list[str]:
    """The messages of the InferenceServices whose ConfigResolved is False."""
    items = json.loads(cluster.kubectl("get", ISVC, "-n", ns, "-o", "json").stdout)["items"]
    return [
        str(c.get("message"))
        for o in items
        for c in (o.get("status") or {}).get("conditions") or ()
        if c["type"] == "ConfigResolved" and c["status"] == "False"
    ]


def test_200_hostile_hub_configs_leave_the_operator_under_the_charts_limit(
    cluster: LocalCluster, hub: StandInHub, tmp_path: Path
) -> None:
    install_crd(cluster.kubectl)
    ns = f"e2e-hubmem-{uuid.uuid4().hex[:6]}"
    env = {
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
        "HF_HUB_OFFLINE": "0",  # tests/contract sets it for the whole session, and the operator inherits it
        "KVPILOT_CLOSED_LOOP_INTERVAL": "30",
    }
    with (
        cluster.temporary_namespace(ns),
        OperatorProcess(cluster.kubeconfig, tmp_path, env=env, namespaces=[ns]) as op,
    ):
        assert op.pid is not None
        before = _peak_rss(op.pid)
        objs = [
            {
                "apiVersion": "kvpilot.io/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": f"m{i:03d}", "namespace": ns},
                "spec": {
                    "model": {"id": f"evil/m{i:03d}", "source": "Hub"},
                    "gpu": {"count": 1, "product": "L4"},
                },
            }
            for i in range(SERVICES)
        ]
        for i in range(0, SERVICES, 50):
            cluster.apply(objs[i : i + 50])
        refused = lambda: [m for m in _refusals(cluster, ns) if "JSON values" in m]  # noqa: E731
        wait_for(lambda: len(refused()) == SERVICES, 300, f"all {SERVICES} configs refused by their size")
        peak, limit = _peak_rss(op.pid), _chart_memory_limit()
        print(
            f"\n{SERVICES} hostile Hub configs of {len(HOSTILE)} B ({hub.requests} Hub requests): operator "
            f"peak RSS {peak / 2**20:.0f} MiB (before {before / 2**20:.0f} MiB), "
            f"chart limit {limit / 2**20:.0f} MiB"
        )
        assert hub.requests >= SERVICES  # each config did come from the stand-in Hub
        assert peak < limit
        assert all("JSON values" in m for m in _refusals(cluster, ns)), _refusals(cluster, ns)[:3]

"""The disruption budget of a LeaderWorkerSet's groups
(:func:`kvpilot.operator.pods.leader_worker_set.build_budget_spec`), checked against the eviction API's rule
over every order of evictions.

The model of the API (``pkg/registry/core/pod/storage/eviction.go`` and the disruption controller): an
eviction of a Ready pod is allowed while ``disruptionsAllowed`` = Ready pods - desired healthy > 0 (desired
healthy: ``expected - maxUnavailable``, or ``minAvailable``) and takes one of it at once; a pod that is not
Ready may be evicted regardless only under ``unhealthyPodEvictionPolicy: AlwaysAllow``. LWS's
``RecreateGroupOnPodRestart`` then restarts the evicted pod's group: all of its pods not Ready until it is
back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kvpilot.operator import api
from kvpilot.operator.inferenceservice import desired
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods import workloads

Groups = tuple[int, ...]
"""Pods not Ready per group (0: the group serves)."""


def _desired_healthy(budget: Mapping[str, Any], replicas: int, size: int) -> int:
    if "minAvailable" in budget:
        return int(budget["minAvailable"])
    return replicas * size - int(budget["maxUnavailable"])


def _moves(groups: Groups, budget: Mapping[str, Any], size: int) -> list[Groups]:
    """Every next state: a pod evicted where the API allows it, a group restarted or back."""
    out = []
    allowed = sum(size - down for down in groups) - _desired_healthy(budget, len(groups), size)
    for g, down in enumerate(groups):
        if down < size and allowed > 0:  # evict one of its Ready pods
            out.append((*groups[:g], down + 1, *groups[g + 1 :]))
        if down > 0:  # LWS restarts the group (all its pods), or the group is back
            out += [(*groups[:g], size, *groups[g + 1 :]), (*groups[:g], 0, *groups[g + 1 :])]
    return out


def _most_groups_down(budget: Mapping[str, Any], replicas: int, size: int) -> int:
    """The most groups down at once, over every order of evictions, restarts and recoveries."""
    seen: set[Groups] = set()
    todo = [(0,) * replicas]
    while todo:
        state = todo.pop()
        if state not in seen:
            seen.add(state)
            todo += _moves(state, budget, size)
    return max(sum(1 for down in s if down) for s in seen)


def _wedged(budget: Mapping[str, Any], replicas: int, size: int) -> bool:
    """Whether a group stuck not Ready (e.g. Pending for a GPU), with the budget spent, keeps its own pods
    from being evicted: a drain of its nodes never finishes."""
    groups = (size, *(0,) * (replicas - 1))
    spent = sum(size - d for d in groups) - _desired_healthy(budget, replicas, size) <= 0
    return spent and budget.get("unhealthyPodEvictionPolicy") != "AlwaysAllow"


def _spec(replicas: int, nodes: int, max_unavailable: int) -> api.InferenceServiceSpec:
    return api.InferenceServiceSpec.model_validate(
        {
            "model": {"id": "deepseek-ai/DeepSeek-V3"},
            "replicas": replicas,
            "serving": {"maxContextLength": 32768},
            "gpu": {"count": 8, "product": "H100-SXM", "nodesPerReplica": nodes},
            "rollout": {"maxUnavailable": max_unavailable},
        }
    )


@pytest.mark.parametrize(
    ("replicas", "nodes", "max_unavailable"), [(3, 2, 1), (4, 2, 2), (4, 3, 2), (3, 4, 2)]
)
def test_evictions_never_take_more_groups_than_the_budget(
    replicas: int, nodes: int, max_unavailable: int
) -> None:
    spec = _spec(replicas, nodes, max_unavailable)
    (pdb,) = workloads.build_pod_disruption_budget({"name": "ds", "namespace": "ml"}, spec)
    budget = pdb["spec"]
    assert _most_groups_down(budget, replicas, nodes) == min(max_unavailable, replicas)
    assert not _wedged(budget, replicas, nodes)
    # what a budget of whole groups in minAvailable would allow: more groups down than the spec says
    whole_groups = {"minAvailable": (replicas - max_unavailable) * nodes}
    assert _most_groups_down(whole_groups, replicas, nodes) > max_unavailable
    assert _wedged({"maxUnavailable": max_unavailable}, replicas, nodes)  # without AlwaysAllow


def test_the_budget_selects_every_pod_of_every_group() -> None:
    spec = _spec(3, 2, 1)
    inputs = resolve.Inputs(resolve.read_model(spec.model, "ml", None), resolve.read_gpu(spec, None))
    manifests = desired.build_desired({"name": "ds", "namespace": "ml"}, spec, inputs).manifests
    (group,) = [m for m in manifests if m["kind"] == "LeaderWorkerSet"]
    (pdb,) = [m for m in manifests if m["kind"] == "PodDisruptionBudget"]
    selector = pdb["spec"]["selector"]["matchLabels"]
    for role in ("leaderTemplate", "workerTemplate"):
        labels = group["spec"]["leaderWorkerTemplate"][role]["metadata"]["labels"]
        assert selector.items() <= labels.items(), role
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_a_single_node_service_keeps_the_default_eviction_policy() -> None:
    (pdb,) = workloads.build_pod_disruption_budget({"name": "ds"}, _spec(3, 1, 1))
    assert "unhealthyPodEvictionPolicy" not in pdb["spec"]

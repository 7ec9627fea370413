"""One write per closed-loop change, and an operator killed at any point of it.

A change (a retune after a CUDA OOM) is recorded in one conditional status PATCH (the decision's settings,
the rollout, the ``Retuned`` history entry and the conditions together) and then applied to the Deployment.
The operator is stopped before the write, between the write and the apply, and after both; a new operator
(fresh dependencies, its resume handler, then its timer) must end with exactly one ``Retuned`` entry and the
Deployment running the retuned settings: no decision lost, none made twice.
"""

from __future__ import annotations

import copy

import kopf
import pytest
from closed_loop_fakes import LoopHarness, window
from operator_fakes import Harness, condition, isvc

from kvpilot.operator.inferenceservice import handlers
from kvpilot.operator.status import status_patch
from kvpilot.tuner.loop.policy import Action

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB."
KEY = ("ns1", "llm")


class Killed(BaseException):
    """The process dies here (SIGKILL): nothing after this point runs; not an error the loop could catch."""


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


async def _oom_after_plan(harness: Harness, loop: LoopHarness) -> dict:
    body = isvc(gpu={"count": 1, "product": "H100-SXM"})
    await harness.run(body)
    body["metadata"]["resourceVersion"] = harness.kube.versions[KEY] = "1"
    loop.healthy_pods(restarts=1, message=OOM, finished=loop.now + 10, ready=False, crash_loop=True)
    return body


@pytest.fixture
def loop(harness: Harness) -> LoopHarness:
    return LoopHarness(harness)


def _history(body: dict) -> list[str]:
    return [h["action"] for h in body["status"].get("history") or ()]


async def _new_operator(harness: Harness, loop: LoopHarness, body: dict) -> None:
    """What the next leader does: a fresh process (no memory of the old one), kopf's resume handler for the
    object, then its timer."""
    loop.deps = loop.new_deps()
    await harness.run(body, trigger=handlers.RESUMED)
    body["metadata"]["resourceVersion"] = harness.kube.versions[KEY]
    await loop.tick(body)


async def test_a_change_is_one_patch_with_the_decision_the_settings_and_the_history(
    harness: Harness, loop: LoopHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = await _oom_after_plan(harness, loop)
    sent: list[dict] = []
    real = harness.kube.patch_inference_service_status

    def spy(namespace: str, name: str, patch: dict) -> dict | None:
        sent.append(copy.deepcopy(patch))
        return real(namespace, name, patch)

    monkeypatch.setattr(harness.kube, "patch_inference_service_status", spy)
    d = await loop.tick(body)
    assert d is not None and (d.action, d.trigger) == (Action.RETUNE, "CudaOOM")
    assert len(sent) == 1  # the whole change in one request ...
    one = sent[0]
    assert one["metadata"] == {"resourceVersion": "1"}  # ... conditional on the version the tick read
    assert {"applied", "rollout", "history", "conditions", "lastChangeTime"} <= set(one["status"])
    assert [h["action"] for h in one["status"]["history"]] == ["Planned", "Retuned"]
    assert body["status"]["applied"]["gpuMemoryUtilization"] == 0.93
    assert condition(body, "RolloutInProgress")["reason"] == "Retuned"
    assert flag(loop.deployment_args(), "--gpu-memory-utilization") == "0.93"  # applied after the record


async def test_killed_before_the_write_the_next_leader_decides_once(
    harness: Harness, loop: LoopHarness
) -> None:
    body = await _oom_after_plan(harness, loop)
    old_args = loop.deployment_args()
    harness.kube.fail_status = Killed()
    with pytest.raises(Killed):
        await loop.tick(body)
    assert _history(body) == ["Planned"] and loop.deployment_args() == old_args  # nothing happened
    assert "Retuned" not in harness.emitter.reasons
    harness.kube.fail_status = None
    await _new_operator(harness, loop, body)
    assert _history(body) == ["Planned", "Retuned"]
    assert flag(loop.deployment_args(), "--gpu-memory-utilization") == "0.93"
    assert harness.emitter.reasons.count("Retuned") == 1


async def test_killed_between_the_write_and_the_apply_the_next_leader_applies_the_record(
    harness: Harness, loop: LoopHarness
) -> None:
    body = await _oom_after_plan(harness, loop)
    old_args = loop.deployment_args()
    applies = len(harness.kube.applied)
    harness.kube.fail_apply = Killed()
    with pytest.raises(Killed):
        await loop.tick(body)
    body["status"] = loop.land(body, kopf.Patch())  # the PATCH had landed before the kill
    body["metadata"]["resourceVersion"] = harness.kube.versions[KEY]
    assert _history(body) == ["Planned", "Retuned"]  # the decision is recorded ...
    assert body["status"]["applied"]["gpuMemoryUtilization"] == 0.93
    assert loop.deployment_args() == old_args and len(harness.kube.applied) == applies  # ... not applied
    harness.kube.fail_apply = None
    loop.healthy_pods(ready=False)  # the old pod restarts under its old args; the new one is not there yet
    loop.pods.pods[0]["status"]["containerStatuses"][0]["restartCount"] = 1
    await _new_operator(harness, loop, body)
    # the resume handler re-applied status.applied; the timer continues that rollout, decides nothing new
    assert flag(loop.deployment_args(), "--gpu-memory-utilization") == "0.93"
    assert _history(body) == ["Planned", "Retuned"]
    assert body["status"]["rollout"]["settings"]["gpuMemoryUtilization"] == 0.93
    # the new pod comes up and passes probation: still one record
    loop.healthy_pods()
    loop.window = window(loop.now + 30)
    for _ in range(12):
        body["metadata"]["resourceVersion"] = harness.kube.versions[KEY]
        await loop.tick(body)
    assert "rollout" not in body["status"]
    assert body["status"]["lastGoodSettings"]["gpuMemoryUtilization"] == 0.93
    assert _history(body) == ["Planned", "Retuned"]


async def test_killed_after_the_apply_nothing_is_done_again(harness: Harness, loop: LoopHarness) -> None:
    body = await _oom_after_plan(harness, loop)
    await loop.tick(body)
    body["metadata"]["resourceVersion"] = harness.kube.versions[KEY]
    deployments = [m for m in harness.kube.applied if m["kind"] == "Deployment"]
    loop.healthy_pods(ready=False)  # the retuned pod is starting
    await _new_operator(harness, loop, body)
    assert _history(body) == ["Planned", "Retuned"]
    again = [m for m in harness.kube.applied if m["kind"] == "Deployment"][len(deployments) :]
    assert all(
        flag(m["spec"]["template"]["spec"]["containers"][0]["args"], "--gpu-memory-utilization") == "0.93"
        for m in again
    )
    assert harness.emitter.reasons.count("Retuned") == 1


def test_the_conditional_patch_leaves_out_what_has_its_value() -> None:
    old = {"replicas": 1, "conditions": [], "applied": {"maxNumSeqs": 8}}
    out = status_patch.StatusPatch(status={"replicas": 1, "rollout": None, "readyReplicas": 0})
    assert out.build_conditional(old, "5") == {
        "metadata": {"resourceVersion": "5"},
        "status": {"readyReplicas": 0},
    }
    assert status_patch.StatusPatch(status={"replicas": 1}).build_conditional(old, "5") is None


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "lost"])
async def test_a_write_without_an_answer_is_applied_next_tick_only_if_it_landed(
    harness: Harness, loop: LoopHarness, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    """The PATCH's request times out: the API server may have applied it or not. Nothing is applied in that
    tick; the next one applies the change if ``status.applied`` says it landed, and decides again if not."""
    from kvpilot.operator import errors

    body = await _oom_after_plan(harness, loop)
    old_args = loop.deployment_args()
    real = harness.kube.patch_inference_service_status

    def timeout(namespace: str, name: str, patch: dict) -> dict | None:
        if landed:
            real(namespace, name, patch)
        raise errors.ApplyFailed("patching the status failed: read timed out")

    monkeypatch.setattr(harness.kube, "patch_inference_service_status", timeout)
    await loop.tick(body)
    body["metadata"]["resourceVersion"] = harness.kube.versions[KEY]
    assert loop.deployment_args() == old_args  # not applied without a record known to be there
    assert _history(body) == (["Planned", "Retuned"] if landed else ["Planned"])
    monkeypatch.setattr(harness.kube, "patch_inference_service_status", real)
    await loop.tick(body)
    assert flag(loop.deployment_args(), "--gpu-memory-utilization") == "0.93"
    assert _history(body) == ["Planned", "Retuned"]

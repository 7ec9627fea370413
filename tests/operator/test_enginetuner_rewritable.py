"""Auto never evicts a pod whose replacement the webhook could not rewrite: a target whose container runs its
engine from a shell script that does not pass "$@" (SGLang's and TGI's rewrite refuse it; vLLM's appends
flags to args the script ignores) gets ``Rewritable=False`` naming the container and what to change, one
Warning event, and no eviction, reconcile after reconcile; the same check passes for exec forms and scripts
passing "$@"."""

from __future__ import annotations

from typing import Any

import pytest
from test_enginetuner import KS_ARGS, LLAMA, NS, FakeTargetKube, cond, deployment, pod_of, run, tuner
from test_enginetuner_engines import SGLANG_IMAGE, TGI_IMAGE

from kvpilot.operator.enginetuner import target_webhook
from kvpilot.operator.enginetuner.target_engines import EngineArgs
from kvpilot.operator.pods import pod_reading
from kvpilot.operator.status.events import RecordingEmitter
from kvpilot.tuner.types import EngineSettings

SGLANG_SCRIPT = [
    "sh",
    "-c",
    f"exec python3 -m sglang.launch_server --model-path {LLAMA} --port 30000 --mem-fraction-static 0.9 "
    "--context-length 131072",
]
"""An SGLang server started by a script that does not pass "$@": args would not reach it."""
VLLM_SCRIPT = [
    "bash",
    "-c",
    f"vllm serve {LLAMA} --host 0.0.0.0 --port 8000 --max-model-len 131072 --max-num-seqs 256\n",
    "bash",
]
"""KServe's runtime shape less its "$@": the flags vLLM's rewrite appends to args are never read."""


def kube_with(workload: dict[str, Any], *pods: str) -> FakeTargetKube:
    pod_reading.LOGS.clear()
    k = FakeTargetKube()
    k.workloads[(NS, "Deployment", workload["metadata"]["name"])] = workload
    k.pods = [pod_of(workload, p, node=f"l4-{i % 2}") for i, p in enumerate(pods)]
    return k


async def reconcile_thrice(body: dict[str, Any], kube: FakeTargetKube) -> RecordingEmitter:
    emitter = RecordingEmitter()
    for dt in (0, 60, 120):  # published from the second: the eviction would come then
        await run(body, kube, emitter, now=1.8e9 + dt)
    return emitter


@pytest.mark.parametrize(
    ("workload", "container", "engine"),
    [
        (deployment("sg", SGLANG_SCRIPT, image=SGLANG_IMAGE), "vllm", "SGLang"),
        (
            deployment(
                "tgi", ["sh", "-c", f"text-generation-launcher --model-id {LLAMA} --port 80"], image=TGI_IMAGE
            ),
            "vllm",
            "TGI",
        ),  # fmt: skip
        (deployment("llama", VLLM_SCRIPT, []), "vllm", "vLLM"),
    ],
    ids=["sglang", "tgi", "vllm"],
)
async def test_auto_does_not_evict_pods_a_script_keeps_from_the_recommendation(
    workload: dict[str, Any], container: str, engine: str
) -> None:
    kube = kube_with(
        workload, f"{workload['metadata']['name']}-abc12-x", f"{workload['metadata']['name']}-abc12-y"
    )
    body = tuner("Auto", workload["metadata"]["name"])
    emitter = await reconcile_thrice(body, kube)
    assert kube.evicted == []  # before the fix: one pod evicted per tick, each replaced by the same settings
    refused = cond(body, "Rewritable")
    assert (refused["status"], refused["reason"]) == ("False", "RewriteRefused")
    assert (
        f'container {container} runs {engine} from a shell script that does not pass "$@"'
        in refused["message"]
    )
    assert "exec form" in refused["message"] and 'with "$@"' in refused["message"]
    assert emitter.reasons.count("RewriteRefused") == 1  # said once, not every tick
    assert "not evicting" in cond(body, "Ready")["message"]
    assert "evictions" not in body["status"]


async def test_the_check_passes_for_scripts_passing_their_arguments() -> None:
    ks_script = [
        "bash",
        "-c",
        f"vllm serve {LLAMA} --host 0.0.0.0 --port 8000 $@\n",
        "bash",
    ]
    wl = deployment("isvc-predictor", ks_script, KS_ARGS)
    kube = kube_with(wl, "isvc-predictor-abc12-x")
    body = tuner("Auto", "isvc-predictor", model={"id": LLAMA})
    await reconcile_thrice(body, kube)
    assert kube.evicted[0] == "isvc-predictor-abc12-x"  # the fake keeps the pod: evicted on each tick
    assert all(c["type"] != "Rewritable" for c in body["status"]["conditions"])


def test_refusal_turns_back_to_true_once_the_owner_fixes_the_script() -> None:
    rec = EngineSettings(max_model_len=8192, max_num_seqs=8, gpu_memory_utilization=0.9)
    broken = deployment("llama", VLLM_SCRIPT, [])
    assert target_webhook.compute_refusal(broken, "vllm", rec) is not None
    fixed = deployment("llama", [*VLLM_SCRIPT[:2], VLLM_SCRIPT[2].rstrip() + " $@\n", "bash"], [])
    assert target_webhook.compute_refusal(fixed, "vllm", rec) is None
    exec_form = deployment("llama", ["vllm", "serve", LLAMA, "--max-num-seqs", "256"])
    assert target_webhook.compute_refusal(exec_form, "vllm", rec) is None
    sg = EngineArgs("SGLang", ("--context-length", "8192", "--mem-fraction-static", "0.85"))
    assert target_webhook.compute_refusal(deployment("sg", SGLANG_SCRIPT), "vllm", sg) is not None


async def test_rewritable_goes_back_to_true_when_the_template_is_fixed() -> None:
    wl = deployment("llama", VLLM_SCRIPT, [])
    kube = kube_with(wl, "llama-abc12-x")
    body = tuner("Auto")
    await reconcile_thrice(body, kube)
    assert cond(body, "Rewritable")["status"] == "False"
    fixed = deployment("llama", [*VLLM_SCRIPT[:2], VLLM_SCRIPT[2].rstrip() + ' "$@"\n', "bash"], [])
    kube.workloads[(NS, "Deployment", "llama")] = fixed
    kube.pods = [pod_of(fixed, "llama-abc12-x")]
    await run(body, kube, RecordingEmitter(), now=1.8e9 + 300)
    assert cond(body, "Rewritable")["status"] == "True"
    assert kube.evicted == ["llama-abc12-x"]

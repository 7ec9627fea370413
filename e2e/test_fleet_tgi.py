"""The fleet's TGI pods: TGI 3.3.7's warm-up, failures and ``/metrics``, and on the real control plane.

* The warm-up arithmetic is the fleet's own (:mod:`e2e.fleet.tgi_truth`) and the lines it cites are TGI's
  (the verbatim excerpts in ``tests/data/tgi/``); the names and texts come from :mod:`kvpilot.tuner.tgi`.
* The router's admission limit: beyond ``--max-concurrent-requests`` requests are refused (429), counted in
  ``tgi_request_failure{err="overloaded"}`` and logged as "Model is overloaded".
* On the KWOK cluster, pods rendered by ``kvpilot render`` for ``spec.engine.kind: TGI``: good flags become
  Ready and serve TGI's series, which move with the load; a warm-up prefill that does not fit and a
  ``--max-total-tokens`` above the inferred capacity terminate with TGI's log in the termination message;
  the lowered flags start.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster import LocalCluster
from e2e.fleet import Fleet, Scenario, Workload, tgi_exposition, tgi_truth
from e2e.fleet.players import TgiPlayer, player_for
from e2e.fleet.testing import H100_8B, pod_json, wait_until
from e2e.fleet.tgi_truth import TgiArgs
from e2e.fleet.truth import GiB
from e2e.pods import termination_message
from kvpilot.tuner.engines import TgiEngine
from kvpilot.tuner.tgi import classify_log, messages, serving

ROOT = Path(__file__).resolve().parents[1]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ISVC = {
    "apiVersion": "kvpilot.io/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "chat", "namespace": "default"},
    "spec": {
        "model": {"id": MODEL, "source": "Catalogue"},
        "engine": {"kind": "TGI", "image": f"{serving.IMAGE_REPOSITORY}:3.3.7"},
        "gpu": {"count": 1, "product": "NVIDIA-H100-80GB-HBM3"},
        "serving": {"maxContextLength": 8192},
        "tuning": {"mode": "Auto"},
    },
}
TRUTH = dataclasses.replace(H100_8B, backoff_s=1.0, startup_s=0.5)
BUSY = Workload(arrival_rate=8.0, prompt_tokens=600, output_tokens=200, time_scale=2.0)
WIGGLE_TOTAL = 480_000
"""A ``--max-total-tokens`` whose one warm-up request fits the H100 but leaves less than the 10 % wiggle room
free: the inferred capacity is the warm-up's own ``WIGGLE_TOTAL - 1`` tokens (TGI's NotEnoughMemory)."""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The Deployment ``kvpilot render`` produces for a TGI InferenceService (Llama-3.1-8B, H100, 8K)."""
    path = tmp_path_factory.mktemp("isvc") / "isvc.yaml"
    path.write_text(yaml.safe_dump(ISVC))
    kvpilot = Path(sys.executable).parent / "kvpilot"
    out = subprocess.run(
        [str(kvpilot), "render", "-f", str(path)], check=True, capture_output=True, text=True
    )
    (deploy,) = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Deployment"]
    return dict(deploy)


def _argv(deploy: dict[str, Any]) -> list[str]:
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return [*c.get("command", []), *c.get("args", [])]


def _with(argv: list[str], **flags: int) -> list[str]:
    """``argv`` with each ``--flag`` (``max_batch_prefill_tokens=...``) set to its value."""
    out = list(argv)
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if flag in out:
            out[out.index(flag) + 1] = str(value)
        else:
            out += [flag, str(value)]
    return out


# ----------------------------------------------------------------------------- without a cluster


def test_the_fleet_reads_the_rendered_flags_and_sizes_the_kv_as_tgis_warm_up(
    rendered: dict[str, Any],
) -> None:
    argv = _argv(rendered)
    (c,) = rendered["spec"]["template"]["spec"]["containers"]
    assert tgi_truth.is_tgi(argv, c["image"]) and tgi_truth.is_tgi([], c["image"])
    assert not tgi_truth.is_tgi(["vllm", "serve", MODEL], "vllm/vllm-openai:v0.33.0")
    assert isinstance(player_for(argv, c["image"], {}), TgiPlayer)
    args = TgiArgs.parse(argv)
    assert (args.model_id, args.port, args.max_total_tokens, args.max_input_tokens) == (MODEL, 80, 8192, 8191)
    assert args.max_concurrent_requests == 128 and args.cuda_memory_fraction == 1.0
    prefill = args.max_batch_prefill_tokens
    assert prefill is not None and prefill > 8192
    w = tgi_truth.warmup(TRUTH, args)
    # the warm-up batch: requests of 8191 prompt tokens until the prefill is used, each holding 8191 tokens
    requests = -(-prefill // 8191)
    assert w.warmup_tokens == requests * 8191
    peak = 0.5 + 14.99 + w.warmup_tokens * 131072 / GiB + 0.12 * prefill / 1000
    assert w.peak_gib == pytest.approx(peak) and w.prefill_fits
    free = (79.11 - peak) - (1 - 1.0 * 0.90) * 79.11
    assert w.max_batch_total_tokens == int(free * GiB) // 131072 + w.warmup_tokens
    assert w.starts and w.max_total_tokens == 8192
    # a smaller --cuda-memory-fraction leaves less; fp8 KV holds about twice the tokens
    lower = tgi_truth.warmup(TRUTH, dataclasses.replace(args, cuda_memory_fraction=0.8))
    assert lower.max_batch_total_tokens < w.max_batch_total_tokens
    fp8 = tgi_truth.warmup(TRUTH, dataclasses.replace(args, kv_cache_dtype="fp8_e5m2"))
    assert fp8.max_batch_total_tokens > 1.9 * w.max_batch_total_tokens
    # the engine model's terms
    view = tgi_truth.engine_view(TRUTH, args)
    assert (view.max_model_len, view.max_num_seqs, view.max_num_batched_tokens, view.block_size) == (
        8192, 128, prefill, 1,
    )  # fmt: skip


def test_the_cited_rules_are_tgis() -> None:
    """The wiggle room, the free-memory rule and the flashinfer block, in TGI's verbatim source."""
    source = (ROOT / "tests" / "data" / "tgi" / "server_memory_v3.3.7.py.txt").read_text()
    assert f'TGI_WIGGLE_ROOM = float(os.getenv("TGI_WIGGLE_ROOM", "{tgi_truth.WIGGLE_ROOM:.2f}"))' in source
    assert "free_memory = max(0, total_free_memory - (1 - memory_fraction) * total_gpu_memory)" in source
    assert "get_free_memory(\n                self.device, MEMORY_FRACTION * TGI_WIGGLE_ROOM" in source
    assert f'elif ATTENTION == "flashinfer":\n    BLOCK_SIZE = {tgi_truth.BLOCK_SIZE}' in source
    for dtype in tgi_truth.FP8_KV:
        assert f'"{dtype}"' in source, dtype


def test_start_up_failures_print_tgis_log() -> None:
    args = TgiArgs.parse(["text-generation-launcher", "--model-id", MODEL, "--max-input-tokens", "8191",
                          "--max-total-tokens", "8192", "--max-batch-prefill-tokens", "400000"])  # fmt: skip
    assert not tgi_truth.warmup(TRUTH, args).prefill_fits
    log = tgi_truth.startup_failure_log(TRUTH, args)
    assert log is not None and messages.prefill_tokens_error(400000) in log
    found = classify_log(termination_message(log))
    assert found is not None and (found.kind, found.tokens) == ("prefill_too_large", 400000)
    assert (
        tgi_truth.startup_failure_log(TRUTH, dataclasses.replace(args, max_batch_prefill_tokens=59870))
        is None
    )
    # --max-total-tokens above the inferred capacity: the router's NotEnoughMemory, as Rust prints it
    wide = dataclasses.replace(
        args, max_input_tokens=8191, max_batch_prefill_tokens=8191, max_total_tokens=WIGGLE_TOTAL
    )
    w = tgi_truth.warmup(TRUTH, wide)
    assert w.prefill_fits and w.max_batch_total_tokens == WIGGLE_TOTAL - 1 and not w.starts
    log = tgi_truth.startup_failure_log(TRUTH, wide)
    assert log is not None and f"Error: Backend(NotEnoughMemory({WIGGLE_TOTAL}))" in log
    assert messages.max_total_tokens_error(WIGGLE_TOTAL) not in log  # the Display text TGI never prints
    assert tgi_truth.warmup(TRUTH, dataclasses.replace(wide, max_total_tokens=400_000)).starts


def test_kvpilot_reads_the_max_total_tokens_failure_tgi_prints() -> None:
    """TGI 3.3.7's router returns ``V3Error::NotEnoughMemory`` from ``main``, so Rust prints its Debug form
    (``Error: Backend(NotEnoughMemory(N))``), not its Display text: kvpilot reads both."""
    args = TgiArgs.parse(["--model-id", MODEL, "--max-input-tokens", "8191", "--max-total-tokens",
                          str(WIGGLE_TOTAL), "--max-batch-prefill-tokens", "8191"])  # fmt: skip
    log = tgi_truth.startup_failure_log(TRUTH, args)
    assert log is not None
    found = classify_log(termination_message(log))
    assert found is not None and (found.kind, found.tokens) == ("total_tokens_too_large", WIGGLE_TOTAL)


def test_the_router_refuses_beyond_max_concurrent_requests_and_the_exposition_counts_it() -> None:
    flags = ["--max-total-tokens", "8192", "--max-input-tokens", "8191", "--max-batch-prefill-tokens", "8192"]
    args = TgiArgs.parse(["--model-id", MODEL, *flags, "--max-concurrent-requests", "6"])
    player = TgiPlayer(args)
    sim = player.simulate(TRUTH, BUSY, player.engine_view(TRUTH), 1)
    metrics = player.metrics(TRUTH)
    lines: list[str] = []
    for _ in range(40):
        sim.advance(0.5)
        assert sim.num_running + sim.num_waiting <= 6
        deltas = sim.drain()
        lines += player.pressure_lines(deltas)
        metrics.record(running=sim.num_running, waiting=sim.num_waiting, kv_usage=sim.kv_usage, deltas=deltas)
    assert sim.total_refused > 0 and sim.total_finished > 0 and len(lines) == sim.total_refused
    found = classify_log(lines[-1])
    assert found is not None and found.kind == "overloaded"
    fams = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    (failure,) = fams[serving.REQUEST_FAILURE].samples
    assert failure.labels == {"err": "overloaded"} and failure.value == sim.total_refused  # TGI's, verbatim
    assert (
        fams[serving.BATCH_MAX_TOTAL_TOKENS].samples[0].value
        == tgi_truth.warmup(TRUTH, args).max_batch_total_tokens
    )
    for name in (serving.REQUEST_DURATION, serving.REQUEST_QUEUE_DURATION, serving.TIME_PER_TOKEN):
        fam = fams[name]
        assert fam.type == "histogram"
        count = next(s.value for s in fam.samples if s.name == f"{name}_count")
        assert count == sim.total_finished, name
        les = [s.labels["le"] for s in fam.samples if s.name.endswith("_bucket")]
        assert len(les) == len(tgi_exposition.DURATION_BUCKETS) + 1 and les[-1] == "+Inf"
    for name in (serving.QUEUE_SIZE, serving.BATCH_CURRENT_SIZE, serving.BATCH_CURRENT_MAX_TOKENS):
        assert fams[name].type == "gauge", name
    text = metrics.render().decode()
    assert f"{serving.REQUEST_FAILURE}_total" not in text and "_created" not in text  # the exporter's shape
    assert f"\n{serving.REQUEST_OVERLOADED} {sim.total_refused}\n" in text  # what kvpilot reads


def test_a_runtime_oom_above_the_threshold() -> None:
    args = TgiArgs.parse(["--model-id", MODEL, "--cuda-memory-fraction", "0.95"])
    truth = dataclasses.replace(TRUTH, runtime_oom_above_cuda_memory_fraction=0.9)
    assert tgi_truth.runtime_oom(truth, args)
    assert not tgi_truth.runtime_oom(truth, dataclasses.replace(args, cuda_memory_fraction=0.9))
    assert not tgi_truth.runtime_oom(TRUTH, args)
    batch = dataclasses.replace(TRUTH, runtime_oom_above_max_num_seqs=64)
    assert tgi_truth.runtime_oom(batch, args)  # TGI's default: 128 concurrent requests
    assert not tgi_truth.runtime_oom(batch, dataclasses.replace(args, max_concurrent_requests=64))
    text = "\n".join(tgi_truth.cuda_oom_lines(truth, args))
    assert "torch.OutOfMemoryError: CUDA out of memory." in text and text.endswith("Error: ShardFailed")
    # the batch's own size: a decode batch above the threshold runs out, one at it does not
    assert tgi_truth.runtime_oom(batch, args, running=65) and not tgi_truth.runtime_oom(
        batch, args, running=64
    )
    # the router's line in the failed batch's spans: the first batch above the threshold, read by kvpilot
    lines = "\n".join(tgi_truth.cuda_oom_lines(batch, args, running=90))
    assert "ERROR batch{batch_size=65}:decode:decode{size=65}:decode{size=65}: " in lines
    failure = TgiEngine().classify_failure(lines)
    assert failure is not None and failure.kind == "runtime_oom" and failure.running == 65


def test_the_fleet_imports_only_tgis_facts_from_kvpilot() -> None:
    """The series names, failure texts and flags are kvpilot's (their one home); nothing else of kvpilot."""
    for path in (ROOT / "e2e" / "fleet" / "tgi_truth.py", ROOT / "e2e" / "fleet" / "tgi_exposition.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvpilot"):
                assert node.module == "kvpilot.tuner.tgi", (path.name, node.module)
                assert {a.name for a in node.names} <= {"args", "messages", "serving"}, path.name
        assert '"tgi_' not in path.read_text(), f"{path.name} spells a series name"
        assert "err=" not in path.read_text(), f"{path.name} spells a series' label"


# ----------------------------------------------------------------------------- on the KWOK cluster


@pytest.fixture
def fleet(cluster: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(
        cluster.kubeconfig,
        tmp_path / "targets.json",
        namespaces=[namespace],
        kubectl=cluster.kubectl_bin,
        default_scenario=Scenario(truth=TRUTH, workload=BUSY),
    )
    f.start()
    try:
        yield f
        assert not f.errors, f.errors
    finally:
        f.stop()


def _deploy(cluster: LocalCluster, rendered: dict[str, Any], namespace: str, argv: list[str]) -> None:
    doc = yaml.safe_load(yaml.safe_dump(rendered))  # a copy: the module's rendering stays as rendered
    doc["metadata"]["namespace"] = namespace
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    c["command"], c["args"] = argv[:1], argv[1:]
    cluster.apply(doc)


def _scrape(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{serving.METRICS_PATH}", timeout=5) as r:
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


def _value(fams: dict[str, Any], name: str, sample: str | None = None) -> float:
    return float(next(s.value for s in fams[name].samples if s.name == (sample or name)))


def _serving(fleet: Fleet, namespace: str, **args: object) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for p in fleet.pods(namespace, "chat"):
            if p["state"] == "Serving" and all(p["args"][k] == v for k, v in args.items()):
                return p
        return None

    return dict(wait_until(found, timeout=60, what=f"a TGI pod serving with {args}"))


def _terminated_with(cluster: LocalCluster, namespace: str, text: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for p in pod_json(cluster.kubectl, namespace, "app.kubernetes.io/instance=chat"):
            cs = (p["status"].get("containerStatuses") or [{}])[0]
            term = cs.get("lastState", {}).get("terminated") or {}
            if text in term.get("message", ""):
                return dict(term)
        return None

    return dict(wait_until(found, timeout=60, what=f"a termination message with {text!r}"))


def test_a_rendered_tgi_pod_becomes_ready_and_serves_tgis_series(
    cluster: LocalCluster, namespace: str, fleet: Fleet, rendered: dict[str, Any]
) -> None:
    argv = _argv(rendered)
    _deploy(cluster, rendered, namespace, argv)
    pod = _serving(fleet, namespace)
    assert pod["kind"] == "TGI" and pod["args"]["max_model_len"] == 8192
    wait_until(
        lambda: [
            p
            for p in pod_json(cluster.kubectl, namespace, "app.kubernetes.io/instance=chat")
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
        ],
        timeout=30,
        what="the TGI pod Ready",
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{pod['port']}{serving.HEALTH_PATH}", timeout=5) as r:
        assert r.status == 200
    capacity = tgi_truth.warmup(TRUTH, TgiArgs.parse(argv)).max_batch_total_tokens
    first = wait_until(
        lambda: (f := _scrape(pod["port"])) and serving.REQUEST_DURATION in f and f,
        timeout=30,
        what="a finished request in tgi_request_duration",
    )
    assert _value(first, serving.BATCH_MAX_TOTAL_TOKENS) == capacity
    done = _value(first, serving.REQUEST_DURATION, f"{serving.REQUEST_DURATION}_count")
    wait_until(
        lambda: (
            _value(_scrape(pod["port"]), serving.REQUEST_DURATION, f"{serving.REQUEST_DURATION}_count") > done
        ),
        timeout=30,
        what="more finished requests",
    )
    # a heavier load fills the batch: the running requests and the KV tokens they hold go up
    fleet.inject(namespace, "chat", fault="preemption_storm")
    wait_until(
        lambda: (
            _value(_scrape(pod["port"]), serving.BATCH_CURRENT_SIZE) >= 10
            and _value(_scrape(pod["port"]), serving.BATCH_CURRENT_MAX_TOKENS) > 0
        ),
        timeout=60,
        what="a fuller batch under the storm",
    )
    # an admission limit of 2 under the storm: the router refuses (429) and counts it
    fleet.clear_faults(namespace, "chat")
    _deploy(cluster, rendered, namespace, _with(argv, max_concurrent_requests=2))
    small = _serving(fleet, namespace, max_num_seqs=2)
    wait_until(
        lambda: (f := _scrape(small["port"])) and serving.REQUEST_FAILURE in f and f,
        timeout=60,
        what="requests refused beyond --max-concurrent-requests 2",
    )


def test_tgi_start_up_failures_show_in_pod_status_and_lower_flags_start(
    cluster: LocalCluster, namespace: str, fleet: Fleet, rendered: dict[str, Any]
) -> None:
    argv = _argv(rendered)
    _deploy(cluster, rendered, namespace, _with(argv, max_batch_prefill_tokens=400_000))
    term = _terminated_with(cluster, namespace, messages.prefill_tokens_error(400_000))
    assert term["exitCode"] == 1 and "Webserver Crashed" in term["message"]
    _deploy(cluster, rendered, namespace, argv)
    _serving(fleet, namespace, max_num_batched_tokens=TgiArgs.parse(argv).max_batch_prefill_tokens)
    # --max-total-tokens above what the warm-up leaves: the router stops with NotEnoughMemory
    wide = _with(argv, max_total_tokens=WIGGLE_TOTAL, max_batch_prefill_tokens=8191)
    _deploy(cluster, rendered, namespace, wide)
    term = _terminated_with(cluster, namespace, f"Error: Backend(NotEnoughMemory({WIGGLE_TOTAL}))")
    assert term["exitCode"] == 1
    _deploy(cluster, rendered, namespace, _with(wide, max_total_tokens=400_000))
    _serving(fleet, namespace, max_model_len=400_000)

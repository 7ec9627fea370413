"""The vLLM fleet simulator against the pinned vLLM source, the real Prometheus and the real control plane.

* The exposition matches what vLLM 0.33's ``PrometheusStatLogger`` declares (names, types, label
  names, buckets, ``vllm:cache_config_info`` keys), read from the installed wheel.
* Real Prometheus scrapes simulated pods through the file_sd targets the fleet writes; queries by
  ``namespace``/``pod`` return the simulator's figures; the pre-rename switch changes the names.
* On the KWOK cluster the fleet plays the managed pods: metrics per pod, and faults (runtime CUDA
  OOM, start-up KV failure) show in pod status exactly as kubelet reports them.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster import LocalCluster
from e2e.fleet import EngineArgs, Fleet, GroundTruth, Scenario, SimEngine, VllmMetrics, Workload, exposition
from e2e.fleet.pod import MetricsServer
from e2e.fleet.testing import pod_json, vllm_deployment, wait_until
from e2e.prometheus import PrometheusServer

VLLM_DIR = (
    Path(sys.prefix)
    / "lib"
    / f"python{sys.version_info.major}.{sys.version_info.minor}"
    / "site-packages"
    / "vllm"
)

# a small KV cache: 0.9 * 79.11 - 68 = 3.2 GiB = 26 240 bf16 tokens
SMALL_KV = GroundTruth(non_kv_gib=68.0, backoff_s=1.0, startup_s=0.5, oom_after_s=1.5)
LIGHT = Workload(arrival_rate=2.0, prompt_tokens=256, output_tokens=64, time_scale=2.0)


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    p = PrometheusServer(tmp_path_factory.mktemp("prometheus"), scrape_interval="1s")
    p.start()
    try:
        yield p
    finally:
        p.stop()


# ----------------------------------------------------------------------------- the pinned vLLM source


def _vllm_declared_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """{name: (Gauge|Counter|Histogram, labelnames)} from vllm/v1/metrics/loggers.py (AST, no import)."""
    src = (VLLM_DIR / "v1" / "metrics" / "loggers.py").read_text()
    kinds = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for node in ast.walk(ast.parse(src)):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in kinds
        ):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        name = kw.get("name")
        if not isinstance(name, ast.Constant):
            continue  # vllm:cache_config_info is built from a variable; checked separately
        labels: tuple[str, ...] = ()
        ln = kw.get("labelnames")
        if isinstance(ln, ast.Name) and ln.id == "labelnames":
            labels = ("model_name", "engine")
        elif isinstance(ln, ast.BinOp) and isinstance(ln.right, ast.List):
            labels = (
                "model_name",
                "engine",
                *(e.value for e in ln.right.elts if isinstance(e, ast.Constant)),
            )
        elif isinstance(ln, ast.List):
            labels = tuple(e.value for e in ln.elts if isinstance(e, ast.Constant))
        out[name.value] = (kinds[node.func.attr], labels)
    return out


def _exported(naming: str = "current") -> dict[str, Any]:
    truth = GroundTruth()
    args = EngineArgs.parse(["--model", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192"])
    text = VllmMetrics(truth, args, naming=naming).render().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_exposition_matches_the_pinned_vllm_source() -> None:
    declared = _vllm_declared_metrics()
    assert "vllm:kv_cache_usage_perc" in declared, "loggers.py not parsed"
    fams = _exported()
    required = {
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:num_preemptions": "counter",
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_prompt_tokens": "histogram",
        "vllm:request_generation_tokens": "histogram",
        "vllm:cache_config_info": "gauge",
    }
    for name, kind in required.items():
        assert name in fams and fams[name].type == kind, (name, fams.get(name))
    for name, fam in fams.items():
        if name.endswith("_created"):
            continue  # prometheus_client's created-timestamps, exported by vLLM too
        if name == "vllm:cache_config_info":
            continue
        if name.startswith("DCGM_FI_DEV_FB_"):  # dcgm-exporter's, not vLLM's: its own names and labels
            dcgm_labels = {"gpu", "UUID", "modelName", "Hostname"}
            assert fam.type == "gauge" and dcgm_labels <= set(fam.samples[0].labels)
            continue
        assert name in declared, f"{name} is not declared by vLLM 0.33"
        kind, labels = declared[name]
        assert fam.type == kind, (name, fam.type, kind)
        for s in fam.samples:
            keys = set(s.labels) - {"le"}
            assert keys == set(labels), (name, keys, labels)
            assert s.labels["model_name"] == "meta-llama/Llama-3.1-8B-Instruct" and s.labels["engine"] == "0"
    # counters are exposed with _total, histograms with _bucket/_sum/_count
    text = VllmMetrics(GroundTruth(), EngineArgs.parse(["--model", "m"])).render().decode()
    assert re.search(r"^vllm:num_preemptions_total\{", text, re.M)
    assert re.search(r'^vllm:request_prompt_tokens_bucket\{.*le="\+Inf"', text, re.M)


def test_buckets_and_cache_config_match_the_pinned_vllm() -> None:
    tree = ast.parse((VLLM_DIR / "v1" / "metrics" / "buckets.py").read_text())
    consts = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            with contextlib.suppress(ValueError):
                consts[node.target.id] = ast.literal_eval(node.value)
    for name in (
        "REQUEST_LATENCY_BUCKETS",
        "TIME_TO_FIRST_TOKEN_BUCKETS",
        "INTER_TOKEN_LATENCY_BUCKETS",
        "ITERATION_TOKENS_BUCKETS",
        "REQUEST_PARAMS_N_BUCKETS",
        "REQUEST_NUM_PREEMPTIONS_BUCKETS",
    ):
        assert tuple(consts[name]) == tuple(getattr(exposition, name)), name
    # CacheConfig().metrics_info() of the installed wheel (a subprocess: importing vLLM is heavy)
    code = (
        "import json; from vllm.config import CacheConfig; "
        "from vllm.v1.metrics.buckets import build_1_2_5_buckets as b; "
        "print(json.dumps({'info': CacheConfig().metrics_info(), 'b': [b(n) for n in (100, 8192, 131072)]}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(got["info"]) == list(exposition.CACHE_CONFIG_DEFAULTS)
    assert got["info"] == exposition.CACHE_CONFIG_DEFAULTS
    assert got["b"] == [exposition.build_1_2_5_buckets(n) for n in (100, 8192, 131072)]
    labels = _exported()["vllm:cache_config_info"].samples[0].labels
    assert set(labels) == set(exposition.CACHE_CONFIG_DEFAULTS) | {"engine"}
    assert "model_name" not in labels
    legacy = _exported("legacy")
    assert "kv_cache_size_tokens" not in legacy["vllm:cache_config_info"].samples[0].labels
    assert "vllm:kv_cache_usage_perc" not in legacy and "vllm:gpu_cache_usage_perc" in legacy
    both = _exported("both")
    assert "vllm:kv_cache_usage_perc" in both and "vllm:gpu_cache_usage_perc" in both


def _joined_str_regex(node: ast.JoinedStr) -> str:
    parts = []
    for v in node.values:
        parts.append(re.escape(v.value) if isinstance(v, ast.Constant) else "(.*?)")
    return "".join(parts)


def test_startup_error_texts_are_vllm_033s() -> None:
    """The fleet's start-up failures are the texts vLLM 0.33 raises (templates read from the wheel)."""
    tree = ast.parse((VLLM_DIR / "v1" / "core" / "kv_cache_planning.py").read_text())
    fn = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name == "_check_enough_kv_cache_memory"
    )
    joined = [n for n in ast.walk(fn) if isinstance(n, ast.JoinedStr)]
    main = next(j for j in joined if "To serve at least one request" in ast.unparse(j))
    estimate = next(j for j in joined if "estimated maximum model length" in ast.unparse(j))
    no_blocks = next(
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and "No available memory" in n.value
    )
    truth = GroundTruth(non_kv_gib=60.0)  # 0.92 * 79.11 - 60 = 12.78 GiB of KV
    args = EngineArgs.parse(["--model", "m", "--max-model-len", "131072"])
    err = truth.startup_error(args)
    assert err is not None and err.startswith("ValueError: ")
    m = re.fullmatch(_joined_str_regex(main), err.removeprefix("ValueError: "))
    assert m, err
    assert m.group(1) == "131072"
    assert re.fullmatch(_joined_str_regex(estimate), m.group(4))
    none_left = GroundTruth(non_kv_gib=80.0).startup_error(args)
    assert none_left is not None and none_left.removeprefix("ValueError: ").startswith(no_blocks.value)
    est = int(re.search(r"estimated maximum model length is (\d+)", err).group(1))
    assert est == truth.kv_tokens(args) - truth.block(args) and est % 16 == 0  # the null block held back
    assert truth.startup_error(EngineArgs.parse(["--model", "m", "--max-model-len", str(est)])) is None
    assert (
        truth.startup_error(EngineArgs.parse(["--model", "m", "--max-model-len", str(est + 1)])) is not None
    )
    # fp8 KV halves the bytes per token: twice the tokens
    fp8 = EngineArgs.parse(["--model", "m", "--max-model-len", "131072", "--kv-cache-dtype", "fp8"])
    assert abs(truth.kv_tokens(fp8) - 2 * truth.kv_tokens(args)) <= 16
    none_left = GroundTruth(non_kv_gib=80.0).startup_error(args)
    assert none_left is not None and "No available memory for the cache blocks" in none_left


TGI_FACTS = {"kvpilot.tuner.tgi.args", "kvpilot.tuner.tgi.messages", "kvpilot.tuner.tgi.serving"}
"""What the fleet may import of kvpilot: TGI's names, texts and flags from their one home (TGI is Rust: there
is no wheel to read them from), never a rule that sizes memory or decides."""


def test_fleet_does_not_import_kvpilot() -> None:
    """The simulator's ground truth must not come from the code it judges."""
    for path in sorted((Path(__file__).parent / "fleet").glob("*.py")):
        if path.name in ("stack.py", "kopf_process.py"):  # harness: starts the operator, reads its CRD
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" for a in node.names]
            names = [n for n in names if n not in TGI_FACTS]
            assert not any(n == "kvpilot" or n.startswith("kvpilot.") for n in names), (path.name, names)


def _sample_names(naming: str) -> set[str]:
    return {s.name for fam in _exported(naming).values() for s in fam.samples}


@pytest.mark.parametrize("naming", exposition.NAMINGS)
def test_the_fleet_serves_every_series_kvpilot_queries(naming: str) -> None:
    """kvpilot's vLLM facts (kvpilot.tuner.vllm.serving) against the simulator, which keeps its own copy on
    purpose (checked against the vLLM wheel above): each naming serves the series kvpilot asks for, and the
    KV-usage fallback is the one that release has."""
    from kvpilot.tuner.vllm import serving

    served = _sample_names(naming)
    wanted = {serving.PREEMPTIONS, serving.RUNNING, serving.WAITING, serving.CACHE_CONFIG_INFO}
    for histogram in (serving.PROMPT_TOKENS, serving.GENERATION_TOKENS, serving.TTFT, serving.ITL):
        wanted |= {f"{histogram}_sum", f"{histogram}_count", f"{histogram}_bucket"}
    assert wanted <= served, sorted(wanted - served)
    kv = {
        "current": {serving.KV_USAGE},
        "both": {serving.KV_USAGE, serving.KV_USAGE_LEGACY},
        "legacy": {serving.KV_USAGE_LEGACY},
    }[naming]
    assert served & {serving.KV_USAGE, serving.KV_USAGE_LEGACY} == kv


def test_the_fleet_pod_is_the_one_kvpilot_renders() -> None:
    """The simulated pod answers kvpilot's health and metrics paths; the fleet's stand-in Deployment has
    kvpilot's container name and port."""
    import urllib.request

    from kvpilot.tuner.vllm import serving

    srv = MetricsServer(0, lambda: b"# EOF\n")
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    try:
        for path in (serving.HEALTH_PATH, serving.METRICS_PATH):
            with urllib.request.urlopen(f"http://127.0.0.1:{srv.server_address[1]}{path}", timeout=5) as r:
                assert r.status == 200, path
    finally:
        srv.shutdown()
        srv.server_close()
    (container,) = vllm_deployment("a", "ns", [])["spec"]["template"]["spec"]["containers"]
    assert container["name"] == serving.CONTAINER_NAME
    assert container["ports"] == [{"name": "http", "containerPort": serving.PORT}]


def test_missing_prometheus_binary_fails_loudly(tmp_path: Path) -> None:
    from e2e.prometheus import PrometheusError

    with pytest.raises(PrometheusError, match="not found"):
        PrometheusServer(tmp_path, binary=tmp_path / "no-prometheus").start()


def test_args_parsing() -> None:
    a = EngineArgs.parse(
        [
            "vllm",
            "serve",
            "org/model",
            "--max-model-len=32K",
            "--max_num_seqs",
            "64",
            "--gpu-memory-utilization",
            "0.85",
            "--kv-cache-dtype",
            "fp8",
            "-tp",
            "2",
            "--served-model-name",
            "chat",
        ]
    )
    assert (
        a.model,
        a.max_model_len,
        a.max_num_seqs,
        a.gpu_memory_utilization,
        a.kv_cache_dtype,
        a.tensor_parallel_size,
        a.model_name,
    ) == ("org/model", 32768, 64, 0.85, "fp8", 2, "chat")
    d = EngineArgs.parse(["--model", "m"])
    truth = GroundTruth()
    assert (truth.utilization(d), truth.max_model_len(d), truth.block(d)) == (0.92, 131072, 16)


def test_queueing_model_preempts_only_when_kv_is_oversubscribed() -> None:
    args = ["--model", "m", "--max-model-len", "8192", "--gpu-memory-utilization", "0.9"]
    storm = Workload(arrival_rate=6, prompt_tokens=1000, output_tokens=800)
    many = SimEngine(SMALL_KV, storm, EngineArgs.parse([*args, "--max-num-seqs", "256"]), seed=1)
    few = SimEngine(SMALL_KV, storm, EngineArgs.parse([*args, "--max-num-seqs", "12"]), seed=1)
    for e in (many, few):
        e.advance(120)
    assert many.total_preemptions > 20, many.total_preemptions
    assert few.total_preemptions == 0
    assert few.num_running == 12 and few.num_waiting > 0 and few.kv_usage < 0.9
    idle = SimEngine(SMALL_KV, LIGHT, EngineArgs.parse([*args, "--max-num-seqs", "256"]), seed=1)
    idle.advance(60)
    assert idle.total_preemptions == 0 and idle.num_waiting == 0 and idle.total_finished > 50


# ----------------------------------------------------------------------------- real Prometheus


class _Driver:
    """Simulated pods without a cluster: engine + exposition + HTTP server, advanced by a thread."""

    def __init__(self) -> None:
        self.pods: list[tuple[str, str, SimEngine, VllmMetrics, MetricsServer]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self.lock = threading.Lock()
        self.frozen = False

    def add(self, ns: str, pod: str, truth: GroundTruth, wl: Workload, args: list[str], naming: str) -> None:
        a = EngineArgs.parse(args)
        eng = SimEngine(truth, wl, a, seed=len(self.pods))
        m = VllmMetrics(truth, a, naming=naming)
        srv = MetricsServer(0, m.render)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        self.pods.append((ns, pod, eng, m, srv))

    def targets(self) -> list[dict[str, Any]]:
        return [
            {
                "targets": [f"127.0.0.1:{srv.server_address[1]}"],
                "labels": {"__meta_kubernetes_namespace": ns, "__meta_kubernetes_pod_name": pod},
            }
            for ns, pod, _, _, srv in self.pods
        ]

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            with self.lock:
                if self.frozen:
                    continue
                for _, _, eng, m, _ in self.pods:
                    eng.advance(0.2 * eng.workload.time_scale)
                    m.record(
                        running=eng.num_running,
                        waiting=eng.num_waiting,
                        kv_usage=eng.kv_usage,
                        deltas=eng.drain(),
                    )

    def __enter__(self) -> _Driver:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)
        for *_, srv in self.pods:
            srv.shutdown()
            srv.server_close()


def test_real_prometheus_scrapes_the_simulated_exposition(prom: PrometheusServer) -> None:
    ns = "fleet-prom"
    args = [
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.9",
    ]
    storm = Workload(arrival_rate=8, prompt_tokens=1000, output_tokens=600, time_scale=4.0)
    with _Driver() as d:
        d.add(ns, "storm-5d8f7c9b4-abcde", SMALL_KV, storm, [*args, "--max-num-seqs", "256"], "current")
        d.add(ns, "calm-6c9d8b7f5-fghij", SMALL_KV, LIGHT, [*args, "--max-num-seqs", "256"], "legacy")
        d.add(ns, "both-7f6e5d4c3-klmno", SMALL_KV, LIGHT, [*args, "--max-num-seqs", "64"], "both")
        prom.write_targets(d.targets())
        sel = f'namespace="{ns}"'
        prom.wait_for(f"up{{{sel}}} == 1", lambda r: len(r) == 3, timeout=30, what="3 targets up")
        # preemptions: only the storm pod, visible as a rate over a short window
        res = prom.wait_for(
            f"rate(vllm:num_preemptions_total{{{sel}}}[5s]) > 0",
            lambda r: len(r) >= 1,
            timeout=60,
            what="a preemption rate",
        )
        assert {r["metric"]["pod"] for r in res} == {"storm-5d8f7c9b4-abcde"}
        # the contract's selector finds exactly one pod per service
        storm_sel = f'{{namespace="{ns}", pod=~"storm-[^-]+-[^-]+"}}'
        prom.wait_for(
            f"vllm:request_prompt_tokens_count{storm_sel} > 5", bool, timeout=60, what="finished requests"
        )
        with d.lock:
            d.frozen = True
            eng = d.pods[0][2]
            want_usage, want_preempt = eng.kv_usage, eng.total_preemptions
        time.sleep(2.5)  # two more scrapes of the frozen figures
        assert prom.query_value(f"vllm:kv_cache_usage_perc{storm_sel}") == pytest.approx(want_usage)
        assert prom.query_value(f"vllm:num_preemptions_total{storm_sel}") == want_preempt
        r = prom.query(f"vllm:cache_config_info{storm_sel}")
        assert len(r) == 1
        lab = r[0]["metric"]
        assert lab["num_gpu_blocks"] == str(SMALL_KV.num_gpu_blocks(eng.args)) == str(eng.num_blocks)
        assert lab["kv_cache_size_tokens"] == str(SMALL_KV.kv_tokens(eng.args))
        assert (
            lab["block_size"] == "16"
            and lab["gpu_memory_utilization"] == "0.9"
            and lab["cache_dtype"] == "auto"
        )
        assert lab["namespace"] == ns and lab["pod"] == "storm-5d8f7c9b4-abcde" and lab["job"] == "vllm"
        mean_prompt = prom.query_value(
            f"vllm:request_prompt_tokens_sum{storm_sel} / vllm:request_prompt_tokens_count{storm_sel}"
        )
        assert 750 <= mean_prompt <= 1250
        p90 = prom.query_value(f"histogram_quantile(0.9, vllm:request_generation_tokens_bucket{storm_sel})")
        assert 200 <= p90 <= 1000
        # the name switch: legacy exports only the pre-rename gauge, "both" exports both
        calm = f'{{namespace="{ns}", pod=~"calm-[^-]+-[^-]+"}}'
        assert prom.query(f"vllm:kv_cache_usage_perc{calm}") == []
        assert len(prom.query(f"vllm:gpu_cache_usage_perc{calm}")) == 1
        assert "kv_cache_size_tokens" not in prom.query(f"vllm:cache_config_info{calm}")[0]["metric"]
        both = f'{{namespace="{ns}", pod=~"both-[^-]+-[^-]+"}}'
        assert len(prom.query(f"vllm:kv_cache_usage_perc{both}")) == 1
        assert len(prom.query(f"vllm:gpu_cache_usage_perc{both}")) == 1
        assert prom.query_value(f"sum(rate(vllm:num_preemptions_total{calm}[10s]))") == 0
        prom.write_targets([])


def test_prometheus_restart_keeps_port_and_history(tmp_path: Path) -> None:
    p = PrometheusServer(tmp_path / "p")
    with p:
        port, pid = p.port, p.pid
        assert p.query_value("vector(1)") == 1
    assert not p.running()
    with pytest.raises(OSError):
        p.query("vector(1)")
    p.start()
    try:
        assert p.port == port and p.pid != pid and p.query_value("vector(2)") == 2
    finally:
        p.stop()
    assert "Server is ready to receive web requests" in p.log_file.read_text()


# ----------------------------------------------------------------------------- on the KWOK cluster


@pytest.fixture
def fleet(cluster: LocalCluster, namespace: str, prom: PrometheusServer) -> Iterator[Fleet]:
    f = Fleet(
        cluster.kubeconfig,
        prom.targets_file,
        namespaces=[namespace],
        kubectl=cluster.kubectl_bin,
        default_scenario=Scenario(truth=SMALL_KV, workload=LIGHT),
    )
    f.start()
    try:
        yield f
        assert not f.errors, f.errors
    finally:
        f.stop()


def _deploy(cluster: LocalCluster, ns: str, name: str, args: list[str]) -> None:
    cluster.apply(vllm_deployment(name, ns, ["--model", "meta-llama/Llama-3.1-8B-Instruct", *args]))


def _pods(cluster: LocalCluster, ns: str, name: str) -> list[dict[str, Any]]:
    return pod_json(cluster.kubectl, ns, f"app.kubernetes.io/instance={name}")


def _terminated(p: dict[str, Any]) -> dict[str, Any]:
    cs = (p.get("status", {}).get("containerStatuses") or [{}])[0]
    return cs.get("lastState", {}).get("terminated") or {}


def test_fleet_serves_metrics_for_the_cluster_pods(
    cluster: LocalCluster, namespace: str, fleet: Fleet, prom: PrometheusServer
) -> None:
    _deploy(
        cluster,
        namespace,
        "chat",
        ["--max-model-len", "8192", "--max-num-seqs", "48", "--gpu-memory-utilization", "0.9"],
    )
    pod = wait_until(
        lambda: [p for p in fleet.pods(namespace, "chat") if p["state"] == "Serving"],
        timeout=60,
        what="the fleet serving the chat pod",
    )[0]
    assert pod["args"]["max_num_seqs"] == 48 and pod["args"]["gpu_memory_utilization"] == 0.9
    assert re.fullmatch(r"chat-[^-]+-[^-]+", pod["pod"])  # a real ReplicaSet pod name
    sel = f'{{namespace="{namespace}", pod=~"chat-[^-]+-[^-]+"}}'
    prom.wait_for(f"vllm:num_requests_running{sel}", bool, timeout=30, what="the chat pod's series")
    info = prom.query(f"vllm:cache_config_info{sel}")[0]["metric"]
    assert info["num_gpu_blocks"] == str(
        SMALL_KV.num_gpu_blocks(EngineArgs.parse(["--gpu-memory-utilization", "0.9"]))
    )
    prom.wait_for(f"vllm:generation_tokens_total{sel} > 0", bool, timeout=30, what="generated tokens")
    # the pod is Ready, as the fleet reported it after start-up
    p = wait_until(
        lambda: [
            p
            for p in _pods(cluster, namespace, "chat")
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
        ],
        timeout=30,
        what="chat pod Ready",
    )[0]
    assert p["status"]["containerStatuses"][0]["restartCount"] == 0
    # preemption storm injection: the same service, heavier traffic; the small KV cache must preempt
    fleet.inject(namespace, "chat", fault="preemption_storm")
    prom.wait_for(
        f"rate(vllm:num_preemptions_total{sel}[10s]) > 0", bool, timeout=90, what="preemption storm"
    )
    # pods gone: targets removed
    cluster.kubectl("delete", "deployment", "chat", "-n", namespace, "--wait=false")
    wait_until(lambda: not fleet.pods(namespace), timeout=60, what="the fleet to drop the deleted pod")
    wait_until(lambda: namespace not in prom.targets_file.read_text(), timeout=5, what="targets file updated")


def test_runtime_cuda_oom_shows_in_pod_status_as_kubelet_reports_it(
    cluster: LocalCluster, namespace: str, fleet: Fleet
) -> None:
    truth = dataclasses.replace(SMALL_KV, non_kv_gib=60.0, runtime_oom_above_utilization=0.9)
    fleet.set_scenario(namespace, "oomy", Scenario(truth=truth, workload=LIGHT))
    _deploy(cluster, namespace, "oomy", ["--max-model-len", "8192", "--gpu-memory-utilization", "0.95"])

    def crashed_twice() -> dict[str, Any] | None:
        for p in _pods(cluster, namespace, "oomy"):
            cs = (p["status"].get("containerStatuses") or [{}])[0]
            if cs.get("restartCount", 0) >= 2 and _terminated(p):
                return p
        return None

    p = wait_until(crashed_twice, timeout=90, what="two CUDA OOM crashes in pod status")
    term = _terminated(p)
    assert term["exitCode"] == 1 and term["reason"] == "Error"
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in term["message"]
    assert "EngineCore encountered a fatal error." in term["message"]
    ready = next(c for c in p["status"]["conditions"] if c["type"] == "Ready")
    cs = p["status"]["containerStatuses"][0]
    assert ready["status"] == "False" or cs["state"].get("running") is not None  # crash loop or restarted
    kinds = [e.kind for e in fleet.events_for(namespace)]
    assert kinds.count("CudaOOM") >= 2 and "Restarted" in kinds
    # the same ground truth at a safe utilisation serves without crashing
    _deploy(cluster, namespace, "oomy", ["--max-model-len", "8192", "--gpu-memory-utilization", "0.85"])
    wait_until(
        lambda: [
            s
            for s in fleet.pods(namespace, "oomy")
            if s["args"]["gpu_memory_utilization"] == 0.85 and s["state"] == "Serving"
        ],
        timeout=60,
        what="the new pod serving at 0.85",
    )
    time.sleep(SMALL_KV.oom_after_s + 1.5)
    assert all(
        not s["crashes"] for s in fleet.pods(namespace, "oomy") if s["args"]["gpu_memory_utilization"] == 0.85
    )


def test_startup_kv_failure_shows_in_pod_status(
    cluster: LocalCluster, namespace: str, fleet: Fleet, prom: PrometheusServer
) -> None:
    args = ["--max-model-len", "131072", "--gpu-memory-utilization", "0.9"]
    _deploy(cluster, namespace, "longctx", args)
    parsed = EngineArgs.parse(args)
    want = SMALL_KV.kv_tokens(parsed) - SMALL_KV.block(parsed)  # the null block held back

    def failed() -> dict[str, Any] | None:
        return next((p for p in _pods(cluster, namespace, "longctx") if _terminated(p)), None)

    p = wait_until(failed, timeout=60, what="a start-up failure in pod status")
    term = _terminated(p)
    cs = p["status"]["containerStatuses"][0]
    assert term["exitCode"] == 1 and cs["restartCount"] >= 1
    assert cs["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff" or cs["state"].get("running")
    msg = term["message"]
    # a real vLLM's shape: the termination message (kubelet's last 2 KiB) ends in the API server's traceback,
    # the ValueError ~60 lines up is only in the previous log, which the API server's pods/log serves (KWOK)
    assert "ValueError" not in msg and "Engine core initialization failed" in msg
    assert len(msg.encode()) <= 2048
    name = p["metadata"]["name"]
    previous = cluster.kubectl("logs", "-n", namespace, name, "-c", "vllm", "--previous").stdout
    assert "ValueError: To serve at least one request with the model's max seq len (131072)" in previous
    assert f"the estimated maximum model length is {want}." in previous
    # it never served: the target exists but the scrape is refused (up == 0), no vLLM series
    sel = f'{{namespace="{namespace}", pod=~"longctx-[^-]+-[^-]+"}}'
    prom.wait_for(f"up{sel} == 0", bool, timeout=30, what="the failing pod's target down")
    assert prom.query(f"vllm:num_requests_running{sel}") == []
    # the estimated length starts
    _deploy(cluster, namespace, "longctx", ["--max-model-len", str(want), "--gpu-memory-utilization", "0.9"])
    wait_until(
        lambda: [
            s
            for s in fleet.pods(namespace, "longctx")
            if s["args"]["max_model_len"] == want and s["state"] == "Serving"
        ],
        timeout=60,
        what=f"the pod with --max-model-len {want} serving",
    )


def test_fleet_runs_as_a_process(cluster: LocalCluster, namespace: str, tmp_path: Path) -> None:
    """``python -m e2e.fleet``: the same simulator as a separate process, scenarios from a JSON file."""
    targets = tmp_path / "targets.json"
    scenarios = tmp_path / "scenarios.json"
    scenarios.write_text(
        json.dumps({f"{namespace}/solo": Scenario(truth=SMALL_KV, workload=LIGHT).to_dict()})
    )
    cmd = [
        sys.executable,
        "-m",
        "e2e.fleet",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--targets",
        str(targets),
    ]
    cmd += ["--scenarios", str(scenarios), "--namespace", namespace]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _deploy(cluster, namespace, "solo", ["--max-model-len", "8192", "--gpu-memory-utilization", "0.9"])

        def served() -> str | None:
            groups = json.loads(targets.read_text()) if targets.exists() else []
            for g in groups:
                if g["labels"]["__meta_kubernetes_namespace"] == namespace:
                    import urllib.request

                    with urllib.request.urlopen(f"http://{g['targets'][0]}/metrics", timeout=2) as r:
                        return r.read().decode()
            return None

        text = wait_until(served, timeout=60, what="the fleet process serving the pod's /metrics")
        blocks = SMALL_KV.num_gpu_blocks(EngineArgs.parse(["--gpu-memory-utilization", "0.9"]))
        assert f'num_gpu_blocks="{blocks}"' in text and "vllm:kv_cache_usage_perc{" in text
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out

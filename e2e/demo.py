"""``make demo``: kvpilot closing the loop on a local cluster, end to end.

Starts the real local control plane (``e2e.cluster.LocalCluster``, KWOK GPU nodes), the real
Prometheus, the vLLM fleet simulator and the operator (``kopf run``), applies ``examples/``
and drives one scenario per example, each with its own ground truth in the fleet:

* ``llama-8b-l4``           -- runs, then hits CUDA OOM while serving (it needs a little more memory
                               outside vLLM's budget than the plan leaves): kvpilot lowers
                               ``--gpu-memory-utilization`` or ``--max-num-seqs`` until it is stable;
* ``llama-8b-long-context`` -- the KV cache holds fewer tokens than planned: vLLM refuses to start
                               ("estimated maximum model length is N"); kvpilot shortens the context;
* ``llama-70b-fp8``         -- a preemption storm (long prompts, heavy traffic): kvpilot lowers
                               ``--max-num-seqs``;
* ``llama-70b-too-big``     -- does not fit 4x L4 at all: ``Infeasible`` with what would fit;
* ``full-pool``             -- two replicas on a GPU pool where every GPU is taken (three one-GPU nodes,
                               one held by another app): a queue at the sequence limit makes kvpilot
                               raise ``--max-num-seqs``; with no spare GPU for a surge pod it replaces one
                               replica at a time, and a replica serves at every sample;
* ``bad-raise``             -- the same raise, but more than four sequences hit CUDA OOM at start-up:
                               the new setting never becomes Ready and is rolled back (the old pod kept
                               serving beside the surge pod).

Tuning decisions are printed as they happen (Kubernetes events of the InferenceServices and what
the fleet's pods do), then a summary table. Everything it started is stopped on the way out,
Ctrl-C included; logs stay in the run directory it prints.

    python -m e2e.demo [--dir DIR] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from e2e.fleet import GroundTruth, Scenario, Workload
from e2e.fleet.fleet import FleetEvent
from e2e.fleet.stack import REPO, EventTail, Stack, condition, settings_of
from e2e.kwok_stages import add_probed_label
from e2e.nodes import H100_80GB_HBM3, NodePool, node_manifest

EXAMPLES = REPO / "examples"
NS = "kvpilot-demo"

#: Demo-speed closed loop: the examples keep kvpilot's cautious defaults (10 min cooldown); here
#: minutes become seconds so the whole story fits in a couple of minutes.
DEMO_TUNING = {"cooldownSeconds": 10, "maxChangesPerHour": 60, "rolloutDeadlineSeconds": 30}

# Ground truth per example (the fleet's physics, independent of kvpilot's memory model).
L4 = dict(
    gpu_memory_gib=21.96,
    kv_bytes_per_token=131072,
    default_max_num_seqs=256,
    startup_s=2.0,
    backoff_s=3.0,
    oom_after_s=4.0,
)
SCENARIOS: dict[str, Scenario] = {
    # 4.1 GiB of KV at 0.91: the planned context fits; CUDA OOM while serving is armed once planned
    "llama-8b-l4": Scenario(
        name="cuda-oom",
        truth=GroundTruth(non_kv_gib=15.9, **L4),
        workload=Workload(arrival_rate=1.0, prompt_tokens=2000, output_tokens=300),
    ),
    # 3.5 GiB of KV at 0.91: ~57k fp8 tokens, less than the planned 64k context
    "llama-8b-long-context": Scenario(
        name="kv-too-small",
        truth=GroundTruth(non_kv_gib=16.5, **L4),
        workload=Workload(arrival_rate=0.3, prompt_tokens=20000, output_tokens=500),
    ),
    # TP4 shard of a 70B FP8 model with big activations: ~15 GiB of KV per GPU, ~200k tokens
    "llama-70b-fp8": Scenario(
        name="preemption-storm",
        truth=GroundTruth(
            gpu_memory_gib=79.11, non_kv_gib=60.0, kv_bytes_per_token=81920, startup_s=2.0, backoff_s=3.0
        ),
        workload=Workload(arrival_rate=3.0, prompt_tokens=12000, output_tokens=3000, time_scale=4.0),
    ),
}
H100_8B = GroundTruth(
    gpu_memory_gib=79.11,
    non_kv_gib=20.0,
    kv_bytes_per_token=131072,
    startup_s=2.0,
    backoff_s=3.0,
    oom_after_s=3.0,
)
QUEUE = Workload(arrival_rate=4.0, prompt_tokens=500, output_tokens=200)
"""Four sequences allowed and four requests a second: a queue at the limit, the KV cache almost empty."""
SCENARIOS.update(
    {
        "full-pool": Scenario(name="full-pool", truth=H100_8B, workload=QUEUE),
        "bad-raise": Scenario(
            name="bad-raise",
            workload=QUEUE,
            truth=dataclasses.replace(H100_8B, startup_oom_above_max_num_seqs=4),
        ),
    }
)
FULL_POOL = NodePool("demo-full", 3, H100_80GB_HBM3, 1, cpu="32", memory="256Gi", machine="demo")
"""Three one-GPU H100 nodes for ``full-pool`` alone (labelled and tainted): its two replicas and another
app's pod take all three GPUs."""
POOL_LABEL, POOL_TAINT = "kvpilot.dev/demo-pool", "kvpilot.dev/demo-full-pool"
PLACEMENT = {
    "nodeSelector": {POOL_LABEL: "full"},
    "tolerations": [{"key": POOL_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
}


def _demo_services() -> list[dict[str, Any]]:
    """The two services of the full-pool and rollback stories (not examples: demo placement and bounds)."""

    def isvc(name: str, **spec: Any) -> dict[str, Any]:
        return add_probed_label(
            {
                "apiVersion": "kvpilot.io/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
                    "gpu": {"count": 1, "product": H100_80GB_HBM3.product},
                    "serving": {"maxContextLength": 8192, "concurrency": 4},
                    "tuning": {**DEMO_TUNING, "cooldownSeconds": 0},
                    **spec,
                },
            }
        )

    return [
        isvc(
            "full-pool",
            replicas=2,
            nodeSelector=PLACEMENT["nodeSelector"],
            engine={"tolerations": PLACEMENT["tolerations"]},
        ),
        isvc("bad-raise"),
    ]


def _full_pool_nodes() -> list[dict[str, Any]]:
    nodes = []
    for i in range(FULL_POOL.count):
        m = node_manifest(FULL_POOL, i)
        m["metadata"]["labels"][POOL_LABEL] = "full"
        m["spec"]["taints"] = [{"key": POOL_TAINT, "value": "true", "effect": "NoSchedule"}]
        nodes.append(m)
    return nodes


OTHER_APP = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "other-app", "namespace": NS},
    "spec": {
        **PLACEMENT,
        "containers": [
            {
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": 1}},
            }
        ],
    },
}
"""Another app holding one GPU of the full pool."""


def _stamp(t0: float) -> str:
    return f"[{time.monotonic() - t0:6.1f}s]"


def _load_examples() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "InferenceService":
                doc.setdefault("metadata", {})["namespace"] = NS
                doc["spec"].setdefault("tuning", {}).update(DEMO_TUNING)
                docs.append(add_probed_label(doc))
    if not docs:
        raise SystemExit(f"no InferenceService examples under {EXAMPLES}")
    return docs


def _history(isvc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(isvc.get("status", {}).get("history") or [])


class Demo:
    def __init__(self, dir: Path, timeout: float) -> None:
        self.dir = dir
        self.timeout = timeout
        self.t0 = time.monotonic()
        self.cluster: Any = None
        self.stack: Stack | None = None
        self.tail: EventTail | None = None
        self.initial: dict[str, dict[str, Any]] = {}
        self.crashes: dict[str, int] = {}
        self.last_crash: dict[str, float] = {}
        self.full_pool_ready: list[int] = []
        """Ready replicas of ``full-pool`` at every sample from its retune to the end of its rollout."""

    def say(self, msg: str) -> None:
        print(f"{_stamp(self.t0)} {msg}", flush=True)

    # ---------------------------------------------------------------- output
    def on_k8s_event(self, ev: dict[str, Any]) -> None:
        name = ev["involvedObject"]["name"]
        msg = " ".join(str(ev.get("message", "")).split())
        self.say(f"event  {name:<22} {ev.get('type', ''):<7} {ev.get('reason', ''):<16} {msg[:150]}")

    def on_fleet_event(self, ev: FleetEvent) -> None:
        if ev.kind in ("CudaOOM", "StartupFailed", "StartupCudaOOM", "Serving", "Injected"):
            inst = ev.pod.rsplit("-", 2)[0]
            if ev.kind in ("CudaOOM", "StartupFailed", "StartupCudaOOM"):
                self.crashes[inst] = self.crashes.get(inst, 0) + 1
                self.last_crash[inst] = time.monotonic()
            self.say(f"vllm   {ev.pod:<34} {ev.kind:<14} {ev.detail[:110]}")

    # ---------------------------------------------------------------- run
    def run(self) -> int:
        from e2e.cluster import LocalCluster

        self.say(f"starting the local control plane (run directory {self.dir}) ...")
        self.cluster = LocalCluster(self.dir / "cluster", build=True)
        self.cluster.start()
        self.say(f"cluster up in {self.cluster.started_in:.1f}s: {self.cluster.server}")
        self.cluster.kubectl("create", "namespace", NS)
        self.stack = Stack(
            self.cluster,
            self.dir,
            namespaces=[NS],
            scenarios={(NS, name): sc for name, sc in SCENARIOS.items()},
        )
        self.stack.start()
        assert self.stack.fleet is not None and self.stack.operator is not None
        self.stack.fleet.on_event(self.on_fleet_event)
        self.say(f"prometheus {self.stack.prom.url}, fleet simulator, operator pid {self.stack.operator.pid}")
        self.tail = EventTail(self.cluster.kubectl, [NS], self.on_k8s_event).start()

        docs = _load_examples()
        self.say(f"applying {len(docs)} examples from examples/ (demo timings: {DEMO_TUNING})")
        self.cluster.apply(docs)
        self.cluster.add_nodes(_full_pool_nodes())
        self.cluster.apply(OTHER_APP)
        self.say("full pool: 3 one-GPU H100 nodes, one GPU held by another app; full-pool has 2 replicas")
        extra = _demo_services()
        self.cluster.apply(extra)
        docs = [*docs, *extra]
        names = [d["metadata"]["name"] for d in docs]
        self.wait_planned(names)
        self.arm_faults()
        self.converge(names)
        self.summary(names)
        self.timelines(names)
        return 0

    def isvc(self, name: str) -> dict[str, Any]:
        assert self.stack is not None
        return self.stack.isvc(NS, name)

    def wait_planned(self, names: list[str]) -> None:
        deadline = time.monotonic() + 90
        pending = set(names)
        while pending and time.monotonic() < deadline:
            for n in sorted(pending):
                obj = self.isvc(n)
                st = obj.get("status", {})
                if st.get("applied") or condition(obj, "Infeasible").get("status") == "True":
                    self.initial[n] = dict(st.get("applied") or {})
                    pending.discard(n)
            time.sleep(1)
        if pending:
            self.say(f"not planned after 90s: {sorted(pending)}")

    def arm_faults(self) -> None:
        """CUDA OOM for llama-8b-l4: at runtime this GPU needs a little more memory outside vLLM's budget
        than the plan leaves (0.25 GiB per running sequence on top of a fixed part): a lower
        utilisation or fewer sequences cure it."""
        assert self.stack is not None and self.stack.fleet is not None
        planned = self.initial.get("llama-8b-l4", {})
        util, seqs = planned.get("gpuMemoryUtilization"), planned.get("maxNumSeqs")
        if util and seqs:
            sc = SCENARIOS["llama-8b-l4"]
            per_seq = 0.25
            outside = (1 - float(util)) * sc.truth.gpu_memory_gib
            need = outside + 0.15  # 150 MiB short at the planned settings
            truth = dataclasses.replace(
                sc.truth,
                runtime_headroom_gib=round(need - per_seq * int(seqs), 3),
                runtime_gib_per_seq=per_seq,
            )
            self.stack.fleet.set_scenario(NS, "llama-8b-l4", dataclasses.replace(sc, truth=truth))
            self.say(
                f"fault  llama-8b-l4: at runtime this GPU needs {need:.2f} GiB outside vLLM's budget with "
                f"{seqs} sequences; gpu_memory_utilization {util} leaves {outside:.2f} GiB: CUDA OOM ahead"
            )

    def done(self, name: str) -> bool:
        obj = self.isvc(name)
        st, init = obj.get("status", {}), self.initial.get(name, {})
        applied = st.get("applied") or {}
        ready = condition(obj, "Ready").get("status") == "True"
        if name == "llama-8b-l4":  # a smaller step than planned, and no crash for 20 s
            lower = float(applied.get("gpuMemoryUtilization", 1)) < float(init.get("gpuMemoryUtilization", 0))
            fewer = applied.get("maxNumSeqs", 0) < init.get("maxNumSeqs", 0)
            quiet = time.monotonic() - self.last_crash.get(name, 0.0) > 20
            return ready and (lower or fewer) and quiet and not st.get("rollout")
        if name == "llama-8b-long-context":
            return ready and (
                applied.get("maxModelLen", 0) < init.get("maxModelLen", 0)
                or applied.get("kvCacheDtype") != init.get("kvCacheDtype")
            )
        if name == "llama-70b-fp8":
            return applied.get("maxNumSeqs", 0) < init.get("maxNumSeqs", 0)
        if name == "full-pool":
            retuned = any(h.get("action") == "Retuned" for h in _history(obj))
            if retuned:
                self.full_pool_ready.append(self.ready_pods(name))
            good = {k: v for k, v in (st.get("lastGoodSettings") or {}).items() if v is not None}
            now = {k: v for k, v in applied.items() if v is not None}
            return retuned and not st.get("rollout") and good == now
        if name == "bad-raise":
            return ready and any(h.get("action") == "RolledBack" for h in _history(obj))
        return True

    def ready_pods(self, name: str) -> int:
        """Pods of ``name`` (any settings) that are Ready and not terminating: who serves now."""
        assert self.cluster is not None
        out = self.cluster.kubectl(
            "get", "pods", "-n", NS, "-l", f"app.kubernetes.io/instance={name}", "-o", "json"
        ).stdout
        pods = [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]
        return sum(
            1
            for p in pods
            if any(
                c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or ()
            )
        )

    def converge(self, names: list[str]) -> None:
        deadline = time.monotonic() + self.timeout
        pending = [n for n in names if n in SCENARIOS]
        while pending and time.monotonic() < deadline:
            for n in list(pending):
                with contextlib.suppress(Exception):
                    if self.done(n):
                        self.say(
                            f"done   {n}: {settings_of(self.initial.get(n))}  ->  "
                            f"{settings_of(self.isvc(n)['status'].get('applied'))}"
                        )
                        pending.remove(n)
            time.sleep(1)
        if pending:
            self.say(f"still converging after {self.timeout:.0f}s: {pending}")
        if self.full_pool_ready:
            low = min(self.full_pool_ready)
            self.say(
                f"full-pool: Ready pods sampled through its rollout: at least {low} of 2 at each of "
                f"{len(self.full_pool_ready)} samples"
            )

    def summary(self, names: list[str]) -> None:
        if self.tail is not None:
            self.tail.stop()  # a last poll, so nothing is printed after the table
            self.tail = None
        rows = [("InferenceService", "planned", "now", "decisions", "crashes", "Ready")]
        for n in names:
            obj = self.isvc(n)
            st = obj.get("status", {})
            hist = _history(obj)
            counts: dict[str, int] = {}
            for h in hist:
                counts[h.get("action", "?")] = counts.get(h.get("action", "?"), 0) + 1
            ready = condition(obj, "Ready")
            infeasible = condition(obj, "Infeasible").get("status") == "True"
            rows.append(
                (
                    n,
                    settings_of(self.initial.get(n)),
                    "Infeasible" if infeasible else settings_of(st.get("applied")),
                    " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "-",
                    str(self.crashes.get(n, 0)),
                    f"{ready.get('status', '?')} ({ready.get('reason', '')})",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        print("\nSummary", flush=True)
        for i, r in enumerate(rows):
            print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
            if i == 0:
                print("  " + "  ".join("-" * w for w in widths))
        print(flush=True)

    def timelines(self, names: list[str]) -> None:
        """One ``kvpilot timeline`` picture per scenario, with the Prometheus lanes, in the run directory."""
        from kvpilot.observability import fetch, timeline

        assert self.stack is not None
        out = self.dir / "timelines"
        out.mkdir(exist_ok=True)
        for n in names:
            obj = self.isvc(n)
            times = [timeline.parse_time(h["time"]) for h in _history(obj)]
            if not times:
                continue
            ranges = fetch.fetch_ranges(self.stack.prom.url, NS, n, min(times) - 60, time.time())
            (out / f"{n}.svg").write_text(timeline.build_timeline_svg(obj, ranges, now=time.time()))
        self.say(f"timelines (kvpilot timeline NAME): {out}/<name>.svg")

    def cleanup(self) -> None:
        if self.tail is not None:
            with contextlib.suppress(Exception):
                self.tail.stop()
        if self.stack is not None:
            with contextlib.suppress(Exception):
                self.stack.stop()
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.stop()
        print(f"{_stamp(self.t0)} stopped everything; logs in {self.dir}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", help="run directory (default: a new one under $TMPDIR)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to let the scenarios converge")
    a = ap.parse_args(argv)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix=f"kvpilot-demo-{stamp}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    demo = Demo(run_dir, a.timeout)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, even when started with SIGINT ignored
    try:
        return demo.run()
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up", flush=True)
        return 130
    finally:
        demo.cleanup()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

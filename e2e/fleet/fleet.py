"""The fleet simulator: one simulated engine container (vLLM, SGLang, TGI) per kvpilot-managed pod on KWOK.

For every pod labelled ``app.kubernetes.io/managed-by=kvpilot`` that KWOK has
made Running, the fleet plays the container kubelet would run:

1. **start-up** (``GroundTruth.startup_wall_s``: engine start-up, checkpoint load, and the download
   when the pod's weight cache -- a claim, a node's ``hostPath`` -- does not hold the model yet;
   :class:`e2e.fleet.truth.StartupModel`): the pod is reported started but
   not Ready (vLLM binds its port only after loading, so probes and scrapes
   are refused). Then the engine either fails -- the KV cache does not hold one
   ``max_model_len`` request, or nothing is left for it -- and the container
   terminates with exit code 1 and vLLM's exact ``ValueError`` text, or it
   starts serving.
2. **serving**: ``/metrics`` in vLLM 0.33's exposition on its own
   ``127.0.0.1`` port, fed by :class:`e2e.fleet.engine.SimEngine` (the
   scenario's workload against the pod's *current* args). The pod is Ready.
   When the ground truth says these args hit CUDA OOM while serving, the
   container dies after ``oom_after_s`` with the torch OOM text.
3. **crash loop**: a crash is reported as kubelet does
   (:func:`e2e.pods.simulate_container_crash`: ``lastState.terminated`` exit 1
   with the message, ``CrashLoopBackOff``, ``restartCount`` + 1); after the
   back-off (doubling) the container starts again from step 1 with fresh
   counters, as a new process.

The Prometheus ``file_sd`` targets file lists every pod the fleet plays, with
the Kubernetes SD meta labels that :mod:`e2e.prometheus` relabels into
``namespace``/``pod``.

Which scenario (ground truth, workload, metric naming) a pod gets:
``set_scenario(namespace, instance, scenario)`` (``instance`` is the
``app.kubernetes.io/instance`` label, i.e. the InferenceService name; ``"*"``
for a whole namespace), else the fleet's default. Workload and fault changes
apply at once; memory figures apply at the next container start, as on a real
GPU.

**SGLang pods.** A container running ``python3 -m sglang.launch_server`` is played as SGLang 0.5.23
(:mod:`e2e.fleet.sglang_truth`): the pool sized from ``--mem-fraction-static`` as SGLang sizes it, SGLang's
start-up failures and run-time CUDA OOM in its log's shape, the same engine model for the queueing (its
preemptions are SGLang's retractions, logged as SGLang warns of them), SGLang's ``/metrics``
(:mod:`e2e.fleet.sglang_exposition`).

**TGI pods.** A container running ``text-generation-launcher`` (or TGI's image, whose entry point it is) is
played as TGI 3.3.7 (:mod:`e2e.fleet.tgi_truth`): the KV capacity its warm-up infers from the memory left
after the warm-up prefill, its two start-up failures (the prefill, ``--max-total-tokens``) and a run-time
CUDA OOM in its launcher's log, the same engine model for the queueing with the router's admission limit
(``--max-concurrent-requests``: beyond it 429 "Model is overloaded", logged and counted), TGI's
``/metrics`` (:mod:`e2e.fleet.tgi_exposition`). Both are :class:`e2e.fleet.players.Player` implementations.

**Multi-node groups.** A pod whose arguments carry vLLM's ``--headless`` (a LeaderWorkerSet group's worker)
runs engine ranks only: it becomes Ready after its start-up and has no port and no ``/metrics`` target; the
group's leader is played as any pod and reports for the whole group.

**Real engines.** A pod labelled ``e2e.kvpilot.io/engine: real``, or of a service named in
:meth:`Fleet.use_real_engine`, runs a real vLLM engine process instead (:mod:`e2e.fleet.real_engines`,
:mod:`e2e.vllm_cpu.engine_process`: the pod's scheduler flags, the truth's KV tokens, the tiny model):
it is Ready when the real ``/health`` answers, Prometheus scrapes its real ``/metrics``, and when the
process exits the crash carries its real exit code and the last lines of its real log (kubelet's
``FallbackToLogsOnError``). Its log, one file per container start, is at
:meth:`e2e.fleet.pod.PodEngine.log_file` under ``log_root``. Workloads and injected faults do not apply
to it: send it real requests (:mod:`e2e.vllm_cpu.load`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from e2e.fleet.caches import StartCaches, StartSources
from e2e.fleet.engine import SimEngine
from e2e.fleet.exposition import VllmMetrics
from e2e.fleet.players import player_for
from e2e.fleet.pod import (
    CRASHED,
    INSTANCE_LABEL,
    SERVING,
    STARTING,
    STOPPED,
    FleetEvent,
    MetricsServer,
    PodEngine,
    build_running_patch,
    container_env,
    free_port,
)
from e2e.fleet.real_engines import LAUNCHED, READY, RealEngines
from e2e.fleet.truth import EngineArgs, Scenario, Workload
from e2e.pods import termination_message

log = logging.getLogger("e2e.fleet")

MANAGED_SELECTOR = "app.kubernetes.io/managed-by=kvpilot"


def storm_workload(w: Workload) -> Workload:
    """A preemption storm: 4x the arrivals, 2x longer prompts, 8x longer outputs."""
    return dataclasses.replace(
        w,
        arrival_rate=w.arrival_rate * 4,
        prompt_tokens=w.prompt_tokens * 2,
        output_tokens=w.output_tokens * 8,
    )


# ---------------------------------------------------------------------------- the fleet


class Fleet:
    """Simulated vLLM containers for the kvpilot-managed pods of a cluster.

    :param kubeconfig: the cluster's kubeconfig (the ``kubernetes`` client and ``kubectl`` use it).
    :param targets_file: Prometheus ``file_sd`` JSON to write (``PrometheusServer.targets_file``).
    :param default_scenario: what pods of services without their own scenario get.
    :param namespaces: only these namespaces (default: all).
    :param tick: wall seconds between simulation steps.
    :param kubectl: kubectl binary for :mod:`e2e.pods` (default: the cluster's).
    """

    def __init__(
        self,
        kubeconfig: str | os.PathLike[str],
        targets_file: str | os.PathLike[str],
        *,
        default_scenario: Scenario | None = None,
        namespaces: Iterable[str] | None = None,
        label_selector: str = MANAGED_SELECTOR,
        tick: float = 0.25,
        poll: float = 0.5,
        kubectl: str | os.PathLike[str] | None = None,
        log_root: str | os.PathLike[str] | None = None,
    ) -> None:
        """``log_root``: where real engines' container logs go (default: ``pod-logs`` beside the targets)."""
        from kubernetes import client, config

        self.kubeconfig = str(kubeconfig)
        self.targets_file = Path(targets_file)
        self.default_scenario = default_scenario or Scenario()
        self.namespaces = set(namespaces) if namespaces else None
        self.label_selector = label_selector
        self.tick = tick
        self.poll = poll
        self.kubectl = str(kubectl) if kubectl else None
        self.logs_dir = self.targets_file.parent / "pod-logs"
        """Where crashed containers' logs are kept for KWOK to serve as previous logs."""
        self._api_client = config.new_client_from_config(config_file=self.kubeconfig)
        self.core = client.CoreV1Api(self._api_client)
        self._lock = threading.RLock()
        self._engines: dict[tuple[str, str], PodEngine] = {}
        self._gone: set[str] = set()  # pod uids already finished with
        self._caches = StartCaches()  # the weights and compiled graphs each volume holds
        self._scenarios: dict[tuple[str, str], Scenario] = {}
        self._overrides: dict[tuple[str, str], Workload] = {}
        self._patches: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.events: list[FleetEvent] = []
        self.errors: list[str] = []
        self._targets_dirty = True
        self._listeners: list[Callable[[FleetEvent], None]] = []
        self.real = RealEngines(
            Path(log_root) if log_root else self.targets_file.parent / "pod-logs", self.errors
        )

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Fleet:
        self._write_targets()
        for name, fn in (
            ("fleet-watch", self._watch_loop),
            ("fleet-sim", self._sim_loop),
            ("fleet-patch", self._patch_loop),
        ):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.real.stopping.set()
        self._patches.put(None)
        for t in self._threads:
            t.join(10)
        self._threads.clear()
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
        for e in engines:
            self._release(e)
        with contextlib.suppress(Exception):
            self._api_client.close()

    # ------------------------------------------------------------------ configuration
    def set_scenario(self, namespace: str, instance: str, scenario: Scenario) -> None:
        """Use ``scenario`` for the pods of InferenceService ``instance`` (``"*"``: whole namespace)."""
        with self._lock:
            self._scenarios[(namespace, instance)] = scenario
            for e in self._engines.values():
                if e.namespace == namespace and instance in ("*", e.instance):
                    e.scenario = scenario
                    if e.sim is not None:
                        e.sim.workload = self._workload_for(e)

    def use_real_engine(self, namespace: str, instance: str = "*") -> None:
        """Run the pods of InferenceService ``instance`` (``"*"``: the whole namespace) that start from now
        on as real vLLM engines (:mod:`e2e.vllm_cpu.engine_process`)."""
        self.real.add_service(namespace, instance)

    def add_namespace(self, namespace: str, scenario: Scenario | None = None) -> None:
        """Also play the pods of ``namespace`` (when constructed with ``namespaces``), with ``scenario``."""
        with self._lock:
            if self.namespaces is not None:
                self.namespaces.add(namespace)
            if scenario is not None:
                self._scenarios[(namespace, "*")] = scenario

    def scenario_for(self, namespace: str, instance: str) -> Scenario:
        with self._lock:
            return (
                self._scenarios.get((namespace, instance))
                or self._scenarios.get((namespace, "*"))
                or self.default_scenario
            )

    def inject(
        self,
        namespace: str,
        instance: str | None = None,
        *,
        pod: str | None = None,
        fault: str = "cuda_oom",
        workload: Workload | None = None,
    ) -> list[str]:
        """Inject a fault into the serving pods of a service (or one pod); returns the pods hit.

        ``cuda_oom``: the container dies now with CUDA OOM (once). ``preemption_storm``: the service's
        traffic becomes a storm (``workload``, default :func:`storm_workload` of the scenario's) until
        :meth:`clear_faults`.
        """
        if fault not in ("cuda_oom", "preemption_storm"):
            raise ValueError(f"unknown fault {fault!r}")
        hit: list[str] = []
        with self._lock:
            if fault == "preemption_storm":
                inst = instance or next((e.instance for e in self._engines.values() if e.name == pod), "")
                base = self.scenario_for(namespace, inst).workload
                self._overrides[(namespace, inst)] = workload or storm_workload(base)
            for e in self._engines.values():
                if (
                    e.namespace != namespace
                    or (instance and e.instance != instance)
                    or (pod and e.name != pod)
                ):
                    continue
                if fault == "cuda_oom":
                    if e.state == SERVING:
                        e.pending_fault = "cuda_oom"
                        hit.append(e.name)
                else:
                    if e.sim is not None:
                        e.sim.workload = self._workload_for(e)
                    hit.append(e.name)
                self._event(e, "Injected", fault)
        return hit

    def clear_faults(self, namespace: str, instance: str) -> None:
        with self._lock:
            self._overrides.pop((namespace, instance), None)
            for e in self._engines.values():
                if e.namespace == namespace and e.instance == instance and e.sim is not None:
                    e.sim.workload = self._workload_for(e)

    def _workload_for(self, e: PodEngine) -> Workload:
        return self._overrides.get((e.namespace, e.instance)) or e.scenario.workload

    def on_event(self, fn: Callable[[FleetEvent], None]) -> None:
        self._listeners.append(fn)

    # ------------------------------------------------------------------ inspection
    def pods(self, namespace: str | None = None, instance: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                e.snapshot()
                for e in self._engines.values()
                if (namespace is None or e.namespace == namespace)
                and (instance is None or e.instance == instance)
            ]

    def engine(self, namespace: str, pod: str) -> PodEngine | None:
        with self._lock:
            return self._engines.get((namespace, pod))

    def events_for(self, namespace: str, kind: str | None = None) -> list[FleetEvent]:
        with self._lock:
            return [
                ev for ev in self.events if ev.namespace == namespace and (kind is None or ev.kind == kind)
            ]

    def wait_for(self, cond: Callable[[], Any], *, timeout: float = 60.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            v = cond()
            if v:
                return v
            if self.errors:
                raise RuntimeError(f"fleet errors while waiting for {what}: {self.errors[-3:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}; pods: {self.pods()}")
            time.sleep(0.2)

    # ------------------------------------------------------------------ pods from the API server
    def _list_pods(self) -> list[dict[str, Any]]:
        if self.namespaces is None:
            resp = self.core.list_pod_for_all_namespaces(
                label_selector=self.label_selector, _preload_content=False, _request_timeout=10
            )
            return list(json.loads(resp.data)["items"])
        items: list[dict[str, Any]] = []
        with self._lock:
            namespaces = sorted(self.namespaces)
        for ns in namespaces:
            resp = self.core.list_namespaced_pod(
                ns, label_selector=self.label_selector, _preload_content=False, _request_timeout=10
            )
            items += json.loads(resp.data)["items"]
        return items

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync(self._list_pods())
            except Exception as e:  # the API server may be restarting; retry
                log.debug("listing pods failed: %s", e)
            self._stop.wait(self.poll)

    def _sync(self, items: list[dict[str, Any]]) -> None:
        seen: set[tuple[str, str]] = set()
        for pod in items:
            md = pod["metadata"]
            key = (md["namespace"], md["name"])
            running = (
                pod.get("status", {}).get("phase") == "Running"
                and not md.get("deletionTimestamp")
                and pod["spec"].get("nodeName")
            )
            if not running:
                continue
            seen.add(key)
            with self._lock:
                if key in self._engines or md.get("uid") in self._gone:
                    continue
                c = pod["spec"]["containers"][0]
                argv = [*(c.get("command") or []), *(c.get("args") or [])]
                scenario = self.scenario_for(
                    md["namespace"], (md.get("labels") or {}).get(INSTANCE_LABEL, "")
                )
                player = player_for(argv, c.get("image", ""), container_env(c, md.get("labels") or {}))
                view = player.engine_view(scenario.truth) if player is not None else EngineArgs.parse(argv)
                e = PodEngine(pod, view, scenario, free_port(), player=player)
                args = e.args
                self.real.adopt(e)
                self._engines[key] = e
                self._targets_dirty = True
                self._begin_start(e)
                self._event(e, "Started", f"{args.summary()} {self._sources(e)}")
            self._patch_async(e, ready=False)
        with self._lock:
            for key in [k for k in self._engines if k not in seen]:
                e = self._engines.pop(key)
                e.state = STOPPED
                self._gone.add(e.uid)
                self._targets_dirty = True
                self._event(e, "Gone", "pod deleted")
                threading.Thread(target=self._release, args=(e,), daemon=True).start()

    # ------------------------------------------------------------------ simulation
    def _sim_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            dt_wall, last = now - last, now
            try:
                with self._lock:
                    engines = list(self._engines.values())
                for e in engines:
                    self._step(e, now, dt_wall)
                if self._targets_dirty:
                    self._write_targets()
            except Exception as exc:  # a bug in the simulator: record it, tests fail on it
                log.exception("fleet simulation step failed")
                self.errors.append(repr(exc))
            self._stop.wait(self.tick)

    def _begin_start(self, e: PodEngine) -> None:
        """A container (re)starts: its start-up time follows from where the weights come from and whether
        its compiled graphs are on its compile-cache volume (:class:`e2e.fleet.caches.StartCaches`). An SGLang
        or TGI container sizes its KV cache again from the scenario's memory figures
        (:mod:`e2e.fleet.players`)."""
        if e.player is not None:
            e.args = e.player.engine_view(e.scenario.truth)
            e.log_lines = []
        with self._lock:
            found = self._caches.compute_sources(e.args, e.cache_key, e.compile_cache_key)
        e.cache_hit, e.compile_hit = found.weights_cached, found.compile_cached
        e.startup_wall_s = e.scenario.truth.startup_wall_s(
            cached=e.cache_hit,
            compile_cached=e.compile_hit,
            streamer=e.args.load_format == "runai_streamer",  # vLLM's LoadFormat name, as the pod gives it,
        )

    @staticmethod
    def _sources(e: PodEngine) -> str:
        return StartSources(e.cache_hit, e.compile_hit).describe(e.cache_key)

    def weight_cache_holds(self, cache_key: str, model: str) -> bool:
        """Whether a weight cache (:func:`e2e.fleet.pod.read_weight_cache`'s key) holds ``model``."""
        with self._lock:
            return self._caches.holds_weights(cache_key, model)

    def _step(self, e: PodEngine, now: float, dt_wall: float) -> None:
        truth = e.scenario.truth
        if e.real_engine and e.state in (STARTING, SERVING):
            self._step_real(e, now)
        elif e.state == STARTING and now - e.since >= e.startup_wall_s:
            with self._lock:  # the download and the compile finished: the next start reads them from disk
                self._caches.record_start(e.args, e.cache_key, e.compile_cache_key)
            if e.player is not None:
                self._start_player(e, now)
                return
            error = truth.startup_error(e.args)
            if e.args.headless:
                self._serve_headless(e, now)
            elif error is not None:
                log = truth.startup_failure_log(e.args, error)
                self._crash(e, "StartupFailed", truth.startup_failure_message(e.args, error), now, log=log)
            elif truth.startup_oom(e.args):
                self._crash(e, "StartupCudaOOM", truth.cuda_oom_message(e.args, startup=True), now)
            else:
                self._serve(e, now)
        elif e.state == SERVING and e.args.headless:
            return  # a group's worker: its ranks' load and faults are the leader's to report
        elif e.state == SERVING:
            assert e.sim is not None and e.metrics is not None
            wl = self._workload_for(e)
            e.sim.workload = wl
            e.sim.advance(dt_wall * wl.time_scale)
            if e.player is not None:
                used = e.player.framebuffer_used_gib(truth)
            else:
                used = truth.framebuffer_used_gib(e.args, e.sim.num_running, (now - e.since) * wl.time_scale)
            deltas = e.sim.drain()
            e.metrics.record(
                running=e.sim.num_running,
                waiting=e.sim.num_waiting,
                kv_usage=e.sim.kv_usage,
                deltas=deltas,
                fb_used_gib=used,
            )
            if e.player is not None:
                e.log_lines += e.player.batch_lines(truth, e.sim.num_running, e.sim.kv_usage)
                e.log_lines += e.player.pressure_lines(deltas)
                del e.log_lines[1:-200]  # keep the start-up summary and the last warnings
                self._serving_player(e, now)
                return
            if truth.fb_leak_max_gib > 0 and used > truth.gpu_memory_gib:
                self._crash(e, "CudaOOM", truth.cuda_oom_message(e.args), now)
                return
            if e.pending_fault == "cuda_oom":
                e.pending_fault = None
                self._crash(e, "CudaOOM", truth.cuda_oom_message(e.args), now)
            elif truth.runtime_oom(e.args) and now - e.since >= truth.oom_after_s:
                self._crash(e, "CudaOOM", truth.cuda_oom_message(e.args), now)
        elif e.state == CRASHED and now >= e.restart_at:
            e.state, e.since = STARTING, now
            self._begin_start(e)
            self._event(e, "Restarted", f"restartCount={e.restart_count} {self._sources(e)}")
            self._patch_async(e, ready=False)

    def _start_player(self, e: PodEngine, now: float) -> None:
        """An SGLang or TGI container finished loading: its KV cache is sized (or the sizing fails, and the
        container stops with the engine's log), then it serves."""
        assert e.player is not None
        truth = e.scenario.truth
        log = e.player.startup_failure_log(truth)
        if log is not None:
            self._crash(e, "StartupFailed", termination_message(log), now, log=log)
            return
        if e.args.headless:  # a group's rank >= 1: schedulers only, no HTTP server
            self._serve_headless(e, now)
            return
        e.log_lines = [e.player.serving_log(truth)]
        self._serve(e, now)

    def _serving_player(self, e: PodEngine, now: float) -> None:
        """An injected or scenario CUDA OOM of a serving SGLang or TGI container."""
        assert e.player is not None
        truth = e.scenario.truth
        oom = e.pending_fault == "cuda_oom" or (
            e.player.runtime_oom(truth) and now - e.since >= truth.oom_after_s
        )
        if oom:
            e.pending_fault = None
            running = e.sim.num_running if e.sim is not None else 0
            log = "\n".join([*e.log_lines, *e.player.cuda_oom_lines(truth, running)])
            self._crash(e, "CudaOOM", termination_message(log), now, log=log)

    def _serve(self, e: PodEngine, now: float) -> None:
        e.started_count += 1
        truth, player = e.scenario.truth, e.player
        seed = e.scenario.seed * 1000 + e.started_count + zlib.crc32(e.name.encode()) % 997
        if player is None:
            e.sim = SimEngine(truth, self._workload_for(e), e.args, seed=seed)
            e.metrics = VllmMetrics(truth, e.args, naming=e.scenario.naming)
        else:
            e.sim = player.simulate(truth, self._workload_for(e), e.args, seed)
            e.metrics = player.metrics(truth)
        try:
            e.server = MetricsServer(e.port, e.render)
        except OSError:  # the port was taken meanwhile: move
            e.port = free_port()
            e.server = MetricsServer(e.port, e.render)
            self._targets_dirty = True
        threading.Thread(
            target=e.server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"metrics-{e.name}",
            daemon=True,
        ).start()
        e.state, e.since = SERVING, now
        self._event(
            e,
            "Serving",
            f"port {e.port}, {e.sim.num_blocks} KV blocks ({truth.kv_tokens(e.args)} tokens)"
            if player is None
            else f"port {e.port}, {player.summary(truth)}",
        )
        self._patch_async(e, ready=True)

    def _serve_headless(self, e: PodEngine, now: float) -> None:
        """A multi-node group's worker (``--headless``): Ready once loaded, with no API server, so no port and
        no ``/metrics`` target (vLLM's headless nodes run engine ranks only; the leader serves)."""
        e.started_count += 1
        e.state, e.since = SERVING, now
        self._targets_dirty = True
        self._event(e, "Serving", "headless: engine ranks only, no API server")
        self._patch_async(e, ready=True)

    # ------------------------------------------------------------------ real engines
    def _step_real(self, e: PodEngine, now: float) -> None:
        """A real engine's container (:mod:`e2e.fleet.real_engines`): launched, Ready on ``/health``, or
        exited (a crash with its exit code and kubelet's tail of its log)."""
        outcome = self.real.poll(e, now)
        if outcome == LAUNCHED:
            launch = self.real.launched(e)
            if launch is not None and e.process is not None:
                blocks = f"{launch.num_blocks} blocks of {launch.block_size}"
                self._event(e, "Launched", f"pid {e.process.pid}, {blocks}, log {e.log_file()}")
        elif outcome == READY and e.state == STARTING and e.process is not None:
            e.state, e.since = SERVING, now
            e.started_count += 1
            took = e.process.startup_seconds or 0.0
            self._event(
                e, "Serving", f"port {e.port}, real engine pid {e.process.pid}, {took:.1f} s to /health"
            )
            self._patch_async(e, ready=True)
        elif isinstance(outcome, int) and e.process is not None:
            kind = "StartupFailed" if e.state == STARTING else "EngineExited"
            log = e.process.log_path.read_text(errors="replace")  # the real log, served as the previous log
            self._crash(e, kind, e.process.termination_message(), now, exit_code=outcome, log=log)

    def _release(self, e: PodEngine) -> None:
        self._close_server(e, wait=True)
        self.real.release(e, wait=True)

    def _crash(
        self, e: PodEngine, kind: str, message: str, now: float, *, exit_code: int = 1, log: str | None = None
    ) -> None:
        """Report a crash as kubelet would: ``message`` is the termination message, ``log`` the exited
        container's whole log (``message`` when not given), served as its previous log."""
        self._close_server(e, wait=False)
        self.real.release(e, wait=False)  # a real engine exited: reap what is left of its process group
        e.sim = None
        e.metrics = None
        e.restart_count += 1
        e.crashes.append((time.time(), kind, message))
        e.last_message = message
        backoff = e.scenario.truth.backoff_s * 2 ** min(e.restart_count - 1, 3)
        e.state, e.since, e.restart_at = CRASHED, now, now + backoff
        log = log if log is not None else message
        lines = log.strip().splitlines()
        self._event(
            e,
            kind,
            next(
                (
                    x
                    for x in reversed(lines)
                    if x.startswith(("ValueError", "RuntimeError", "torch.", "Error: Backend"))
                ),
                lines[-1],
            )[:200],
        )
        count, ns, name = e.restart_count, e.namespace, e.name

        def patch() -> None:
            from e2e import pods

            pods.serve_previous_log(
                self.kubeconfig, ns, name, e.container, log, self.logs_dir, kubectl=self.kubectl
            )
            pods.simulate_container_crash(
                self.kubeconfig,
                ns,
                name,
                exit_code=exit_code,
                message=message,
                restart_count=count,
                container=e.container,
                kubectl=self.kubectl,
                timeout=15,
            )

        self._patches.put(patch)

    def _close_server(self, e: PodEngine, wait: bool) -> None:
        srv, e.server = e.server, None
        if srv is None:
            return

        def close() -> None:
            srv.shutdown()
            srv.server_close()

        if wait:
            close()
        else:
            threading.Thread(target=close, daemon=True).start()

    # ------------------------------------------------------------------ pod status, as kubelet
    def _patch_async(self, e: PodEngine, *, ready: bool) -> None:
        ns, name, container, image, uid = e.namespace, e.name, e.container, e.image, e.uid
        restarts = e.restart_count

        def patch() -> None:
            resp = self.core.read_namespaced_pod(name, ns, _preload_content=False, _request_timeout=10)
            pod = json.loads(resp.data)
            if pod["metadata"].get("uid") != uid or pod["metadata"].get("deletionTimestamp"):
                return
            body = build_running_patch(pod, container, image, restarts, ready=ready)
            self.core.patch_namespaced_pod_status(
                name, ns, body, _content_type="application/merge-patch+json", _request_timeout=10
            )

        self._patches.put(patch)

    def _patch_loop(self) -> None:
        while True:
            fn = self._patches.get()
            if fn is None or self._stop.is_set():
                return
            try:
                fn()
            except Exception as exc:
                msg = str(exc)
                if "NotFound" in msg or "not found" in msg or "404" in msg:
                    continue  # the pod went away meanwhile
                log.warning("pod status patch failed: %s", msg[:300])

    # ------------------------------------------------------------------ targets file
    def _write_targets(self) -> None:
        from e2e.prometheus import write_targets_file

        with self._lock:
            self._targets_dirty = False
            engines = sorted(self._engines.values(), key=lambda x: x.key)
            groups = [e.target_group() for e in engines if not e.args.headless]
        self.targets_file.parent.mkdir(parents=True, exist_ok=True)
        write_targets_file(self.targets_file, groups)

    # ------------------------------------------------------------------ events
    def _event(self, e: PodEngine, kind: str, detail: str = "") -> None:
        ev = FleetEvent(time.time(), e.namespace, e.name, kind, detail)
        self.events.append(ev)
        log.info("%s/%s %s %s", e.namespace, e.name, kind, detail)
        for fn in self._listeners:
            with contextlib.suppress(Exception):
                fn(ev)

"""One InferenceService's pods in simulation: the fleet's engine model behind a Deployment.

Each pod that runs is the fleet's :class:`e2e.fleet.engine.SimEngine` with the fleet's ground truth
(start-up failures with vLLM's texts, CUDA OOM with the running batch, start-up time; or, for a scenario
whose ``engine`` is ``sglang``, SGLang's pool, texts and failures: :mod:`bench.loopsim.physics`), so the
bench, the e2e fleet and the demo judge kvpilot in one world. The Deployment around it:

* a GPU per pod; a pod that finds none stays Pending (a full pool);
* ``surge``: the new pod starts beside the old one, which goes when the new one serves;
  ``recreate``: the old pod goes first (downtime until the new one serves);
* a crash is CrashLoopBackOff (10 s doubling to 5 min), its requests lost;
* with ``compile_cache`` (vLLM's compile cache on the model's volume), a start whose compile hash a start
  before it reached (served, or failed its KV check after compiling) loads the graphs: the fleet's
  :class:`e2e.fleet.caches.StartCaches` and the warm term of its start-up model;
* a pod that goes gracefully (a rollout's old pod) finishes its running requests; its waiting ones go
  back to the load balancer (clients retry), which hands them to the serving pod at once, or to the next
  pod to serve when none does (recreate), their wait carried over;
* clients give up on a request that waited :data:`MAX_WAIT_S` without being scheduled.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from bench.loopsim.physics import Physics, engine_args, physics_for
from bench.loopsim.scenario import BenchScenario, Settings
from e2e.fleet.caches import StartCaches
from e2e.fleet.engine import Request, SimEngine
from kvpilot.tuner.loop import LengthSummary, MetricsSample, ObservationWindow
from kvpilot.tuner.types import EngineSettings

__all__ = ["DT", "MAX_WAIT_S", "Handoff", "Pod", "Stats", "World", "engine_args"]

DT = 10.0
"""Simulated seconds per world step (and per metrics sample)."""
COMPILE_VOLUME = "model-storage"
"""The one volume every pod of the service mounts for vLLM's caches (``spec.model.storage``: a claim)."""
START_FAIL_AFTER_S = 60.0
"""From container start to a start-up failure (load + profile)."""
RESOLUTION_S = 0.5
"""The engine model's time resolution in the bench (decode taken up to half a second at once)."""
MAX_WAIT_S = 120.0
"""Clients time out a request not scheduled after this long."""


@dataclass
class Pod:
    name: str
    settings: Settings
    state: str = "pending"  # pending | starting | failing | serving | backoff
    until: float = 0.0
    restarts: int = 0
    last: tuple[float, str, str, int] | None = None
    """(finished at, message, reason, exit code) of the last termination."""
    error: str | None = None
    engine: SimEngine | None = None
    started_at: float | None = None
    ready_at: float | None = None


@dataclass
class Stats:
    crashes: int = 0
    ooms: int = 0
    injected_ooms: int = 0
    """Of ``ooms``, those the scenario's ``cuda_oom`` faults caused (another process on the GPU)."""
    downtime_s: float = 0.0
    output_tokens: float = 0.0
    completed: int = 0
    arrived: float = 0.0
    dropped: float = 0.0
    refused: int = 0
    """Requests an admission limit answered at arrival (TGI's 429 "Model is overloaded"): arrived, never
    served (counted in ``arrived``, not in ``dropped``)."""
    preemptions: int = 0
    ttfts: list[float] = field(default_factory=list)
    rollouts: int = 0
    rollbacks: int = 0
    holds: int = 0
    infeasible: int = 0
    failed_never_ran: int = 0


@dataclass(frozen=True)
class Counts:
    """What one pod's engine counted over a world step (a metrics sample's counter rates)."""

    preemptions: int = 0
    refused: int = 0
    """Requests the router refused (TGI's 429s; 0 for engines without an admission limit)."""


@dataclass(frozen=True)
class Handoff:
    """A request a removed pod had waiting, with the clocks it waited by."""

    request: Request
    engine_now: float
    """The removed pod's engine clock at its removal (the request's times are on that clock)."""
    removed_at: float
    """World time of the removal."""

    def rebase(self, engine_now: float, now: float) -> Request:
        """The request on another engine's clock (``engine_now`` at world time ``now``), its wait kept."""
        shift = engine_now - self.engine_now - (now - self.removed_at)
        req = self.request
        req.arrived += shift
        if req.scheduled_at is not None:
            req.scheduled_at += shift
        if req.first_token_at is not None:
            req.first_token_at += shift
        return req


@dataclass
class World:
    scenario: BenchScenario
    seed: int = 0
    pods: list[Pod] = field(default_factory=list)
    desired: Settings = EngineSettings()
    stats: Stats = field(default_factory=Stats)
    samples: list[MetricsSample] = field(default_factory=list)
    ran: set[Settings] = field(default_factory=set)
    """Settings some container actually started with."""
    serial: int = 0
    rng: random.Random = field(default_factory=random.Random)
    handoff: list[Handoff] = field(default_factory=list)
    """Requests a removed pod had not scheduled yet: the serving pod takes them (:meth:`_deliver_handoff`)."""
    caches: StartCaches = field(default_factory=StartCaches)
    """The compiled graphs on the service's volume (one volume for every pod, as a claim gives them)."""
    warm_starts: int = 0

    def __post_init__(self) -> None:
        self.rng.seed(self.seed)
        self._faults = sorted(self.scenario.faults, key=lambda f: f.at_s)
        self.physics: Physics = physics_for(self.scenario.engine, self.scenario.truth)

    @property
    def gpus(self) -> int:
        return 1 + int(self.scenario.spare_gpu)

    # ------------------------------------------------------------------ the Deployment
    def roll_out(self, settings: Settings, now: float, *, strategy: str) -> None:
        """A Deployment update with ``settings`` (``surge`` or ``recreate``)."""
        self.desired = settings
        # the Deployment controller scales unavailable pods of older ReplicaSets down first: a pod that
        # serves nothing (crash loop, start-up failure, pending) never holds a GPU against the new one
        for p in [p for p in self.pods if p.settings != settings and p.state != "serving"]:
            self._remove(p, now)
            self.pods.remove(p)
        if strategy == "recreate":
            for p in self.pods:
                self._remove(p, now)
            self.pods = []
        if not any(p.settings == settings for p in self.pods):
            self.serial += 1
            self.pods.append(Pod(f"svc-{self.serial:04x}", settings))
        self._schedule(now)

    def _schedule(self, now: float) -> None:
        used = sum(1 for p in self.pods if p.state != "pending")
        for p in self.pods:
            if p.state == "pending" and used < self.gpus:
                used += 1
                self._boot(p, now)

    def _boot(self, pod: Pod, now: float) -> None:
        truth, args = self.scenario.truth, self.physics.view(pod.settings)
        self.ran.add(pod.settings)
        pod.started_at, pod.ready_at, pod.engine = now, None, None
        failure = self.physics.start_failure(pod.settings)
        volume = COMPILE_VOLUME if self.scenario.compile_cache else None
        compile_cached = self.caches.compute_sources(args, None, volume).compile_cached
        if failure is not None:
            if not failure.oom:
                self.caches.record_start(args, None, volume)  # the profile run compiled before the KV check
            # what the operator classifies: the previous log
            pod.state, pod.until, pod.error = "failing", now + START_FAIL_AFTER_S, failure.log
        else:
            seconds = (
                truth.startup.simulated_seconds(
                    cached=self.scenario.weights_cached, compile_cached=compile_cached
                )
                if truth.startup.checkpoint_gib
                else truth.startup_s
            )
            self.warm_starts += compile_cached
            pod.state, pod.until = "starting", now + seconds

    def _crash(self, pod: Pod, now: float, message: str, *, oom: bool) -> None:
        self.stats.crashes += 1
        self.stats.ooms += oom
        pod.restarts += 1
        pod.last = (now, message, "Error", 1)
        if pod.engine is not None:
            self.stats.dropped += pod.engine.num_running + pod.engine.num_waiting
            self._count(pod.engine)
        pod.engine = None
        pod.state, pod.until = "backoff", now + min(300.0, 10.0 * 2 ** (pod.restarts - 1))

    def _remove(self, pod: Pod, now: float) -> None:
        """A graceful stop: the running requests drain (counted as served), the waiting ones go back to the
        load balancer (:attr:`handoff`)."""
        e = pod.engine
        if e is not None:
            self._count(e)
            for req in e.running:
                self.stats.completed += 1
                self.stats.output_tokens += req.output
            self.handoff.extend(Handoff(req, e.now, now) for req in e.waiting)
            e.waiting.clear()

    def _deliver_handoff(self, e: SimEngine, now: float) -> None:
        """The requests removed pods had waiting join the front of ``e``'s queue (they arrived first), their
        wait carried over: clients still give up after :data:`MAX_WAIT_S` in all."""
        if self.handoff:
            e.take_over([h.rebase(e.now, now) for h in self.handoff])
            self.handoff = []

    def _count(self, e: SimEngine) -> Counts:
        """Take what ``e`` finished since the last call into the stats; returns its preemptions, refusals."""
        d = e.drain()
        self.stats.preemptions += d.preemptions
        self.stats.refused += d.refused
        self.stats.arrived += d.refused  # the engine's own count of arrivals leaves the refused out
        for f in d.finished:
            self.stats.completed += 1
            self.stats.output_tokens += f.generation_tokens
            self.stats.ttfts.append(f.ttft_s)
        return Counts(d.preemptions, d.refused)

    # ------------------------------------------------------------------ time
    def step(self, now: float) -> None:
        sc, truth = self.scenario, self.scenario.truth
        workload = sc.workload_at(now)
        for pod in list(self.pods):
            if pod.state == "failing" and now >= pod.until:
                self._crash(pod, now, pod.error or "", oom="OutOfMemoryError" in (pod.error or ""))
            elif pod.state == "backoff" and now >= pod.until:
                self._boot(pod, now)
            elif pod.state == "starting" and now >= pod.until:
                pod.state, pod.ready_at = "serving", now
                self.caches.record_start(
                    self.physics.view(pod.settings), None, COMPILE_VOLUME if sc.compile_cache else None
                )
                pod.engine = SimEngine(
                    truth,
                    workload,
                    self.physics.view(pod.settings),
                    seed=self.seed * 7919 + self.serial,
                    resolution_s=RESOLUTION_S,
                    num_gpu_blocks=self.physics.num_blocks(pod.settings),
                    admission_limit=self.physics.admission_limit(pod.settings),
                )
        mine = [p for p in self.pods if p.settings == self.desired]
        if any(p.state == "serving" for p in mine):  # rollout done: the old pods go
            for p in self.pods:
                if p not in mine:
                    self._remove(p, now)
            self.pods = mine
        self._schedule(now)
        serving = [p for p in self.pods if p.state == "serving"]
        if not serving:
            self.stats.downtime_s += DT
            self.stats.arrived += workload.arrival_rate * DT
            self.stats.dropped += workload.arrival_rate * DT
            self.samples.append(MetricsSample(now))
            return
        pod = serving[-1]
        e = pod.engine
        assert e is not None
        e.workload = workload
        self._deliver_handoff(e, now)
        before = e.total_arrived
        e.advance(DT)
        self.stats.arrived += e.total_arrived - before
        self.stats.dropped += e.drop_stale(MAX_WAIT_S)
        counts = self._count(e)
        if self._faults and self._faults[0].kind == "cuda_oom" and now >= self._faults[0].at_s:
            self._faults.pop(0)
            self.stats.injected_ooms += 1
            self._crash(pod, now, self.physics.oom_message(pod.settings, e.num_running, e.kv_usage), oom=True)
        elif self.physics.runtime_oom(pod.settings, e.num_running):
            self._crash(pod, now, self.physics.oom_message(pod.settings, e.num_running, e.kv_usage), oom=True)
        if pod.engine is None:  # it crashed: the scrape finds no target (its batch never ran to this size)
            self.samples.append(MetricsSample(now))
            return
        used = self.physics.framebuffer_used_gib(
            pod.settings, e.num_running, now - (pod.ready_at if pod.ready_at is not None else now)
        )
        self.samples.append(self._sample(now, e.kv_usage, counts, e.num_running, e.num_waiting, used))

    def _sample(
        self, now: float, kv: float, counts: Counts, running: float, waiting: float, fb_used_gib: float
    ) -> MetricsSample:
        """One scrape: the engine's gauges in the seam's meanings (with the scenario's noise and gaps) and
        dcgm-exporter's framebuffer of the serving pod's GPU (``DCGM_FI_DEV_FB_USED``/``FREE``), as the e2e
        fleet serves them. ``counts``: the step's counters as rates per second; a counter rate of
        :class:`MetricsSample` is one entry of ``rates`` (``rejected_rate``: TGI's 429s,
        ``counts.refused / DT``; engines without an admission limit export none: left unset)."""
        preempt = counts.preemptions / DT
        rates: dict[str, float] = {}
        if self.scenario.engine == "tgi":  # the router's 429s, as kvpilot reads tgi_request_failure's rate
            rates["rejected_rate"] = counts.refused / DT
        total = self.scenario.truth.gpu_memory_gib
        sc = self.scenario
        if self._fault_active("prometheus_down", now):
            return MetricsSample(now)
        if sc.missing and self.rng.random() < sc.missing:
            return MetricsSample(now)
        if sc.noise:
            n = lambda v: max(0.0, v * (1 + self.rng.gauss(0, sc.noise)))  # noqa: E731
            kv, running, waiting = min(1.0, n(kv)), n(running), n(waiting)
        fb = {"gpu_memory_used_gib": fb_used_gib, "gpu_memory_free_gib": max(0.0, total - fb_used_gib)}
        if self._fault_active("metrics_missing", now):
            return MetricsSample(now, None, preempt, running, waiting, **fb, **rates)
        return MetricsSample(now, kv, preempt, running, waiting, **fb, **rates)

    def _fault_active(self, kind: str, now: float) -> bool:
        return any(f.kind == kind and f.at_s <= now < f.at_s + f.for_s for f in self.scenario.faults)

    def prometheus_up(self, now: float) -> bool:
        return not self._fault_active("prometheus_down", now)

    def observe(self, now: float, window_seconds: float, **reported: Any) -> ObservationWindow:
        """What the loop's Prometheus query returns at ``now``: the last ``window_seconds`` of scrapes with a
        KV (token) usage, the phase's mean lengths and the pod count, with what the engine ``reported``
        (its capacity, utilisation, KV dtype); unavailable while Prometheus is down or before a sample."""
        recent = tuple(s for s in self.samples if s.time > now - window_seconds and s.kv_usage is not None)
        if not recent or not self.prometheus_up(now):
            return ObservationWindow.unavailable("no samples", now)
        load = self.scenario.workload_at(now)
        return ObservationWindow(
            now - window_seconds,
            now,
            recent,
            LengthSummary(load.prompt_tokens),
            LengthSummary(load.output_tokens),
            pods=len(self.pods),
            **reported,
        )

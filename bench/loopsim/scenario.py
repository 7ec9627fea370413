"""A closed-loop scenario as data: the schema of ``bench/scenarios/*.json`` (see its README.md).

A scenario states the world (the GPU and model's ground truth, in the fleet's own terms:
:class:`e2e.fleet.truth.GroundTruth`), the traffic as phases of an arrival process with length
distributions, faults, whether a spare GPU exists, and what kvpilot starts from (the planner's settings
and the budget it believed). Nothing in it comes from kvpilot's memory model.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from e2e.fleet.truth import GroundTruth, Scenario, Workload
from kvpilot.tuner import sglang, tgi
from kvpilot.tuner.loop import TuningBounds
from kvpilot.tuner.types import GIB, EngineSettings, MemoryBudget

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios"
FAULT_KINDS = ("cuda_oom", "prometheus_down", "metrics_missing")
ENGINES = ("vllm", "sglang", "tgi")
Settings = EngineSettings | sglang.SglangSettings | tgi.TgiSettings
"""What a pod of a bench run runs: vLLM's settings, SGLang's flags, or TGI's launcher flags."""


@dataclasses.dataclass(frozen=True)
class SglangPlan:
    """What kvpilot starts an SGLang scenario from: the flags ``kvpilot plan --engine sglang`` renders for
    the catalogue ``model`` on ``gpu`` with ``max_context`` and ``concurrency`` (``--max-context``,
    ``--concurrency``), as the scenario states them, and the inputs to check them against the planner
    (``tests/bench/test_loopsim_sglang.py``)."""

    model: str
    gpu: str
    settings: sglang.SglangSettings
    max_context: int | None = None
    concurrency: int | None = None


@dataclasses.dataclass(frozen=True)
class TgiPlan:
    """What kvpilot starts a TGI scenario from: the launcher flags ``kvpilot plan --engine tgi`` renders for
    the catalogue ``model`` on ``gpu`` with ``max_context`` and ``concurrency``, as the scenario states them
    (``tests/bench/test_loopsim_tgi.py`` checks them against the planner)."""

    model: str
    gpu: str
    settings: tgi.TgiSettings
    max_context: int | None = None
    concurrency: int | None = None


@dataclasses.dataclass(frozen=True)
class Phase:
    start_s: float
    workload: Workload


@dataclasses.dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    """``cuda_oom``: the serving pod dies once with the torch OOM text; ``prometheus_down``: no samples
    for ``for_s``; ``metrics_missing``: samples without the KV series for ``for_s``."""
    for_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class BenchScenario:
    name: str
    what: str
    truth: GroundTruth
    phases: tuple[Phase, ...]
    planned: EngineSettings
    plan_budget: MemoryBudget | None
    """vLLM: what the planner believed (``None`` for SGLang, whose loop asks its own memory model)."""
    bounds: TuningBounds = TuningBounds()
    hours: float = 3.0
    spare_gpu: bool = True
    """Whether a GPU is free for a surge pod (a full pool: ``false``)."""
    allow_downtime: bool = False
    """``spec.rollout.allowDowntime``: with no spare GPU and one replica, recreate (else hold)."""
    weights_cached: bool = True
    """Whether every start finds the checkpoint in a weight cache (only ``truth.startup``'s load and engine
    start-up); ``false`` (an ``emptyDir`` cache, a fresh node each time): every start downloads it too."""
    compile_cache: bool = False
    """Whether the pods keep vLLM's compile cache on a persistent volume (``spec.model.storage`` a claim):
    a start whose compile hash an earlier start reached loads the graphs (:attr:`StartupModel.warm_compile_s`
    instead of ``compile_s``), and kvpilot is told so (``Evidence.compile_cache_persistent``)."""
    faults: tuple[Fault, ...] = ()
    noise: float = 0.0
    """Relative noise on each metrics sample (KV usage, queue, running)."""
    missing: float = 0.0
    """Share of samples that are missing (a scrape that failed)."""
    engine: str = "vllm"
    """``vllm``, ``sglang`` or ``tgi``: which engine the pods run and which of kvpilot's loops tunes them."""
    sglang_plan: SglangPlan | None = None
    """SGLang: the plan (``planned`` and ``plan_budget`` are vLLM's and unused)."""
    tgi_plan: TgiPlan | None = None
    """TGI: the plan (``planned`` and ``plan_budget`` are vLLM's and unused)."""
    source: Path | None = None

    @property
    def start(self) -> Settings:
        """What kvpilot's plan starts the pods with, in the engine's own settings."""
        if self.sglang_plan is not None:
            return self.sglang_plan.settings
        if self.tgi_plan is not None:
            return self.tgi_plan.settings
        return self.planned

    @property
    def planned_context(self) -> int | None:
        """The plan's context (``None``: the model's own)."""
        if self.sglang_plan is not None:
            return self.sglang_plan.settings.context_length
        if self.tgi_plan is not None:
            return self.tgi_plan.settings.max_total_tokens
        return self.planned.max_model_len

    def workload_at(self, t: float) -> Workload:
        current = self.phases[0].workload
        for phase in self.phases:
            if phase.start_s <= t:
                current = phase.workload
        return current

    def fleet_scenario(self, seed: int = 0) -> Scenario:
        return Scenario(truth=self.truth, workload=self.phases[0].workload, seed=seed, name=self.name)


class ScenarioError(ValueError):
    """A scenario file that does not follow the schema: says which file and field."""


def _settings(d: dict[str, Any]) -> EngineSettings:
    return EngineSettings(**d)


def _budget(d: dict[str, Any], gpu_total_gib: float) -> MemoryBudget:
    tokens = int(d["kv_cache_tokens"])
    kv_bytes = int(d.get("kv_bytes_per_token", 131072))
    return MemoryBudget(
        gpu_total_gib=gpu_total_gib,
        requested_gib=float(d.get("requested_gib", 72.85)),
        weights_gib=float(d.get("weights_gib", 14.99)),
        activation_gib=float(d.get("activation_gib", 3.0)),
        non_torch_gib=float(d.get("non_torch_gib", 0.6)),
        cuda_graph_gib=float(d.get("cuda_graph_gib", 0.5)),
        available_kv_cache_gib=tokens * kv_bytes / GIB,
        kv_bytes_per_token=kv_bytes,
        num_gpu_blocks=tokens // 16,
        kv_cache_tokens=tokens,
        max_concurrency=tokens / 32768,
        starts=True,
    )


def _sglang_plan(d: dict[str, Any]) -> SglangPlan:
    planner = d.get("planner", {})
    return SglangPlan(
        model=str(planner["model"]),
        gpu=str(planner.get("gpu", "H100-SXM")),
        settings=sglang.SglangSettings(**d["sglang"]),
        max_context=planner.get("max_context"),
        concurrency=planner.get("concurrency"),
    )


def _tgi_plan(d: dict[str, Any]) -> TgiPlan:
    planner = d.get("planner", {})
    return TgiPlan(
        model=str(planner["model"]),
        gpu=str(planner.get("gpu", "H100-SXM")),
        settings=tgi.TgiSettings(**d["tgi"]),
        max_context=planner.get("max_context"),
        concurrency=planner.get("concurrency"),
    )


def load_scenario(path: Path) -> BenchScenario:
    try:
        d = json.loads(path.read_text())
        engine = str(d.get("engine", "vllm"))
        if engine not in ENGINES:
            raise ScenarioError(f"{path.name}: engine: {engine!r} is not one of {ENGINES}")
        truth_d = dict(d["truth"])
        truth = Scenario.from_dict({"truth": truth_d}).truth
        phases = tuple(
            Phase(float(p.get("start_s", 0.0)), Workload(**{k: v for k, v in p.items() if k != "start_s"}))
            for p in d["load"]
        )
        if not phases or phases[0].start_s != 0:
            raise ScenarioError(f"{path.name}: load: the first phase must start at 0")
        faults = tuple(Fault(**f) for f in d.get("faults", ()))
        for f in faults:
            if f.kind not in FAULT_KINDS:
                raise ScenarioError(f"{path.name}: faults: kind {f.kind!r} is not one of {FAULT_KINDS}")
        return BenchScenario(
            name=d["name"],
            what=d["what"],
            truth=truth,
            phases=phases,
            planned=_settings(d["plan"]["settings"]) if engine == "vllm" else EngineSettings(),
            plan_budget=_budget(d["plan"]["budget"], truth.gpu_memory_gib) if engine == "vllm" else None,
            bounds=TuningBounds(**d.get("bounds", {})),
            hours=float(d.get("hours", 3.0)),
            spare_gpu=bool(d.get("spare_gpu", True)),
            allow_downtime=bool(d.get("allow_downtime", False)),
            weights_cached=bool(d.get("weights_cached", True)),
            compile_cache=bool(d.get("compile_cache", False)),
            faults=faults,
            noise=float(d.get("noise", 0.0)),
            missing=float(d.get("missing", 0.0)),
            engine=engine,
            sglang_plan=_sglang_plan(d["plan"]) if engine == "sglang" else None,
            tgi_plan=_tgi_plan(d["plan"]) if engine == "tgi" else None,
            source=path,
        )
    except ScenarioError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise ScenarioError(f"{path.name}: {type(e).__name__}: {e}") from None


def load_scenarios(paths: list[Path] | None = None) -> list[BenchScenario]:
    files = paths or sorted(SCENARIO_DIR.glob("*.json"))
    return [load_scenario(p) for p in files]

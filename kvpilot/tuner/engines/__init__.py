"""The engines kvpilot plans and tunes, behind one seam (:mod:`.seam`).

Each engine's facts stay in that engine's one home (:mod:`kvpilot.tuner.vllm`,
:mod:`kvpilot.tuner.sglang`, :mod:`kvpilot.tuner.tgi`); this package adapts them to the seam
(:mod:`.vllm_engine`, :mod:`.sglang_engine`, :mod:`.tgi_engine`) and holds SGLang's and TGI's memory
budgets (:mod:`.sglang_budget`, :mod:`.tgi_budget` and its words, :mod:`.tgi_explain`), which need the
model and the weights and so sit above them
(``.importlinter``: ``plan | loop`` -> ``engines`` -> ``memory``).
"""

from kvpilot.tuner.engines.seam import (
    KINDS,
    Engine,
    EngineFailure,
    EngineKind,
    FailureKind,
    Knobs,
    MetricSeries,
    Serving,
)
from kvpilot.tuner.engines.sglang_budget import (
    SglangBudget,
    compute_sglang_budget,
    explain_sglang_budget,
    explain_sglang_infeasible,
    plan_sglang_budget,
    plan_sglang_kv,
)
from kvpilot.tuner.engines.sglang_engine import SglangEngine
from kvpilot.tuner.engines.tgi_budget import (
    TgiBudget,
    compute_tgi_budget,
    plan_tgi_budget,
)
from kvpilot.tuner.engines.tgi_engine import TgiEngine
from kvpilot.tuner.engines.tgi_explain import explain_tgi_budget
from kvpilot.tuner.engines.vllm_engine import VllmEngine

ENGINES: dict[str, Engine] = {"vLLM": VllmEngine(), "SGLang": SglangEngine(), "TGI": TgiEngine()}


def lookup_engine(kind: str) -> Engine:
    """The engine named ``kind`` (case-insensitive); an unknown name is an error listing the known ones."""
    for name, engine in ENGINES.items():
        if name.lower() == kind.lower():
            return engine
    raise ValueError(f"unknown engine {kind!r}; kvpilot knows {', '.join(ENGINES)}")


__all__ = [
    "ENGINES",
    "KINDS",
    "Engine",
    "EngineFailure",
    "EngineKind",
    "FailureKind",
    "Knobs",
    "MetricSeries",
    "Serving",
    "SglangBudget",
    "SglangEngine",
    "TgiBudget",
    "TgiEngine",
    "VllmEngine",
    "compute_sglang_budget",
    "compute_tgi_budget",
    "explain_sglang_budget",
    "explain_sglang_infeasible",
    "explain_tgi_budget",
    "lookup_engine",
    "plan_sglang_budget",
    "plan_sglang_kv",
    "plan_tgi_budget",
]

"""Compound crash causes (``kvpilot.tuner.loop.crash_remedies``): a start-up CUDA OOM outside vLLM's budget
(sized by ``max_num_seqs``: CUDA-graph capture, the sampler's warm-up) on settings whose utilisation a
context at its minimum already pinned. The remedy never re-tries what the evidence rules out, and the
first OOM's figures size the cut, so the OOM does not repeat."""

from __future__ import annotations

import dataclasses

import pytest
from policy_fixtures import NOW, context, entry, restart, state_and_evidence, window

from kvpilot.tuner.loop import crash_remedies, remedies
from kvpilot.tuner.loop.observations import ObservationWindow, RestartKind
from kvpilot.tuner.loop.policy import Action, PolicyConfig, TuningBounds, compute_decision
from kvpilot.tuner.loop.remedies import Situation
from kvpilot.tuner.types import EngineSettings, MemoryBudget

TOTAL = 79.19
BOUNDS = TuningBounds(min_max_model_len=32768)
DOWN = ObservationWindow.unavailable("nothing served yet", NOW)
BUDGET_32B = MemoryBudget(
    gpu_total_gib=TOTAL,
    requested_gib=0.95 * TOTAL,
    weights_gib=61.0,
    activation_gib=2.0,
    non_torch_gib=0.4,
    cuda_graph_gib=0.8,
    available_kv_cache_gib=9.0,
    kv_bytes_per_token=262144,
    num_gpu_blocks=2304,
    kv_cache_tokens=36864,
    max_concurrency=1.1,
    starts=True,
)
"""A 32B bf16 model on an H100 at 0.95: 36k KV tokens, a 32k minimum context just fits."""
RAISED = EngineSettings(
    max_model_len=32768, max_num_seqs=64, gpu_memory_utilization=0.95, max_num_batched_tokens=8192
)
"""Where "the context does not fit at 0.90" sent the utilisation."""
TOO_SMALL = RAISED.replace(gpu_memory_utilization=0.90)
PER_SEQ_GIB = 0.2
"""Start-up memory outside the budget per sequence: the allocation that fails is this x max_num_seqs."""


def _free(gmu: float) -> float:
    """What the OOM text reports free: the headroom less the 1 GiB the CUDA context holds."""
    return (1 - gmu) * TOTAL - 1.0


def _oom(current: EngineSettings, count: int = 1, per_seq: float = PER_SEQ_GIB) -> object:
    seqs = current.max_num_seqs or 1
    tried, free = per_seq * seqs, _free(current.gpu_memory_utilization or 0.9)
    return restart(RestartKind.CUDA_OOM, count=count, tried_gib=tried, free_gib=free, total_gib=TOTAL)


def _decide(current: EngineSettings, history: tuple = (), count: int = 1) -> object:
    state, evidence = state_and_evidence(
        current, DOWN, (_oom(current, count),), history, (TOO_SMALL,), budget=BUDGET_32B
    )
    return compute_decision(state, evidence, context(BOUNDS, PolicyConfig()), NOW)


def test_start_up_oom_cut_is_sized_by_the_room_it_found() -> None:
    """64 sequences tried 12.8 GiB with 2.96 GiB free: 64 x 2.96 / (12.8 x 1.2) = 12 sequences, at once
    (halving to 32 would try 6.4 GiB in 2.96 and OOM again); the utilisation the context needs stays."""
    d = _decide(RAISED)
    assert (d.action, d.trigger, d.failed) == (Action.RETUNE, "CudaOOM", RAISED)
    assert d.settings.max_num_seqs == 12
    assert d.settings.gpu_memory_utilization == 0.95
    assert PER_SEQ_GIB * d.settings.max_num_seqs <= _free(0.95)  # the next start does not OOM


@pytest.mark.parametrize("seqs", [16, 24, 32, 48, 128, 256])
def test_start_up_oom_never_repeats(seqs: int) -> None:
    """Whatever the limit that OOMed, the settings chosen fit the allocation the evidence sized."""
    current = RAISED.replace(max_num_seqs=seqs)
    d = _decide(current)
    if PER_SEQ_GIB * seqs * PolicyConfig().oom_headroom_ratio <= _free(0.95):
        pytest.fail("the case must OOM")  # keeps the table honest
    gmu = d.settings.gpu_memory_utilization or 0.95
    assert PER_SEQ_GIB * (d.settings.max_num_seqs or seqs) <= _free(gmu)


def _situation(current: EngineSettings, history: tuple = ()) -> Situation:
    ctx = context(BOUNDS, PolicyConfig())
    eff = remedies.compute_effective(current, ctx)
    return Situation(
        current, eff, BUDGET_32B, DOWN, ctx, history, NOW, BUDGET_32B.kv_cache_tokens, failed=(TOO_SMALL,)
    )


@pytest.mark.parametrize("escalate", [False, True])
@pytest.mark.parametrize("per_seq", [PER_SEQ_GIB, 0.1])
@pytest.mark.parametrize(("seqs", "gmu"), [(32, 0.95), (64, 0.95), (64, 0.92), (256, 0.90)])
def test_start_up_oom_never_proposes_what_keeps_the_allocation(
    seqs: int, gmu: float, per_seq: float, escalate: bool
) -> None:
    """A batch-shaped OOM at start-up: every candidate cuts max_num_seqs or lowers the utilisation. Fewer
    batched tokens alone keep the allocation that failed (the profile run they size is inside the
    budget); before this rule a repeat OOM at 0.95 x 32 (3.2 GiB tried, 2.96 free: a shortfall one
    utilisation step covers) went on to 4096, then 2048 batched tokens, and OOMed at each."""
    current = RAISED.replace(max_num_seqs=seqs, gpu_memory_utilization=gmu)
    history = (entry(ago=60, trigger="CudaOOM", after=current),) if escalate else ()
    s = _situation(current, history)
    event = _oom(current, count=2 if escalate else 1, per_seq=per_seq)
    proposal = crash_remedies.propose_for_restart(s, event)  # type: ignore[arg-type]
    assert proposal is not None and proposal.candidates
    for c in proposal.candidates:
        cut = (c.max_num_seqs or seqs) < seqs
        lower = (c.gpu_memory_utilization or gmu) < gmu
        assert cut or lower, c


def test_oom_while_serving_may_still_cut_the_batched_tokens() -> None:
    """The rule is about start-up: under a small running batch, the batched tokens are what sized it."""
    ctx = context(BOUNDS, PolicyConfig())
    eff = remedies.compute_effective(RAISED, ctx)
    win = window(kv=0.85, running=4, waiting=0, prompt=3000, output=1000)
    s = dataclasses.replace(_situation(RAISED), window=win, effective=eff)
    event = restart(RestartKind.CUDA_OOM, tried_gib=3.0, free_gib=2.0, total_gib=TOTAL)
    proposal = crash_remedies.propose_for_restart(s, event)
    assert proposal is not None
    assert proposal.candidates[0] == eff.replace(max_num_batched_tokens=4096)

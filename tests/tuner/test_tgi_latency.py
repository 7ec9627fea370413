"""TGI's latency objective (:func:`kvpilot.tuner.loop.tgi_rules.propose_for_itl`, on the shared
:mod:`kvpilot.tuner.loop.engine_latency`): ``spec.serving.slo.itlP95Seconds`` missed in most samples of TGI's
time per output token halves ``--max-batch-prefill-tokens`` where long prompts share the steps and TGI
still serves every prompt, else cuts ``--max-concurrent-requests`` to the running requests x objective /
measured (at most half a step); no idle raise while the latency is within 0.9 of its objective."""

from __future__ import annotations

import dataclasses

from kvpilot.tuner import engines, gpus, tgi
from kvpilot.tuner.loop import (
    Action,
    PolicyConfig,
    TgiContext,
    TgiDecision,
    TgiEvidence,
    TgiLoopState,
    TgiMemory,
    Trigger,
    TuningBounds,
    compute_tgi_decision,
    engine_latency,
)
from kvpilot.tuner.loop.observations import LengthSummary, MetricsSample, ObservationWindow
from kvpilot.tuner.loop.remedies import IDLE_CAPACITY
from kvpilot.tuner.model import build_model_spec, lookup_model_config
from kvpilot.tuner.tgi import serving

LLAMA = build_model_spec(lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
H100 = gpus.lookup_gpu("H100-SXM")
BARE = TgiMemory(H100)
MODELLED = TgiMemory(H100, LLAMA)  # TGI chunks a prefill with this model's attention on an H100
NOW = 100_000.0
CURRENT = tgi.TgiSettings(
    max_total_tokens=8192, max_input_tokens=8000, max_batch_prefill_tokens=8192, max_concurrent_requests=64
)
OBJECTIVE = 0.05


def window(
    kv: float = 0.6,
    running: float = 40,
    waiting: float = 0,
    itl: float | None = 0.08,
    prompt: float | None = None,
) -> ObservationWindow:
    samples = tuple(
        MetricsSample(time=NOW - 30 * (9 - i), kv_usage=kv, running=running, waiting=waiting, itl_p95=itl)
        for i in range(10)
    )
    prompts = LengthSummary(prompt) if prompt is not None else None
    return ObservationWindow(NOW - 300, NOW, samples, prompt_tokens=prompts, pods=1)


def decide(
    w: ObservationWindow,
    current: tgi.TgiSettings = CURRENT,
    memory: TgiMemory = BARE,
    objective: float | None = OBJECTIVE,
) -> TgiDecision:
    return compute_tgi_decision(
        TgiLoopState(current, last_good=current),
        TgiEvidence(w, ready=True),
        TgiContext(memory, TuningBounds(), PolicyConfig(), objective),
        NOW,
    )


def test_a_missed_itl_objective_cuts_the_admission_limit_to_the_objectives_share_of_what_ran() -> None:
    decision = decide(window(running=40, itl=0.06))
    assert (decision.action, decision.trigger) == (Action.RETUNE, engine_latency.LATENCY_SLO)
    assert decision.settings.max_concurrent_requests == 33  # 40 x 0.05 / 0.06
    assert decision.settings.max_batch_prefill_tokens == 8192
    assert serving.TIME_PER_TOKEN in decision.reason and "60 ms above the 50 ms objective" in decision.reason


def test_the_cut_is_at_most_half_a_step() -> None:
    assert decide(window(running=40, itl=0.4)).settings.max_concurrent_requests == 20


def test_long_prompts_halve_the_prefill_first_where_tgi_chunks_it() -> None:
    decision = decide(window(itl=0.06, prompt=3000), memory=MODELLED)
    assert decision.trigger == engine_latency.LATENCY_SLO
    assert decision.settings.max_batch_prefill_tokens == 4096
    assert decision.settings.max_concurrent_requests == 64 and decision.settings.max_input_tokens == 8000


def test_long_prompts_keep_the_prefill_where_a_halved_one_would_refuse_prompts_tgi_serves() -> None:
    """Not modelled: whether TGI chunks is unknown, and 4096 prefill tokens would not hold an 8000-token
    prompt unchunked; the latency never shortens the prompts served, so the admission limit is cut."""
    decision = decide(window(itl=0.06, prompt=3000), memory=BARE)
    assert decision.settings.max_batch_prefill_tokens == 8192
    assert decision.settings.max_concurrent_requests == 33
    short = dataclasses.replace(CURRENT, max_input_tokens=4000)
    assert decide(window(itl=0.06, prompt=3000), current=short).settings.max_batch_prefill_tokens == 4096


def test_a_met_objective_or_none_changes_nothing() -> None:
    assert decide(window(itl=0.04)).trigger == Trigger.STEADY
    assert decide(window(itl=0.06), objective=None).trigger == Trigger.STEADY
    assert decide(window(itl=None)).trigger == Trigger.STEADY  # no series: no evidence


def test_the_latency_rule_comes_before_an_idle_raise() -> None:
    decision = decide(window(kv=0.3, running=48, waiting=16, itl=0.06))  # the limit binds, KV spare
    assert decision.trigger == engine_latency.LATENCY_SLO
    assert (decision.settings.max_concurrent_requests or 0) < 64


def test_no_idle_raise_while_the_latency_is_within_its_margin() -> None:
    at_limit = window(kv=0.3, running=48, waiting=16, itl=0.046)  # 0.92 of the objective
    held = decide(at_limit)
    assert (held.action, held.trigger) == (Action.HOLD, Trigger.STEADY)
    clear = window(kv=0.3, running=48, waiting=16, itl=0.02)
    raised = decide(clear)
    assert raised.trigger == IDLE_CAPACITY and (raised.settings.max_concurrent_requests or 0) > 64


def test_the_shared_rule_is_what_sglangs_loop_reads() -> None:
    """One home for the engine-neutral arithmetic: the cut and the raise margin."""
    miss = engine_latency.find_itl_miss(window(running=40, itl=0.06), OBJECTIVE, PolicyConfig())
    assert miss is not None and engine_latency.compute_running_cut(64, miss, PolicyConfig()) == 33
    assert engine_latency.compute_running_cut(1, miss, PolicyConfig()) is None
    assert not engine_latency.allows_raise(window(itl=0.046), OBJECTIVE, PolicyConfig())


def test_tgis_series_for_the_latency_and_the_prompts_are_named_by_the_seam() -> None:
    metrics = engines.TgiEngine().metrics
    assert metrics.itl == serving.TIME_PER_TOKEN
    assert metrics.ttft == serving.REQUEST_QUEUE_DURATION  # a lower bound of TTFT: no prefill in it
    assert metrics.prompt_tokens == serving.INPUT_LENGTH

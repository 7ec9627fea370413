"""Fleet learning's math (kvpilot.tuner.plan.profiles) and the planner starting from a profile."""

from __future__ import annotations

import dataclasses

import pytest

from kvpilot.tuner import gpus, memory
from kvpilot.tuner.model import catalogue
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.plan import profiles as p
from kvpilot.tuner.types import ServingBounds

KEY = p.ProfileKey("0123456789abcdef", "L4", "0.33.0", "auto", 1, 1, "ns")


def kv(source: str, predicted: int, observed: int) -> p.KvSample:
    return p.KvSample(source, predicted, observed)


def record(*samples: p.KvSample, ooms: tuple[p.OomSample, ...] = ()) -> p.ProfileRecord:
    r = p.ProfileRecord()
    for s in samples:
        r = p.add_kv_sample(r, s)
    for o in ooms:
        r = p.add_oom(r, o)
    return r


def test_the_name_is_a_hash_of_the_whole_key_and_a_new_memory_model_gets_a_new_one() -> None:
    assert KEY.name == p.ProfileKey(*dataclasses.astuple(KEY)).name  # deterministic
    assert KEY.name.startswith("tp-") and len(KEY.name) == 23
    assert KEY.memory_model_version == memory.MEMORY_MODEL_VERSION
    others = [
        dataclasses.replace(KEY, memory_model_version="0.0.0"),
        dataclasses.replace(KEY, gpu="H100-80GB"),
        dataclasses.replace(KEY, vllm_version="0.32.0"),
        dataclasses.replace(KEY, kv_cache_dtype="fp8"),
        dataclasses.replace(KEY, tensor_parallel_size=2),
        dataclasses.replace(KEY, pipeline_parallel_size=2),
        dataclasses.replace(KEY, model_digest="fedcba9876543210"),
        dataclasses.replace(KEY, namespace="other"),
        dataclasses.replace(KEY, namespace=p.SHARED),
        dataclasses.replace(KEY, engine_digest="feed"),
    ]
    assert len({KEY.name, *(o.name for o in others)}) == len(others) + 1


def test_one_sample_or_one_service_is_not_a_profile() -> None:
    one = p.compute_learned(record(kv("ns/a", 1000, 900)), KEY.name)
    assert one.kv_ratio is None and not one.used and one.kv_samples == 1
    same_service = record(kv("ns/a", 1000, 900), kv("ns/a", 2000, 1800), kv("ns/a", 3000, 2700))
    lone = p.compute_learned(same_service, KEY.name)
    assert lone.kv_samples == p.MIN_KV_SAMPLES and lone.kv_services == 1 and lone.kv_ratio is None
    assert "3 from 2 needed" in lone.describe()
    two = p.compute_learned(p.add_kv_sample(same_service, kv("ns/b", 1000, 880)), KEY.name)
    assert two.kv_ratio == pytest.approx(0.9) and two.used  # the median of 0.88, 0.9, 0.9, 0.9


def test_an_outlier_does_not_move_the_ratio() -> None:
    base = [kv("ns/a", 1000, 900), kv("ns/b", 1000, 910), kv("ns/c", 1000, 920)]
    calm = p.compute_learned(record(*base), KEY.name).kv_ratio
    wild = p.compute_learned(record(*base, kv("ns/d", 1000, 5000)), KEY.name).kv_ratio
    assert calm == pytest.approx(0.91)
    assert wild is not None and 0.91 <= wild <= 0.92  # the median moves at most to a neighbour
    low = p.compute_learned(record(*base, kv("ns/d", 1000, 10)), KEY.name).kv_ratio
    assert low is not None and 0.90 <= low <= 0.91


def test_a_service_resampling_the_same_prediction_replaces_its_sample_and_lists_are_bounded() -> None:
    r = record(kv("ns/a", 1000, 900), kv("ns/a", 1000, 950))
    assert [s.observed_tokens for s in r.kv] == [950]
    many = record(*(kv(f"ns/s{i}", 1000, 900 + i) for i in range(40)))
    assert len(many.kv) == p.MAX_SAMPLES and many.kv[-1].source == "ns/s39"
    assert p.add_kv_sample(r, kv("ns/b", 0, 900)) == r  # nothing predicted: no ratio to learn


def test_one_oom_sets_the_ceiling_below_the_lowest_and_a_healthy_run_refutes_one() -> None:
    one = p.compute_learned(record(ooms=(p.OomSample("ns/a", 0.95, 256),)), KEY.name)
    assert one.utilization_ceiling == pytest.approx(0.95 - p.UTILIZATION_MARGIN) and one.used
    assert "at most 0.93 (CUDA OOM at 0.95)" in one.describe()
    two = record(ooms=(p.OomSample("ns/a", 0.95, 256), p.OomSample("ns/b", 0.91, 256)))
    assert p.compute_learned(two, KEY.name).utilization_ceiling == pytest.approx(0.89)
    # an OOM at 0.80 with 64 sequences, but another service served 0.90 with 64: not the utilisation's
    odd = p.add_oom(two, p.OomSample("ns/c", 0.80, 64))
    assert p.compute_learned(odd, KEY.name).utilization_ceiling == pytest.approx(0.78)
    refuted = p.add_healthy(odd, p.HealthySample("ns/d", 0.90, 64))
    assert p.compute_learned(refuted, KEY.name).utilization_ceiling == pytest.approx(0.89)
    # a healthy run with fewer sequences refutes nothing (the OOM may have been the batch's)
    fewer = p.add_healthy(odd, p.HealthySample("ns/d", 0.90, 32))
    assert p.compute_learned(fewer, KEY.name).utilization_ceiling == pytest.approx(0.78)
    assert record(ooms=(p.OomSample("ns/a", 0.95),) * 2).ooms == (p.OomSample("ns/a", 0.95),)


def test_startup_seconds_keep_the_newest_per_service_and_report_the_median() -> None:
    r = p.ProfileRecord()
    for source, seconds in (("ns/a", 60.0), ("ns/a", 30.0), ("ns/b", 40.0), ("ns/c", 500.0)):
        r = p.add_startup(r, p.StartupSample(source, seconds))
    assert len(r.startups) == 3
    assert p.compute_learned(r, KEY.name).startup_seconds == 40.0
    assert r.sources == ("ns/a", "ns/b", "ns/c")


# --- the planner ----------------------------------------------------------------------------------------

LLAMA = build_model_spec(catalogue.lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
L4 = gpus.lookup_gpu("L4")
BOUNDS = ServingBounds(max_context=4096)


def test_the_planner_stays_below_the_lowest_oom_and_names_the_profile() -> None:
    base = compute_plan(LLAMA, L4, 1, BOUNDS)
    util = base.settings.gpu_memory_utilization
    assert util is not None and base.profile is None and not base.profile_note
    oom = p.compute_learned(record(ooms=(p.OomSample("ns/a", util),)), KEY.name)
    learned = compute_plan(LLAMA, L4, 1, BOUNDS, learned=oom)
    assert learned.settings.gpu_memory_utilization == pytest.approx(util - p.UTILIZATION_MARGIN)
    assert learned.profile == KEY.name and KEY.name in learned.profile_note
    assert learned.budget.kv_cache_tokens < base.budget.kv_cache_tokens  # less memory, fewer tokens
    # a ceiling above what the memory model plans changes nothing
    high = p.compute_learned(record(ooms=(p.OomSample("ns/a", 0.99),)), KEY.name)
    assert compute_plan(LLAMA, L4, 1, BOUNDS, learned=high).settings == base.settings


def test_a_ceiling_below_the_specs_minimum_keeps_the_minimum_and_warns() -> None:
    oom = p.compute_learned(record(ooms=(p.OomSample("ns/a", 0.6),)), KEY.name)
    bounds = dataclasses.replace(BOUNDS, min_gpu_memory_utilization=0.85)
    plan = compute_plan(LLAMA, L4, 1, bounds, learned=oom)
    assert plan.settings.gpu_memory_utilization == 0.85
    assert any("below the spec's minimum" in w for w in plan.warnings), plan.warnings


def test_the_learned_kv_ratio_sizes_max_num_seqs_and_the_expected_capacity() -> None:
    base = compute_plan(LLAMA, L4, 1, BOUNDS)
    samples = [kv("ns/a", 1000, 500), kv("ns/b", 1000, 500), kv("ns/c", 1000, 500)]
    half = p.compute_learned(record(*samples), KEY.name)
    plan = compute_plan(LLAMA, L4, 1, BOUNDS, learned=half)
    assert plan.learned_kv_cache_tokens == round(plan.budget.kv_cache_tokens * 0.5)
    assert base.settings.max_num_seqs is not None and plan.settings.max_num_seqs is not None
    assert plan.settings.max_num_seqs < base.settings.max_num_seqs
    assert plan.settings.gpu_memory_utilization == base.settings.gpu_memory_utilization


def test_a_profile_below_its_guards_is_named_but_not_used() -> None:
    weak = p.compute_learned(record(kv("ns/a", 1000, 500)), KEY.name)
    plan = compute_plan(LLAMA, L4, 1, BOUNDS, learned=weak)
    base = compute_plan(LLAMA, L4, 1, BOUNDS)
    assert plan.settings == base.settings and plan.profile is None
    assert "not used yet" in plan.profile_note


# --- shared profiles: agreement, one vote a service, a bounded share a namespace ------------------------


def shared(*samples: p.KvSample, ooms: tuple[p.OomSample, ...] = ()) -> p.ProfileRecord:
    r = p.ProfileRecord(shared=True)
    for s in samples:
        r = p.add_kv_sample(r, s)
    for o in ooms:
        r = p.add_oom(r, o)
    return r


def test_a_shared_figure_needs_three_services_from_two_namespaces() -> None:
    ooms = (p.OomSample("a/x", 0.9), p.OomSample("a/y", 0.9), p.OomSample("a/z", 0.9))
    one_tenant = shared(kv("a/x", 1000, 500), kv("a/y", 1000, 500), kv("a/z", 1000, 500), ooms=ooms)
    alone = p.compute_learned(one_tenant, KEY.name)
    assert alone.kv_ratio is None and alone.utilization_ceiling is None and not alone.used
    assert "3 services from 2 namespaces needed" in alone.describe() and alone.shared
    two_services = shared(kv("a/x", 1000, 500), kv("b/y", 1000, 500), kv("a/x", 2000, 1000))
    assert p.compute_learned(two_services, KEY.name).kv_ratio is None  # 3 samples, but 2 services
    agreed = p.add_kv_sample(one_tenant, kv("b/w", 1000, 520))
    agreed = p.add_oom(agreed, p.OomSample("b/w", 0.92))
    learned = p.compute_learned(agreed, KEY.name)
    assert learned.kv_ratio == pytest.approx(0.5) and learned.namespaces == 2
    assert learned.utilization_ceiling == pytest.approx(0.90)  # a/x, a/y, a/z at 0.9 and b/w agree from 0.92


def test_one_tenants_low_oom_does_not_set_a_shared_ceiling() -> None:
    """The attack: an OOM at her own 0.30 among the fleet's OOMs at 0.91 and 0.92. A namespace profile would
    take 0.28; a shared one takes the lowest utilisation three services of two namespaces agree is unsafe."""
    ooms = (p.OomSample("evil/x", 0.30), p.OomSample("a/y", 0.91), p.OomSample("b/z", 0.92))
    learned = p.compute_learned(shared(ooms=ooms), KEY.name)
    assert learned.lowest_oom_utilization == 0.92 and learned.utilization_ceiling == pytest.approx(0.90)
    assert p.compute_learned(record(ooms=ooms), KEY.name).utilization_ceiling == pytest.approx(0.28)
    many = shared(ooms=tuple(p.OomSample("evil/x", 0.30 + i / 100) for i in range(5)))  # one service, once
    assert p.compute_learned(many, KEY.name).utilization_ceiling is None


def test_a_shared_ratio_counts_each_service_once() -> None:
    """Nine samples of one service at x33 and one each of two others at x0.9: the median of the three
    services' medians is 0.9, not 33."""
    flood = [kv("evil/x", 1000 + i, 33 * (1000 + i)) for i in range(3)]
    r = shared(*flood, kv("a/y", 1000, 900), kv("b/z", 1000, 900))
    assert p.compute_learned(r, KEY.name).kv_ratio == pytest.approx(0.9)


def test_one_namespace_cannot_flush_a_shared_profile() -> None:
    r = shared(kv("a/y", 1000, 900), kv("b/z", 1000, 900))
    for i in range(3 * p.MAX_SAMPLES):
        r = p.add_kv_sample(r, kv(f"evil/s{i}", 1000, 33_000))
    assert {s.source for s in r.kv} >= {"a/y", "b/z"}
    assert sum(s.source.startswith("evil/") for s in r.kv) == p.MAX_SAMPLES_PER_NAMESPACE
    own = record(kv("a/y", 1000, 900))  # a namespace's own profile: its own to flush
    for i in range(p.MAX_SAMPLES):
        own = p.add_kv_sample(own, kv(f"a/s{i}", 1000, 900))
    assert "a/y" not in {s.source for s in own.kv}


# --- observations bounded by the GPU ---------------------------------------------------------------------


def test_no_kv_observation_beyond_what_the_gpu_could_hold() -> None:
    """Llama-3.1-8B on an L4 (21.96 GiB) at the plan's utilisation: the ceiling is the whole device share
    less the weights, above the prediction (activations, graphs) and below the 51 GiB the attack reported
    (``--hf-overrides '{"num_hidden_layers": 1}'``: 32 times the tokens of 32 layers)."""
    plan = compute_plan(LLAMA, L4, 1, BOUNDS)
    b = plan.budget
    ceiling = p.compute_kv_ceiling(b)
    assert b.kv_cache_tokens < ceiling
    room = (b.requested_gib - b.weights_gib) * (1 << 30)
    assert ceiling * b.kv_bytes_per_token <= room + b.kv_bytes_per_token
    forged = 51 * (1 << 30) // b.kv_bytes_per_token
    assert forged > ceiling and b.kv_cache_tokens * 32 > ceiling
    starved = dataclasses.replace(b, requested_gib=b.weights_gib - 1)  # nothing left for a KV cache
    assert p.compute_kv_ceiling(starved) == 0

"""Property: whatever the services of one namespace report -- KV capacity (plausible or forged), CUDA OOMs at
any utilisation, healthy runs, start-up times; from plain services, services with --hf-overrides or other
memory-changing flags, pinned or bounded ones -- another namespace's plans stay the same, unless an
administrator made the two share (and even then one namespace alone cannot bind a shared figure).

Through the operator's own routing (:func:`profiles.record_observations`) into profiles as the API server
keeps them, and the planner's own reading (:func:`profiles.fetch_plan_learned` and the planner)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from operator_fakes import FakeStore

from kvpilot.operator import api
from kvpilot.operator.planning import profile_scope, profiles
from kvpilot.tuner import gpus
from kvpilot.tuner.model import catalogue
from kvpilot.tuner.model.spec import build_model_spec
from kvpilot.tuner.plan import compute_plan
from kvpilot.tuner.types import EngineSettings, ServingBounds

LOG = logging.getLogger("test")
LLAMA = build_model_spec(catalogue.lookup_model_config("meta-llama/Llama-3.1-8B-Instruct"))
L4 = gpus.lookup_gpu("L4")
BOUNDS = ServingBounds(max_context=4096)
BUDGET = compute_plan(LLAMA, L4, 1, BOUNDS).budget
APPLIED = EngineSettings(kv_cache_dtype="auto", tensor_parallel_size=1)
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "hf-overrides": {"engine": {"extraArgs": ["--hf-overrides", '{"num_hidden_layers": 1}']}},
    "eager": {"engine": {"extraArgs": ["--enforce-eager"]}},
    "pinned": {"engine": {"pinned": {"gpuMemoryUtilization": 0.3}}},
    "bounded": {"tuning": {"bounds": {"gpuMemoryUtilization": {"max": 0.3}}}},
    "neutral-flags": {"engine": {"extraArgs": ["--served-model-name", "chat"]}},
}


def keys(ns: str, variant: str, sharing: frozenset[str]) -> profile_scope.Keys:
    spec = api.InferenceServiceSpec.model_validate(
        {
            "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
            "gpu": {"count": 1, "product": "L4"},
            **VARIANTS[variant],
        }
    )
    return profile_scope.compute_keys("0123456789abcdef", "L4", spec, APPLIED, ns, shared_with=sharing)


observation = st.fixed_dictionaries(
    {
        "service": st.integers(0, 4),
        "variant": st.sampled_from(sorted(VARIANTS)),
        "kv_ratio": st.none() | st.floats(0.01, 64.0),
        "oom": st.none() | st.floats(0.05, 1.0),
        "healthy": st.none() | st.tuples(st.floats(0.05, 1.0), st.integers(1, 1024)),
        "startup": st.none() | st.floats(0.1, 3600.0),
    }
)
SHARINGS = [frozenset(), frozenset({"a", "c"}), frozenset({"a", "b"}), frozenset({"a", "b", "c"})]


async def _record(store: FakeStore, ns: str, sharing: frozenset[str], obs: dict[str, Any]) -> None:
    ratio, oom, healthy = obs["kv_ratio"], obs["oom"], obs["healthy"]
    await profiles.record_observations(
        store,
        keys(ns, obs["variant"], sharing),
        "m",
        f"{ns}/s{obs['service']}",
        budget=BUDGET,
        observed_kv_tokens=max(1, round(BUDGET.kv_cache_tokens * ratio)) if ratio is not None else None,
        oom=EngineSettings(gpu_memory_utilization=oom) if oom is not None else None,
        healthy=EngineSettings(gpu_memory_utilization=healthy[0], max_num_seqs=healthy[1])
        if healthy
        else None,
        startup_seconds=obs["startup"],
        now="t",
        logger=LOG,
        window_s=0.0,
    )


async def _plans(store: FakeStore, ns: str, sharing: frozenset[str]) -> dict[str, EngineSettings]:
    """The settings a new service of ``ns`` of every variant would be planned with."""
    profiles.clear_cache()
    out = {}
    for variant in VARIANTS:
        learned = await profiles.fetch_plan_learned(store, keys(ns, variant, sharing), LOG)
        out[variant] = compute_plan(LLAMA, L4, 1, BOUNDS, learned=learned).settings
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sharing=st.sampled_from(SHARINGS),
    before=st.lists(observation, max_size=4),
    from_a=st.lists(observation, min_size=1, max_size=12),
)
def test_one_namespaces_samples_leave_another_namespaces_plans_alone(
    sharing: frozenset[str], before: list[dict[str, Any]], from_a: list[dict[str, Any]]
) -> None:
    """``before``: what namespace b's own services taught (so b's plans may already start from a profile);
    then anything from namespace a: b's plans do not move, unless an administrator lists both a and b to
    share and b's own plain services taught the shared profile too (then two namespaces may bind it; a
    alone never does)."""

    async def run() -> None:
        store = FakeStore()
        for obs in before:
            await _record(store, "b", sharing, obs)
        baseline = await _plans(store, "b", sharing)
        for obs in from_a:
            await _record(store, "a", sharing, obs)
        after = await _plans(store, "b", sharing)
        if {"a", "b"} <= sharing and any(_teaches_shared(obs) for obs in before):
            return  # b taught the shared profile too: two namespaces may bind it, as the administrator chose
        assert after == baseline

    asyncio.run(run())


SHAREABLE = frozenset({"plain", "neutral-flags"})
"""The variants whose samples may enter a shared profile: no sizing-relevant flag, pin or bound."""


def _teaches_shared(obs: dict[str, Any]) -> bool:
    """A sample of a shareable variant that carries something to learn."""
    learned = (obs["kv_ratio"], obs["oom"], obs["healthy"], obs["startup"])
    return obs["variant"] in SHAREABLE and any(v is not None for v in learned)


def test_sharing_is_what_an_administrator_turns_on() -> None:
    """Not vacuous: OOMs of plain services of namespaces a and c (three services) lower b's next plan when
    an administrator lists a, b and c to share, and not otherwise."""

    async def lowered(sharing: frozenset[str]) -> bool:
        store = FakeStore()
        plain = (await _plans(store, "b", sharing))["plain"]
        assert plain.gpu_memory_utilization is not None
        for ns, service in (("a", 0), ("a", 1), ("c", 2)):
            obs = {
                "service": service,
                "variant": "plain",
                "kv_ratio": None,
                "oom": plain.gpu_memory_utilization,
                "healthy": None,
                "startup": None,
            }
            await _record(store, ns, sharing, obs)
        after = (await _plans(store, "b", sharing))["plain"]
        assert after.gpu_memory_utilization is not None
        return after.gpu_memory_utilization < plain.gpu_memory_utilization

    assert asyncio.run(lowered(frozenset({"a", "b", "c"})))
    assert not asyncio.run(lowered(frozenset({"a", "c"})))
    assert not asyncio.run(lowered(frozenset()))

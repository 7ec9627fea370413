"""The filters every candidate of a rule passes, in order: clamp to the bounds, round and make consistent
(:func:`normalize`), drop "no change", drop settings that failed before (:func:`known_bad`), drop
settings predicted not to start (:func:`would_start`). :func:`pick` returns the first survivor; the
stability and rollout gates come after it, in :mod:`kvpilot.tuner.loop.policy`."""

from __future__ import annotations

import dataclasses

from kvpilot.tuner.loop import remedies
from kvpilot.tuner.loop.remedies import Proposal, Situation
from kvpilot.tuner.types import EngineSettings


def pick(s: Situation, proposal: Proposal) -> EngineSettings | None:
    """The first candidate within the bounds that changes something, never failed and would start."""
    for candidate in proposal.candidates:
        settings = s.bounds.clamp(normalize(s.bounds.clamp(candidate), s))
        if s.effective_of(settings) == s.effective:
            continue
        if known_bad(settings, s):
            continue
        if not would_start(settings, s):
            continue
        return settings
    return None


def normalize(settings: EngineSettings, s: Situation) -> EngineSettings:
    """Round, keep vLLM's cross-field rules (``max_num_batched_tokens`` and the engine's
    ``--max-num-active-seqs`` at or below ``max_num_seqs``), and leave unset what the candidate did not
    change."""
    gmu = settings.gpu_memory_utilization
    if gmu is not None:
        settings = settings.replace(gpu_memory_utilization=round(gmu, 2))
    seqs, batched = settings.max_num_seqs, settings.max_num_batched_tokens
    cap = s.active_cap
    if seqs is not None and cap is not None and seqs < cap:
        # vLLM 0.33 refuses max_num_active_seqs > max_num_seqs (config/scheduler.py:338-345): a cut stops at
        # the user's cap, which kvpilot does not tune (:mod:`kvpilot.tuner.vllm.active_seqs`)
        seqs = cap
        settings = settings.replace(max_num_seqs=seqs)
    if seqs is not None and batched is not None and batched < seqs:
        settings = settings.replace(max_num_batched_tokens=seqs)  # vLLM: batched tokens >= max_num_seqs
    unset = {
        f.name: None
        for f in dataclasses.fields(EngineSettings)
        if getattr(s.current, f.name) is None and getattr(settings, f.name) == getattr(s.effective, f.name)
    }
    return settings.replace(**unset)


def known_bad(settings: EngineSettings, s: Situation) -> bool:
    """The settings, as vLLM would run them, failed before (``status.failedSettings``)."""
    mine = s.effective_of(settings)
    return any(s.effective_of(f) == mine for f in s.failed)


def would_start(settings: EngineSettings, s: Situation) -> bool:
    """The KV cache predicted for the settings holds one sequence of their context (unknown = yes)."""
    length = settings.max_model_len or s.effective.max_model_len
    if length is None:
        return True
    tokens = remedies.predict_kv_tokens(s, s.effective_of(settings))
    return tokens is None or tokens >= length

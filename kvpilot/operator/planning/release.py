"""The vLLM release an InferenceService runs: the one place the operator decides it.

The memory model is version-aware (:mod:`kvpilot.tuner.vllm.versions`), so every budget the operator
computes for a service must be computed for the release its pods run, not the release kvpilot pins:
the reconciler's plan (:func:`kvpilot.operator.inferenceservice.desired.build_desired`), the closed loop's
budget of the
running settings and its tuning context (:mod:`kvpilot.operator.inferenceservice.closed_loop`), and the
fallback budget
read back from ``status.budget`` (:func:`kvpilot.operator.loop.loop_state.read_budget`). They all ask
:func:`resolve_release`.

The release is ``spec.engine.vllmVersion`` when given, else read from ``spec.engine.image``'s tag
(:func:`kvpilot.tuner.vllm.resolve_image_version`; a tag it cannot read gives the pinned release and a
``VersionAssumed`` warning); the engine's flags (:class:`kvpilot.tuner.vllm.EngineFlags`) are the model
runner, ``VLLM_USE_V2_MODEL_RUNNER`` from ``spec.engine.env`` when it is a literal value, and the untuned
flags of ``spec.engine.extraArgs`` that change vLLM's memory (``--enforce-eager``, ``--performance-mode``,
prefix caching, ``--kv-transfer-config``, whose LMCache connector reads ``LMCACHE_*`` from
``spec.engine.env``: :mod:`kvpilot.tuner.vllm.engine_flags`), with the config.json of the drafter its
speculative decoding loads, as the service's model resolved it (:mod:`.drafts`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.operator import api
from kvpilot.operator.planning.resolve import ResolvedModel
from kvpilot.tuner import vllm


@dataclass(frozen=True, slots=True)
class EngineRelease:
    """What the memory model is told about the engine a service runs."""

    image: vllm.ImageVersion
    flags: vllm.EngineFlags
    """The model runner (``None``: unset or not a literal, the release's default) and the extra args' flags
    that change the budget."""

    @property
    def version(self) -> str:
        return self.image.version

    @property
    def parsed(self) -> vllm.Version:
        return vllm.parse_version(self.image.version)


def resolve_release(spec: api.InferenceServiceSpec, model: ResolvedModel | None = None) -> EngineRelease:
    """The release and flags of ``spec``'s engine (pure: no registry is asked); ``model``: the service's
    resolved model, whose drafter's config.json (or the advice where it was not read) the speculative
    flags then carry (every budget of the service passes it; ``None``: the release only)."""
    flags = vllm.build_engine_flags(spec.engine.extra_args, _v2_runner_env(spec), literal_env(spec))
    if model is not None:
        flags = model.with_draft(flags)
    return EngineRelease(vllm.resolve_image_version(spec.engine.image, spec.engine.vllm_version), flags)


def literal_env(spec: api.InferenceServiceSpec) -> dict[str, str]:
    """``spec.engine.env``'s variables with a literal value (the last one wins, as in a container); one
    taken from a Secret or ConfigMap is left out (not read), except that it is set: its name maps to ``""``
    when no literal value follows it (LMCache's ``LMCACHE_CONFIG_FILE`` matters by being set)."""
    env: dict[str, str] = {}
    for var in spec.engine.env:
        env[var.name] = var.value if var.value is not None else ""
    return env


def _v2_runner_env(spec: api.InferenceServiceSpec) -> bool | None:
    """``VLLM_USE_V2_MODEL_RUNNER`` from ``spec.engine.env`` when it is a literal value (the last one
    wins, as in a container); ``None`` when unset or taken from a Secret or ConfigMap (not read)."""
    value = None
    for var in spec.engine.env:
        if var.name == vllm.V2_RUNNER_ENV:
            value = var.value
    return vllm.parse_v2_runner_env(value)

"""Target mode for SGLang and TGI: their container in a target's pods, the flags it runs, and the rewrite.

Pure. Every engine fact is that engine's package's: how its server is started and which flags a rewrite
sets (:mod:`kvpilot.tuner.sglang.command`, :mod:`kvpilot.tuner.tgi.command`), its flags' parse and render
(the codecs of :mod:`kvpilot.operator.pods.engine_pods`). This module only chooses, by kind. vLLM's
counterparts are :mod:`kvpilot.tuner.vllm.command` and :mod:`.target`, which asks this module for the
other engines (:func:`.target.pod_carries`); the discovery and plan of such a target are
:mod:`.target_engine_plan`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from kvpilot.operator import api
from kvpilot.operator.planning.engines import EngineFlags
from kvpilot.operator.pods import engine_pods
from kvpilot.tuner import errors as tuner_errors
from kvpilot.tuner.sglang import SglangSettings
from kvpilot.tuner.sglang import command as sglang_command
from kvpilot.tuner.tgi import TgiSettings
from kvpilot.tuner.tgi import command as tgi_command

EngineCommandOf = sglang_command.SglangCommand | tgi_command.TgiCommand


@dataclass(frozen=True, slots=True)
class EngineCommand:
    """SGLang's server or TGI's launcher found in a container."""

    kind: api.EngineKind
    found: EngineCommandOf
    """The engine package's reading of the command line (and, for TGI, the environment)."""

    @property
    def model(self) -> str | None:
        return self.found.model

    @property
    def flags(self) -> tuple[str, ...]:
        return self.found.flags

    @property
    def form(self) -> str:
        return self.found.form


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """A recommendation in another engine's own flags (``status.recommendation.engineArgs``)."""

    kind: api.EngineKind
    args: tuple[str, ...]

    def settings(self) -> EngineFlags:
        """The flags parsed by the engine's own parser (InvalidEngineArgs when they do not parse)."""
        return parse_args(self.kind, self.args)


def literal_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's environment variables with literal values (the last one of a name wins)."""
    return {str(v["name"]): str(v["value"]) for v in container.get("env") or () if "value" in v}


def find_engine_command(container: Mapping[str, Any]) -> EngineCommand | None:
    """The SGLang server or TGI launcher the container runs, or ``None``."""
    command = [str(c) for c in container.get("command") or ()]
    args = [str(a) for a in container.get("args") or ()]
    sglang = sglang_command.find_sglang_command(command, args)
    if sglang is not None:
        return EngineCommand("SGLang", sglang)
    image = str(container.get("image") or "")
    tgi = tgi_command.find_tgi_command(command, args, image, literal_env(container))
    return EngineCommand("TGI", tgi) if tgi is not None else None


def find_engine_container(
    pod_spec: Mapping[str, Any], name: str | None
) -> tuple[Mapping[str, Any], EngineCommand] | None:
    """The container named ``name`` (any, when ``None``) that runs SGLang or TGI, and what it runs."""
    for c in pod_spec.get("containers") or ():
        if name is not None and c.get("name") != name:
            continue
        found = find_engine_command(c)
        if found is not None:
            return c, found
    return None


def parse_args(kind: api.EngineKind, args: Sequence[str]) -> EngineFlags:
    """``args`` read by ``kind``'s own parser (InvalidEngineArgs when a value does not parse)."""
    if kind == "SGLang":
        return engine_pods.SGLANG.parse(args)
    if kind == "TGI":
        return engine_pods.TGI.parse(args)
    raise tuner_errors.InvalidEngineArgs(f"kvpilot reads no {kind} flags here")


def compute_settings(command: EngineCommand) -> EngineFlags:
    """The tuned settings the command runs (InvalidEngineArgs when a value does not parse)."""
    return parse_args(command.kind, command.flags)


def shape_fields(kind: api.EngineKind) -> frozenset[str]:
    """The fields of ``kind``'s settings that are the pod's shape (its GPUs): a rewrite keeps the owner's."""
    return sglang_command.SHAPE_FIELDS if kind == "SGLang" else tgi_command.SHAPE_FIELDS


def tuned_part(kind: api.EngineKind, settings: EngineFlags) -> dict[str, object]:
    """The settings a recommendation changes (every field but the pod's shape)."""
    shape = shape_fields(kind)
    return {f.name: getattr(settings, f.name) for f in fields(settings) if f.name not in shape}


def rewrite_container(container: Mapping[str, Any], wanted: EngineArgs) -> dict[str, Any] | None:
    """The container with its tuned flags set to ``wanted`` by its engine's own rewrite (the owner's other
    flags, its model and its pod's shape kept); ``None`` when it runs another engine, runs ``wanted``
    already, or cannot be rewritten (a shell script that does not pass ``"$@"``, flags that do not parse)."""
    found = find_engine_command(container)
    if found is None or found.kind != wanted.kind:
        return None
    command = [str(c) for c in container.get("command") or ()]
    args = [str(a) for a in container.get("args") or ()]
    drop: frozenset[str] = frozenset()
    try:
        settings = wanted.settings()
        if isinstance(found.found, sglang_command.SglangCommand) and isinstance(settings, SglangSettings):
            new_command, new_args = sglang_command.rewrite_tuned_flags(command, args, found.found, settings)
        elif isinstance(found.found, tgi_command.TgiCommand) and isinstance(settings, TgiSettings):
            new_command, new_args, drop = tgi_command.rewrite_tuned_flags(
                command, args, found.found, settings
            )
        else:
            return None
    except tuner_errors.TunerError:
        return None
    env = [dict(v) for v in container.get("env") or ()]
    new_env = [v for v in env if v.get("name") not in drop]
    if (new_command, new_args, new_env) == (command, args, env):
        return None
    out = dict(container)
    if new_command or "command" in out:
        out["command"] = new_command
    if new_args or "args" in out:
        out["args"] = new_args
    if "env" in out:
        out["env"] = new_env
    return out


def container_carries(container: Mapping[str, Any], wanted: EngineArgs) -> bool:
    """Whether the container runs ``wanted``'s tuned flags (the pod's shape aside)."""
    found = find_engine_command(container)
    if found is None or found.kind != wanted.kind:
        return False
    try:
        running, recommended = compute_settings(found), wanted.settings()
    except tuner_errors.TunerError:
        return False
    return tuned_part(wanted.kind, running) == tuned_part(wanted.kind, recommended)

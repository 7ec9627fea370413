"""The engine a service's pods run beyond the tuned settings, as vLLM 0.33's memory budget needs it.

kvpilot tunes six flags (:data:`kvpilot.tuner.vllm.FLAGS`). Three more that a user may put in
``spec.engine.extraArgs`` change what vLLM takes at start-up, so a plan that ignored them would be the
plan of another engine:

* ``--enforce-eager`` (``--no-enforce-eager`` undoes it): no CUDA graphs are captured, so their pool is
  neither taken nor subtracted;
* ``--performance-mode {balanced,interactivity,throughput}``: ``interactivity`` captures every batch size
  from 1 to 32 (more graph memory), ``throughput`` doubles the batch defaults;
* ``--enable-prefix-caching`` / ``--no-enable-prefix-caching`` (``--disable-prefix-caching``): whether the
  state layers of a hybrid model keep align-mode pages (two or three a request);
* ``--enable-lora`` with ``--max-loras``, ``--max-lora-rank``, ``--lora-dtype`` and
  ``--fully-sharded-loras``: the LoRA buffers vLLM preallocates at load (:mod:`.lora`);
* ``--kv-transfer-config``: the KV connector and what it allocates after vLLM sizes the KV cache
  (:mod:`.kv_connectors`; LMCache's settings come from the pod's environment too).
* ``--speculative-config`` (``-sc``) and ``--spec-method`` / ``--spec-model`` / ``--spec-tokens``: the
  speculative decoding method and its draft tokens (:mod:`.speculative`): an MTP drafter's weights and KV
  layers are budgeted, ``ngram`` / ``suffix`` take nothing on the GPU, the other methods are named in the
  plan's warnings.

* ``--moe-backend``: the kernels that run a MoE model's routed experts (:mod:`.moe_backends`): ``cutlass`` on
  W4A4 NVFP4 experts is budgeted, other values are named in the plan's warnings.

* ``--data-parallel-size`` (``-dp``), ``--data-parallel-size-local``, ``--data-parallel-rank`` and
  ``--enable-expert-parallel`` (``-ep``): the pod runs data-parallel engines, each budgeted as one engine
  whose routed experts split over the whole group (:mod:`.parallel`).

``--max-num-active-seqs`` has no memory of its own, but it is read here too (:mod:`.active_seqs`): it is
the admission limit the plan reports and the closed loop compares the running requests with.

Each is read as vLLM's own parser reads it (``EngineArgs.add_cli_args``: the booleans are
``EnableDisableAction`` flags without a value, the last occurrence wins), which
``tests/contract/test_contract_engine_flags.py`` checks against that parser. vLLM accepts unique
prefixes of a flag; an abbreviation of these three is refused (:func:`check_engine_flags`), as are the
tuned flags', so kvpilot never plans for one engine while the pod runs another.

With ``VLLM_USE_V2_MODEL_RUNNER`` (read from the pod's environment by the operator) this is the whole of
what the memory model is told about the engine besides the release: :class:`EngineFlags`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from kvpilot.tuner import errors
from kvpilot.tuner.vllm.active_seqs import check_active_seqs, find_active_seqs
from kvpilot.tuner.vllm.args import check_choice, flag_value, iter_flags
from kvpilot.tuner.vllm.kv_connectors import (
    KV_TRANSFER_CONFIG_FLAG,
    KvConnector,
    check_kv_transfer_config,
    read_kv_connector,
)
from kvpilot.tuner.vllm.lora import LORA_FLAGS, LoraFlags, check_lora_flags, read_lora_flags
from kvpilot.tuner.vllm.moe_backends import MOE_BACKEND_FLAG, check_moe_backend, read_moe_backend
from kvpilot.tuner.vllm.parallel import (
    DATA_PARALLEL_FLAGS,
    DataParallel,
    check_data_parallel,
    read_data_parallel,
)
from kvpilot.tuner.vllm.speculative import (
    SPECULATIVE_CONFIG_SHORT,
    SPECULATIVE_FLAGS,
    SpeculativeFlags,
    check_speculative_flags,
    read_speculative_flags,
    speculative_flag_names,
)
from kvpilot.tuner.vllm.unmodelled import list_unmodelled_flags
from kvpilot.tuner.vllm.versions import PERFORMANCE_MODES

ENFORCE_EAGER_FLAG = "--enforce-eager"
PERFORMANCE_MODE_FLAG = "--performance-mode"
PREFIX_CACHING_FLAG = "--enable-prefix-caching"

_EAGER = {ENFORCE_EAGER_FLAG: True, "--no-enforce-eager": False}
_PREFIX_CACHING = {
    PREFIX_CACHING_FLAG: True,
    "--no-enable-prefix-caching": False,
    "--disable-prefix-caching": False,
}
_BOOLEANS = {**_EAGER, **_PREFIX_CACHING}
"""vLLM 0.33's spellings of the two booleans (``EnableDisableAction``: ``--x``, ``--no-x``; prefix caching
also ``--disable-prefix-caching``) and the value each sets."""

ENGINE_FLAGS = (
    *_BOOLEANS,
    PERFORMANCE_MODE_FLAG,
    *LORA_FLAGS,
    *SPECULATIVE_FLAGS,
    SPECULATIVE_CONFIG_SHORT,
    *DATA_PARALLEL_FLAGS,
    MOE_BACKEND_FLAG,
)
"""Every spelling :func:`build_engine_flags` reads."""


class BudgetKwargs(TypedDict):
    """:func:`kvpilot.tuner.memory.compute_budget`'s keyword arguments for an :class:`EngineFlags`."""

    model_runner_v2: bool | None
    enforce_eager: bool
    performance_mode: str | None
    enable_prefix_caching: bool | None
    lora: LoraFlags | None
    kv_connector: KvConnector | None
    speculative: SpeculativeFlags | None
    moe_backend: str | None


@dataclass(frozen=True, slots=True)
class EngineFlags:
    """What the memory model is told about the engine besides its release and the tuned settings."""

    model_runner_v2: bool | None = None
    """``VLLM_USE_V2_MODEL_RUNNER`` (``None``: unset, the release's default)."""
    enforce_eager: bool = False
    performance_mode: str | None = None
    """``None``: not given (vLLM's ``balanced``)."""
    enable_prefix_caching: bool | None = None
    """``None``: not given (vLLM's default for the model, :func:`.hybrid.prefix_caching_by_default`)."""
    lora: LoraFlags | None = None
    """``--enable-lora`` and the flags that size its buffers (:mod:`.lora`); ``None``: LoRA is off."""
    unmodelled: tuple[str, ...] = ()
    """Flags given that change memory kvpilot does not budget (:mod:`.unmodelled`); the plan names each."""
    speculative: SpeculativeFlags | None = None
    """``--speculative-config`` and ``--spec-*`` as kvpilot reads them (:mod:`.speculative`); ``None``: not
    given, or given in a form kvpilot does not read (``speculative_flags`` then names it)."""
    speculative_flags: tuple[str, ...] = ()
    """The speculative-decoding flags given (:func:`.speculative.speculative_flag_names`): the plan warns
    about each one whose memory it does not budget."""
    max_num_active_seqs: int | None = None
    """``--max-num-active-seqs`` (:mod:`.active_seqs`): the admission cap; ``None``: not given (the limit is
    ``max_num_seqs``). Not part of the memory budget: it has none of its own."""
    kv_connector: KvConnector | None = None
    """``--kv-transfer-config``'s connector (:mod:`.kv_connectors`); ``None``: none, or one not read (then
    ``--kv-transfer-config`` is in :attr:`unmodelled`)."""
    data_parallel: DataParallel | None = None
    """The data-parallel engines the pod runs and whether their experts split whole (:mod:`.parallel`);
    ``None``: one engine, experts split by tensor parallelism. Not a budget keyword: the budget is one
    engine's, and the group's expert shards are the topology's (``kvpilot.tuner.plan.topology``)."""
    moe_backend: str | None = None
    """``--moe-backend`` as vLLM keeps it (:func:`.moe_backends.read_moe_backend`); ``None``: not given, or
    ``auto``. The plan warns about a value whose kernel it does not budget on the model
    (:func:`kvpilot.tuner.memory.describe_unbudgeted_moe_backend`)."""

    def budget_kwargs(self) -> BudgetKwargs:
        """The keyword arguments :func:`kvpilot.tuner.memory.compute_budget` takes for these flags."""
        return BudgetKwargs(
            model_runner_v2=self.model_runner_v2,
            enforce_eager=self.enforce_eager,
            performance_mode=self.performance_mode,
            enable_prefix_caching=self.enable_prefix_caching,
            lora=self.lora,
            kv_connector=self.kv_connector,
            speculative=self.speculative,
            moe_backend=self.moe_backend,
        )


DEFAULT_ENGINE = EngineFlags()


def build_engine_flags(
    args: Sequence[str], model_runner_v2: bool | None = None, env: Mapping[str, str] | None = None
) -> EngineFlags:
    """The :class:`EngineFlags` of ``args`` (the user's extra arguments), the pods' model runner and their
    literal environment ``env`` (LMCache reads its settings there; ``None``: not known, its defaults).

    Never raises: a value vLLM would refuse is :func:`check_engine_flags`' to report, and is not read."""
    connector = read_kv_connector(args, env)
    unmodelled = list_unmodelled_flags(args)
    if connector is not None:  # budgeted, or warned by name with the connector's own reason
        unmodelled = tuple(flag for flag in unmodelled if flag != KV_TRANSFER_CONFIG_FLAG)
    flags = EngineFlags(
        model_runner_v2=model_runner_v2,
        unmodelled=unmodelled,
        kv_connector=connector,
        lora=read_lora_flags(args),
        speculative=read_speculative_flags(args),
        speculative_flags=speculative_flag_names(args),
        max_num_active_seqs=find_active_seqs(args),
        data_parallel=read_data_parallel(args),
        moe_backend=read_moe_backend(args),
    )
    for index, flag, inline in iter_flags(args):
        if flag in _EAGER and inline is None:
            flags = dataclasses.replace(flags, enforce_eager=_EAGER[flag])
        elif flag in _PREFIX_CACHING and inline is None:
            flags = dataclasses.replace(flags, enable_prefix_caching=_PREFIX_CACHING[flag])
        elif flag == PERFORMANCE_MODE_FLAG and (mode := flag_value(args, index, inline)) in PERFORMANCE_MODES:
            flags = dataclasses.replace(flags, performance_mode=mode)
    return flags


def check_engine_flags(args: Sequence[str]) -> None:
    """Refuse what vLLM 0.33's parser refuses of these flags (a value given to a boolean, a performance
    mode it does not know, a LoRA value :func:`.lora.check_lora_flags` refuses, a cap of sequences below 1, a
    ``--kv-transfer-config`` :func:`.kv_connectors.check_kv_transfer_config` refuses, a ``--moe-backend`` it
    does not know)
    and an abbreviation of one (kvpilot reads the full spellings only)."""
    check_lora_flags(args)
    check_active_seqs(args)
    check_kv_transfer_config(args)
    check_data_parallel(args)
    check_moe_backend(args)
    for index, flag, inline in iter_flags(args):
        if flag in LORA_FLAGS or flag in DATA_PARALLEL_FLAGS or flag.split(".", 1)[0] in SPECULATIVE_FLAGS:
            continue
        if flag == MOE_BACKEND_FLAG:
            continue
        if flag in _BOOLEANS:
            if inline is not None:
                raise errors.InvalidEngineArgs(
                    f"vLLM argument {flag} takes no value (vLLM refuses {flag}={inline}): write {flag} "
                    f"or its negation",
                    flag=flag,
                )
        elif flag == PERFORMANCE_MODE_FLAG:
            check_choice(flag, flag_value(args, index, inline), PERFORMANCE_MODES, "performance mode")
        elif len(flag) > 2 and flag.startswith("--"):
            for full in ENGINE_FLAGS:
                if full.startswith(flag):
                    raise errors.InvalidEngineArgs(
                        f"vLLM argument {flag} abbreviates {full}, which changes the memory kvpilot plans "
                        f"for; spell it out as {full}",
                        flag=flag,
                    )
    check_speculative_flags(args)  # after the abbreviations: a --spec-tok is named as one, not as a gap

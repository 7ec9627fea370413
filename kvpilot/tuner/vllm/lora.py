"""vLLM 0.33's LoRA: the flags that size its GPU buffers, their defaults, and the buffer shapes.

With ``--enable-lora`` vLLM wraps every LoRA-capable layer of the language model at load
(``LoRAModelManager._create_lora_modules``, ``lora/model_manager.py:476``, called from
``gpu_model_runner.py:5006`` inside the profiler whose figure is "Model loading took X GiB") and each
wrapper preallocates stacked A/B buffers for ``--max-loras`` slots at ``--max-lora-rank`` in the LoRA
dtype (``create_lora_weights``), whether or not an adapter is ever loaded. Those buffers are what
kvpilot budgets (:func:`kvpilot.tuner.memory.compute_lora_bytes` holds the arithmetic); the shapes below
are vLLM's, one ``(max_loras, 1, rows, cols)`` tensor per slice:

* ``MergedQKVParallelLinearWithLoRA`` (``qkv_proj`` packed from q, k, v;
  ``lora/layers/column_parallel_linear.py:453``) and ``MergedColumnParallelLinearWithLoRA``
  (``gate_up_proj``; ``:184``, ``create_lora_weights`` ``:207``): per slice A is ``rank x in`` (replicated;
  ``rank / tp`` with ``--fully-sharded-loras``), B is ``out_slice / tp x rank``;
* ``ColumnParallelLinearWithLoRA`` (an unpacked up projection) and ``ReplicatedLinearWithLoRA`` (a MoE
  router, ``GateLinear``): ``BaseLinearLayerWithLoRA.create_lora_weights``
  (``lora/layers/base_linear.py:104``);
* ``RowParallelLinearWithLoRA`` (``o_proj``, ``down_proj``; ``lora/layers/row_parallel_linear.py:22``): A is
  ``rank x in / tp``, B is ``out x rank`` (``out / tp`` with ``--fully-sharded-loras``,
  ``base_linear.py:123``);
* ``FusedMoEWithLoRA`` (routed experts; ``lora/layers/fused_moe.py:172``/``:205``): per expert, w1 and w3 A
  ``rank x hidden`` and B ``intermediate / tp x rank``, w2 A ``rank x intermediate / tp`` and B
  ``hidden x rank``; ``FusedMoE3DWithLoRA`` (``:486``, models whose ``is_3d_moe_weight``) keeps one w13 A
  and one B of twice the rows; an ``int32`` ``adapter_enabled`` of ``max_loras + 1`` (``:266``);
* ``VocabParallelEmbeddingWithLoRA`` (``lora/layers/vocab_parallel_embedding.py:25``): A is
  ``max_loras x vocab x rank`` and B ``hidden x rank``, neither split by TP; ``LogitsProcessorWithLoRA``
  (``lora/layers/logits_processor.py:84``): A ``rank x hidden``, B ``vocab x rank``, and with TP > 1 an
  ``int64`` map of the padded vocabulary. Only models whose class lists ``embed_tokens`` / ``lm_head``
  in ``embedding_modules`` get these (:mod:`.lora_architectures`).

One Punica wrapper for the language model (``model_manager.py:208``) holds ``int64`` index buffers of
``max_num_batched_tokens`` (four) and ``max_num_seqs`` (three) (``lora/punica_wrapper/punica_base.py:133``)
and two ``LoRAKernelMeta`` of two ``int32`` token buffers each (``punica_gpu.py:57``,
``lora/ops/triton_ops/lora_kernel_metadata.py:54``).

``--max-cpu-loras`` sizes a cache in host memory, not on the GPU. ``--lora-target-modules`` restricts
the wrapped modules; kvpilot budgets every module (an upper bound when it is given).
``tests/contract/test_contract_lora.py`` builds vLLM's own LoRA layers and checks these shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpilot.tuner import errors
from kvpilot.tuner.vllm.args import check_choice, flag_value, iter_flags

ENABLE_LORA_FLAG = "--enable-lora"
MAX_LORAS_FLAG = "--max-loras"
MAX_LORA_RANK_FLAG = "--max-lora-rank"
LORA_DTYPE_FLAG = "--lora-dtype"
FULLY_SHARDED_LORAS_FLAG = "--fully-sharded-loras"

DEFAULT_MAX_LORAS = 1
"""``LoRAConfig.max_loras`` (``config/lora.py:36``)."""
DEFAULT_MAX_LORA_RANK = 16
"""``LoRAConfig.max_lora_rank`` (``config/lora.py:34``)."""
MAX_LORA_RANKS = ("1", "8", "16", "32", "64", "128", "256", "320", "512")
"""``MaxLoRARanks`` (``config/lora.py:27``): the ranks vLLM accepts."""
LORA_DTYPES = ("auto", "float16", "bfloat16")
"""``LoRADType`` (``config/lora.py:26``); ``auto`` is the model's dtype (``verify_with_model_config``)."""
MAX_LORA_VOCAB = 258048
"""vLLM refuses LoRA on a larger vocabulary (``lora/layers/logits_processor.py:91``)."""

_ENABLE = {ENABLE_LORA_FLAG: True, "--disable-lora": False, "--no-enable-lora": False}
_FULLY_SHARDED = {FULLY_SHARDED_LORAS_FLAG: True, "--no-fully-sharded-loras": False}
"""The spellings vLLM 0.33's parser turns these booleans into (``EnableDisableAction``: ``--enable-lora`` /
``--disable-lora``, ``--no-enable-lora`` accepted too; ``engine/arg_utils.py:1610``, ``:1626``)."""

LORA_FLAGS = (*_ENABLE, *_FULLY_SHARDED, MAX_LORAS_FLAG, MAX_LORA_RANK_FLAG, LORA_DTYPE_FLAG)
"""Every spelling :func:`read_lora_flags` reads."""


@dataclass(frozen=True, slots=True)
class LoraFlags:
    """What sizes vLLM's LoRA buffers on the GPU (``EngineArgs.create_engine_config``,
    ``engine/arg_utils.py:2691``)."""

    max_loras: int = DEFAULT_MAX_LORAS
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    lora_dtype: str | None = None
    """``float16`` / ``bfloat16``; ``None``: ``auto``, the model's dtype."""
    fully_sharded: bool = False
    """``--fully-sharded-loras``: the replicated half of each pair is split by TP as well."""


def read_lora_flags(args: Sequence[str]) -> LoraFlags | None:
    """The :class:`LoraFlags` of ``args``, or ``None`` without ``--enable-lora`` (the last of
    ``--enable-lora`` / ``--disable-lora`` / ``--no-enable-lora`` wins).

    Never raises: a value vLLM would refuse is :func:`check_lora_flags`' to report and is not read."""
    enabled, flags = False, LoraFlags()
    for index, flag, inline in iter_flags(args):
        if flag in _ENABLE and inline is None:
            enabled = _ENABLE[flag]
        elif flag in _FULLY_SHARDED and inline is None:
            flags = LoraFlags(flags.max_loras, flags.max_lora_rank, flags.lora_dtype, _FULLY_SHARDED[flag])
        elif flag == MAX_LORAS_FLAG and (value := flag_value(args, index, inline)).isdigit() and int(value):
            flags = LoraFlags(int(value), flags.max_lora_rank, flags.lora_dtype, flags.fully_sharded)
        elif flag == MAX_LORA_RANK_FLAG and (value := flag_value(args, index, inline)) in MAX_LORA_RANKS:
            flags = LoraFlags(flags.max_loras, int(value), flags.lora_dtype, flags.fully_sharded)
        elif flag == LORA_DTYPE_FLAG and (value := flag_value(args, index, inline)) in LORA_DTYPES:
            dtype = None if value == "auto" else value
            flags = LoraFlags(flags.max_loras, flags.max_lora_rank, dtype, flags.fully_sharded)
    return flags if enabled else None


def check_lora_flags(args: Sequence[str]) -> None:
    """Refuse what vLLM 0.33's parser refuses of the flags :func:`read_lora_flags` reads: a value given to
    a boolean, a rank or dtype it does not know, a ``--max-loras`` below 1."""
    for index, flag, inline in iter_flags(args):
        if flag in _ENABLE or flag in _FULLY_SHARDED:
            if inline is not None:
                raise errors.InvalidEngineArgs(
                    f"vLLM argument {flag} takes no value (vLLM refuses {flag}={inline})", flag=flag
                )
        elif flag == MAX_LORA_RANK_FLAG:
            check_choice(flag, flag_value(args, index, inline), MAX_LORA_RANKS, "LoRA rank")
        elif flag == LORA_DTYPE_FLAG:
            check_choice(flag, flag_value(args, index, inline), LORA_DTYPES, "LoRA dtype")
        elif flag == MAX_LORAS_FLAG:
            value = flag_value(args, index, inline)
            if not value.isdigit() or int(value) < 1:
                raise errors.InvalidEngineArgs(
                    f"vLLM argument {flag} must be an integer of at least 1 (got {value!r})", flag=flag
                )

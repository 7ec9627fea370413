"""vLLM 0.33's speculative decoding: the flags that turn it on, the methods, and what an MTP drafter is.

The flags (``engine/arg_utils.py:1864``): ``--speculative-config`` (alias ``-sc``), a JSON object parsed
with ``json.loads`` and validated later by ``SpeculativeConfig``, and ``--spec-method``, ``--spec-model``,
``--spec-tokens``, which fill ``method``, ``model`` and ``num_speculative_tokens`` of that object and may
not repeat a key it already has (``EngineArgs.create_speculative_config``, ``:2100``).

The methods (``config/speculative.py``):

* every model-specific MTP spelling (``MTPModelTypes``, ``:38``: ``deepseek_mtp``, ``glm4_moe_mtp``,
  ``qwen3_next_mtp`` ...) is ``mtp`` (``SpeculativeConfig.__post_init__``, ``:1246``); with ``mtp`` and no
  ``model`` but with ``num_speculative_tokens`` the draft is the target checkpoint itself (``:1252``), its
  ``hf_config`` rewritten by ``hf_config_override`` (``:711``) into the drafter class of the target's
  ``model_type`` (DeepSeek-V3: ``DeepSeekMTPModel`` with ``n_predict = num_nextn_predict_layers``,
  ``:751``); a count above ``n_predict`` must be a multiple of it (the MTP layers are reused, ``:1603``).
  Without a count vLLM takes ``n_predict`` only when a ``model`` is given (``:1599``); with neither it
  refuses (``_verify_args``, ``:1946``), as it does for every method but ``suffix`` (``:1735``);
* ``ngram`` (or a ``model`` of ``ngram``) and ``suffix`` have no model: the ``NgramProposer`` runs on the
  CPU (numba) and ``SuffixDecodingProposer`` on the CPU (Arctic Inference), neither allocates on the GPU
  (``v1/worker/gpu_model_runner.py:614``, ``:648``); ``ngram_gpu`` does (``:624``: a ``max_num_seqs x
  max_model_len`` ``int32`` token table, not budgeted);
* ``eagle``, ``eagle3``, ``draft_model`` (the default when a ``model`` is given without a method,
  ``:1244``; a name holding ``eagle-``, ``eagle3``, ``dflash`` or ``dspark`` makes it that method,
  :func:`draft_method_by_name`), ``dflash``, ``dspark``, ``extract_hidden_states``, ``custom_class`` load
  another model or code: kvpilot does not read their checkpoints, so the plan names them as not budgeted;
  ``eagle3`` and ``draft_model`` are budgeted when the draft's ``config.json`` is given as data
  (:attr:`SpeculativeFlags.draft_config`, :mod:`.eagle3`, :mod:`.draft_model`).

An MTP drafter (``model_executor/models/deepseek_mtp.py``): one ``DeepSeekMultiTokenPredictorLayer`` per
``num_nextn_predict_layers`` (``:144``), each an ``enorm`` and ``hnorm`` (RMSNorm), an ``eh_proj``
(``nn.Linear(2h, h)``: neither split by TP nor quantized), a ``shared_head`` (RMSNorm and a
``ParallelLMHead``) and an ``mtp_block``, a ``DeepseekV2DecoderLayer`` of index ``num_hidden_layers + i``
(past ``first_k_dense_replace``: a MoE layer, quantized as the target's), whose attention is one more KV
layer in the pool (``v1/spec_decode/llm_base_proposer.py:1328``: the draft's attention layers join the KV
cache config); the predictor's ``embed_tokens`` (``:155``). With one pipeline stage the proposer then
``del``\\ etes the draft's embedding and every ``shared_head.head`` and points them at the target's
(``llm_base_proposer.py:1418``, ``:1510``, "Detected MTP model"), inside the ``DeviceMemoryProfiler`` of
"Model loading took" (``gpu_model_runner.py:4989``), which measures allocated bytes
(``platforms/cuda.py:369``): they cost nothing after load.

GLM-4.5's drafter (``model_executor/models/glm4_moe_mtp.py``, target architecture ``Glm4MoeForCausalLM``,
``config/speculative.py:848``) has DeepSeek's shape: one ``Glm4MoeMultiTokenPredictorLayer`` per
``num_nextn_predict_layers`` (``:147``), each an ``enorm`` and ``hnorm`` (``:90``), an unsplit ``eh_proj``
(``nn.Linear(2h, h)``, ``:92``), a ``SharedHead`` (RMSNorm and ``ParallelLMHead``, ``:60``, ``:93``) and an
``mtp_block``, a ``Glm4MoeDecoderLayer`` of index ``num_hidden_layers + i`` (``:98``; past
``first_k_dense_replace`` a ``Glm4MoE`` layer, ``glm4_moe.py:355``, its gate's ``e_score_correction_bias``
fp32, ``:148``) whose attention is GQA full attention with the target's heads, bias and QK norm: one
more full-attention KV layer; the predictor's ``embed_tokens`` (``:153``). The proposer shares its
embedding and heads with the target's exactly as DeepSeek's (the "Detected MTP model" branches above
match any drafter without ``has_own_embed_tokens`` / ``has_own_lm_head``; so does Model Runner V2's
``load_eagle_model``, ``v1/worker/gpu/spec_decode/eagle/utils.py:18`` ``_should_share``, ``:74``, ``:109``,
and every layer's ``shared_head.head``, ``:121``: ``Glm4MoeMTP`` declares neither flag).

Qwen3-Next's drafter (``model_executor/models/qwen3_next_mtp.py``; target ``model_type`` ``qwen3_next``,
``config/speculative.py:908``-``:914``: ``Qwen3NextMTP``, ``n_predict`` the config's
``num_nextn_predict_layers``, which the published config lacks: ``None``, so vLLM takes no count from it
and the predictor builds ``getattr(config, "num_nextn_predict_layers", 1)`` layers, ``:63``) and Qwen3.5 /
Qwen3.6's (``qwen3_5_mtp.py``; ``model_type`` ``qwen3_5``, ``qwen3_5_moe`` and their ``_text`` forms,
``config/speculative.py:987``-``:1008``: ``Qwen3_5MTP`` / ``Qwen3_5MoeMTP``, ``n_predict`` the text
config's ``mtp_num_hidden_layers``, the predictor's count with default 1, ``:82``) share one shape: one
``Qwen3NextDecoderLayer`` / ``Qwen3_5DecoderLayer`` per MTP layer built with ``layer_type="full_attention"``
(``qwen3_next_mtp.py:89``-``:96``, ``qwen3_5_mtp.py:118``-``:125``): gated full attention with the target's
heads and QK norm, the target's MoE (or MLP), quantized as the target's: a copy of the target's last
full-attention layer and one more full-attention KV layer; and, once per drafter, not per layer, an
``fc`` (``ColumnParallelLinear(2h, h, gather_output=True)``, ``qwen3_next_mtp.py:79``, ``qwen3_5_mtp.py:98``:
split over TP, quantized as the target's save ModelOpt FP4) and three RMSNorms (``norm``,
``pre_fc_norm_hidden``, ``pre_fc_norm_embedding``, ``qwen3_next_mtp.py:107``-``:113``,
``qwen3_5_mtp.py:135``-``:141``); its ``embed_tokens`` and a top-level ``lm_head``, both the target's
after load (neither class declares ``has_own_embed_tokens`` / ``has_own_lm_head``: the "Detected MTP
model" branches and ``_should_share`` above).

With speculative decoding a gated DeltaNet layer's state grows too (:mod:`.hybrid`): its conv state holds
``conv_kernel - 1 + num_speculative_tokens`` positions (``QwenGatedDeltaNetAttention.get_state_shape``,
``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:545``, and the model's
``get_mamba_state_shape_from_config``, ``qwen3_next.py:893``-``:912``, ``qwen3_5.py:399``, ``:620``:
``num_spec`` = ``speculative_config.num_speculative_tokens``, into
``MambaStateShapeCalculator.gated_delta_net_state_shape``, ``mamba_utils.py:272``-``:293``), and each
request holds ``num_speculative_tokens`` more state pages (``MambaBase.get_kv_cache_spec``,
``model_executor/layers/mamba/abstract.py:86``: ``num_speculative_blocks``;
``MambaSpec.max_memory_usage_bytes``, ``v1/kv_cache_interface.py:1135``). Both are held to vLLM's own
classes by ``tests/contract/test_contract_speculative.py``.

The proposer's own buffers (``llm_base_proposer.py:184``-``:265``), allocated with the model runner after
the worker's init snapshot: ``input_ids`` (``int32``), ``positions`` and the slot mapping (``int64``) of
``max_num_batched_tokens``, ``hidden_states`` and ``inputs_embeds`` of ``max_num_batched_tokens x
hidden`` in the model dtype, an ``int32`` ``arange`` of ``max(max_num_seqs + 1, max_num_batched_tokens)``
and an ``int32`` ``backup_next_token_ids`` of ``max_num_seqs``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpilot.tuner import errors
from kvpilot.tuner.vllm.args import find_flag_values, iter_flags

SPECULATIVE_CONFIG_FLAG = "--speculative-config"
SPEC_METHOD_FLAG = "--spec-method"
SPEC_MODEL_FLAG = "--spec-model"
SPEC_TOKENS_FLAG = "--spec-tokens"
SPECULATIVE_FLAGS = (SPECULATIVE_CONFIG_FLAG, SPEC_METHOD_FLAG, SPEC_MODEL_FLAG, SPEC_TOKENS_FLAG)
"""The flags that configure speculative decoding in vLLM 0.33 (``engine/arg_utils.py:1866``-``:1872``)."""
SPECULATIVE_CONFIG_SHORT = "-sc"
"""``--speculative-config``'s short form (``engine/arg_utils.py:1866``)."""

MTP = "mtp"
MTP_METHODS = (
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp",
    "glm_ocr_mtp", "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp", "qwen3_next_mtp",
    "qwen4_exp_mtp", "qwen3_5_mtp", "longcat_flash_mtp", "bailing_hybrid_v3_mtp", "minimax_m3_mtp",
    "bailing_hybrid_mtp", "mtp", "kimi_k3_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp", "step5_mtp",
    "hy_v3_mtp", "hy_v4_mtp", "gemma4_mtp", "inkling_mtp", "glm5_next_mtp",
)  # fmt: skip
"""``MTPModelTypes`` (``config/speculative.py:38``): each is ``mtp`` (``:1246``)."""
NGRAM, SUFFIX = "ngram", "suffix"
SUFFIX_DEFAULT_TOKENS = 24
"""``num_speculative_tokens`` of suffix decoding given none: ``suffix_decoding_max_tree_depth``'s default
(0.33 ``config/speculative.py:538``, ``:1735``; kvpilot does not read that key)."""
NO_MODEL_METHODS = (NGRAM, SUFFIX)
"""Methods whose proposer runs on the CPU and loads no model (``gpu_model_runner.py:614``, ``:648``)."""
NGRAM_SPELLINGS = ("ngram", "[ngram]")
"""``method`` (or, without a method, ``model``) spellings vLLM reads as ``ngram`` (``:1241``, ``:1297``)."""
DRAFT_OVERRIDE_KEYS = ("kv_cache_dtype", "quantization")
"""Keys of the speculative config that change a draft model's memory: its KV cache dtype (the target's
when absent, ``config/speculative.py:448``) and its weights' quantization (``:435``)."""
DRAFT_MODEL = "draft_model"
"""A separate draft model (``config/speculative.py:76``; :mod:`.draft_model`)."""
DRAFT_NAME_METHODS = (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark"))
"""The substrings of a draft ``model`` (lower-cased) that make ``draft_model`` another method once the
draft's ``ModelConfig`` is built, in vLLM's order of tests (``config/speculative.py:1445``-``:1457``)."""


def draft_method_by_name(model: str | None) -> str | None:
    """The method vLLM detects from a draft ``model``'s name under ``draft_model``; ``None``: none."""
    name = (model or "").lower()
    return next((method for part, method in DRAFT_NAME_METHODS if part in name), None)


@dataclass(frozen=True, slots=True)
class MtpDrafter:
    """The drafter class vLLM 0.33 builds from a target ``model_type`` for ``method: mtp``."""

    architecture: str
    """The class ``hf_config_override`` names (``config/speculative.py:751``)."""
    layers_key: str
    """The target config's key of the MTP layer count (``n_predict``)."""
    default_layers: int
    """The count when the config lacks the key: the transformers config class's default, which vLLM's
    ``getattr(hf_config, layers_key)`` reads (Qwen: the predictor's own ``getattr`` default)."""
    projection_per_layer: bool = True
    """Whether each MTP layer has its own ``2h -> h`` projection and three RMSNorms (DeepSeek, GLM:
    ``eh_proj``, ``enorm``, ``hnorm``, ``shared_head.norm``), or the drafter one of each for all its
    layers (Qwen: ``fc``, ``norm``, ``pre_fc_norm_hidden``, ``pre_fc_norm_embedding``)."""
    projection_split_by_tp: bool = False
    """Whether the projection is split over TP (Qwen's ``ColumnParallelLinear``) or whole on every rank
    (DeepSeek's and GLM's ``nn.Linear``)."""


MTP_DRAFTERS: Mapping[str, MtpDrafter] = {
    # config/speculative.py:749-763: deepseek_v3 -> deepseek_mtp -> DeepSeekMTPModel (V3.2 and GLM-5's
    # glm_moe_dsa get DeepseekV32MTPModel, with an indexer: not modelled)
    # transformers' DeepseekV3Config: num_nextn_predict_layers (alias num_mtp_layers) defaults to 1
    "deepseek_v3": MtpDrafter("DeepSeekMTPModel", "num_nextn_predict_layers", 1),
    # config/speculative.py:848-856: architecture Glm4MoeForCausalLM (GLM-4.5, 4.6, 4.7; model_type
    # glm4_moe) -> glm4_moe_mtp -> Glm4MoeMTPModel (model_executor/models/glm4_moe_mtp.py), the same
    # shape as DeepSeek's: see "GLM-4.5's drafter" above.
    # transformers' Glm4MoeConfig: num_nextn_predict_layers defaults to 1
    "glm4_moe": MtpDrafter("Glm4MoeMTPModel", "num_nextn_predict_layers", 1),
    # config/speculative.py:908-914: qwen3_next -> qwen3_next_mtp -> Qwen3NextMTP; the layer count
    # defaults to 1 in the predictor (qwen3_next_mtp.py:63): see "Qwen3-Next's drafter" above
    "qwen3_next": MtpDrafter("Qwen3NextMTP", "num_nextn_predict_layers", 1, False, True),
    # config/speculative.py:987-1008: qwen3_5 / qwen3_5_text -> Qwen3_5MTP, qwen3_5_moe /
    # qwen3_5_moe_text -> Qwen3_5MoeMTP; mtp_num_hidden_layers, default 1 (qwen3_5_mtp.py:82)
    "qwen3_5": MtpDrafter("Qwen3_5MTP", "mtp_num_hidden_layers", 1, False, True),
    "qwen3_5_moe": MtpDrafter("Qwen3_5MoeMTP", "mtp_num_hidden_layers", 1, False, True),
    "qwen3_5_moe_text": MtpDrafter("Qwen3_5MoeMTP", "mtp_num_hidden_layers", 1, False, True),
    "qwen3_5_text": MtpDrafter("Qwen3_5MTP", "mtp_num_hidden_layers", 1, False, True),
}
"""Target ``model_type`` -> its MTP drafter, for the drafters kvpilot budgets
(``tests/contract/test_contract_speculative.py`` builds each on the meta device)."""


@dataclass(frozen=True, slots=True)
class SpeculativeFlags:
    """What ``--speculative-config`` (and ``--spec-*``) ask of vLLM, as kvpilot reads it."""

    method: str
    """vLLM's method after its own mapping (an MTP spelling is ``mtp``, ``[ngram]`` is ``ngram``)."""
    num_speculative_tokens: int | None = None
    """``None``: not given (MTP takes the drafter's ``n_predict``; vLLM refuses it missing otherwise)."""
    given_method: str = ""
    """The method as the user spelled it (for messages)."""
    draft_model: str | None = None
    """The ``model`` given (a draft checkpoint kvpilot does not read); ``None``: none."""
    draft_config: Mapping[str, Any] | None = field(default=None, hash=False)
    """The draft checkpoint's ``config.json``, given as data (``kvpilot plan --draft-config``, the operator's
    ConfigMap key or Hub download): what lets the budget count an EAGLE3 drafter (:mod:`.eagle3`) or a
    separate draft model (:mod:`.draft_model`); ``None``: not given."""
    draft_config_hint: str | None = None
    """How the caller gives :attr:`draft_config`, for the plan's warning when it is missing (the operator:
    its ConfigMap key); ``None``: ``kvpilot plan``'s ``--draft-config``."""
    draft_revision: str | None = None
    """The speculative config's ``revision``: the draft checkpoint's revision on the Hugging Face Hub
    (``config/speculative.py:455``, the draft's ``ModelConfig``, ``:1420``; ``None``: not given, the
    default branch; the target's ``--revision`` is not the draft's)."""
    draft_tensor_parallel_size: int | None = None
    """``draft_tensor_parallel_size`` (``None``: not given, the target's TP;
    ``config/speculative.py:1859``)."""
    heterogeneous_vocab: bool = False
    """``use_heterogeneous_vocab``: a draft model of another vocabulary allowed (``:496``)."""
    draft_overrides: tuple[str, ...] = ()
    """The keys given of :data:`DRAFT_OVERRIDE_KEYS`, which change the draft's memory and kvpilot does not
    read."""


def _short_to_long(args: Sequence[str]) -> list[str]:
    """``args`` with ``-sc`` spelled ``--speculative-config`` (``iter_flags`` canonicalises long flags)."""
    out = []
    for token in args:
        name, sep, value = token.partition("=")
        out.append(SPECULATIVE_CONFIG_FLAG + sep + value if name == SPECULATIVE_CONFIG_SHORT else token)
    return out


def _config_object(args: Sequence[str]) -> dict[str, Any] | None:
    """The JSON object of the last ``--speculative-config`` (``None``: not given); raises on what
    ``json.loads`` or ``SpeculativeConfig`` refuse before any model is read."""
    values = find_flag_values(_short_to_long(args), SPECULATIVE_CONFIG_FLAG)
    if not values:
        return None
    text = values[-1]
    try:
        loaded = json.loads(text)
    except ValueError:
        raise errors.InvalidEngineArgs(
            f"vLLM argument {SPECULATIVE_CONFIG_FLAG} takes a JSON object, such as "
            f'\'{{"method": "mtp", "num_speculative_tokens": 1}}\' (got {text[:80]!r})',
            flag=SPECULATIVE_CONFIG_FLAG,
        ) from None
    if not isinstance(loaded, dict):
        raise errors.InvalidEngineArgs(
            f"vLLM argument {SPECULATIVE_CONFIG_FLAG} takes a JSON object (got {text[:80]!r})",
            flag=SPECULATIVE_CONFIG_FLAG,
        )
    return {str(key).replace("-", "_"): value for key, value in loaded.items()}  # arg_utils.py:2126


def _merged(args: Sequence[str]) -> tuple[dict[str, Any] | None, str]:
    """The object vLLM validates (``create_speculative_config``: each ``--spec-*`` value added to the
    JSON's keys, never over one, ``arg_utils.py:2108``) and the flag that carried its method."""
    config = _config_object(args)
    source = SPECULATIVE_CONFIG_FLAG
    for flag, key in (
        (SPEC_METHOD_FLAG, "method"),
        (SPEC_MODEL_FLAG, "model"),
        (SPEC_TOKENS_FLAG, "num_speculative_tokens"),
    ):
        values = find_flag_values(args, flag)
        if not values:
            continue
        config = {} if config is None else config
        if key in config:
            raise errors.InvalidEngineArgs(
                f"vLLM argument {flag} and {SPECULATIVE_CONFIG_FLAG}['{key}'] are mutually exclusive "
                "(vLLM refuses both)",
                flag=flag,
            )
        value: Any = values[-1]
        if key == "num_speculative_tokens":
            if not value.isdigit() or int(value) < 1:
                raise errors.InvalidEngineArgs(
                    f"vLLM argument {flag} must be an integer of at least 1 (got {value[:32]!r})", flag=flag
                )
            value = int(value)
        config[key] = value
        if key == "method":
            source = flag
    return config, source


def read_speculative_flags(args: Sequence[str]) -> SpeculativeFlags | None:
    """The :class:`SpeculativeFlags` of ``args``, or ``None`` without speculative decoding.

    Never raises: what :func:`check_speculative_flags` refuses is not read (``None``)."""
    try:
        return _read(args)
    except errors.InvalidEngineArgs:
        return None


def _read(args: Sequence[str]) -> SpeculativeFlags | None:
    config, source = _merged(args)
    if config is None:
        return None
    method, model = config.get("method"), config.get("model")
    tokens = config.get("num_speculative_tokens")
    if method is not None and not isinstance(method, str):
        raise errors.InvalidEngineArgs(
            f"vLLM argument {source}: the method must be a string (got {method!r})", flag=source
        )
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise errors.InvalidEngineArgs(
            f"vLLM argument {source}: num_speculative_tokens must be an integer of at least 1 "
            f"(SpeculativeConfig: gt=0; got {tokens!r})",
            flag=SPECULATIVE_CONFIG_FLAG,
        )
    given = method or ""
    if method is None:  # config/speculative.py:1236-1244
        method = NGRAM if model in NGRAM_SPELLINGS else DRAFT_MODEL
        given = f"model {model!r}" if model is not None else "no method"
    if method == DRAFT_MODEL and isinstance(model, str):  # the name decides first (:1445-:1457)
        method = draft_method_by_name(model) or method
    if method in MTP_METHODS:
        method = MTP
    elif method in NGRAM_SPELLINGS:
        method = NGRAM
    if tokens is None and method != SUFFIX and not (method == MTP and model is not None):
        # config/speculative.py:1946: vLLM refuses a missing count, save for suffix decoding
        # (suffix_decoding_max_tree_depth, :1735) and a draft model whose config has n_predict (:1599)
        raise errors.InvalidEngineArgs(
            f"vLLM argument {source}: method {given!r} needs num_speculative_tokens (vLLM refuses it "
            "missing)",
            flag=SPECULATIVE_CONFIG_FLAG,
        )
    if config.get("tensor_parallel_size") is not None:  # config/speculative.py:1940
        raise errors.InvalidEngineArgs(
            f"vLLM argument {SPECULATIVE_CONFIG_FLAG}: 'tensor_parallel_size' is not a valid key (vLLM "
            "refuses it); pass 'draft_tensor_parallel_size'",
            flag=SPECULATIVE_CONFIG_FLAG,
        )
    draft_tp = config.get("draft_tensor_parallel_size")
    if draft_tp is not None and (isinstance(draft_tp, bool) or not isinstance(draft_tp, int) or draft_tp < 1):
        raise errors.InvalidEngineArgs(
            f"vLLM argument {SPECULATIVE_CONFIG_FLAG}: draft_tensor_parallel_size must be an integer of at "
            f"least 1 (SpeculativeConfig: ge=1; got {draft_tp!r})",
            flag=SPECULATIVE_CONFIG_FLAG,
        )
    revision = config.get("revision")
    return SpeculativeFlags(
        method,
        tokens,
        given,
        model if isinstance(model, str) else None,
        draft_revision=revision if isinstance(revision, str) and revision else None,
        draft_tensor_parallel_size=draft_tp,
        heterogeneous_vocab=config.get("use_heterogeneous_vocab") is True,
        draft_overrides=tuple(key for key in DRAFT_OVERRIDE_KEYS if config.get(key) is not None),
    )


def check_speculative_flags(args: Sequence[str]) -> None:
    """Refuse what vLLM 0.33 refuses of these flags before reading any model: a value that is not a JSON
    object, a method that is not a string, a count below 1, a ``--spec-*`` flag repeating a key of
    ``--speculative-config``, a method that needs ``num_speculative_tokens`` without it."""
    _read(args)


def speculative_flag_names(args: Sequence[str]) -> tuple[str, ...]:
    """The speculative flags of ``args`` (``-sc`` as ``--speculative-config``; a dotted
    ``--speculative-config.x`` counts as ``--speculative-config``), each once, in order."""
    found: list[str] = []
    for _, flag, _ in iter_flags(_short_to_long(args)):
        base = flag.split(".", 1)[0]
        if base in SPECULATIVE_FLAGS and base not in found:
            found.append(base)
    return tuple(found)


def has_dotted_speculative_config(args: Sequence[str]) -> bool:
    """Whether ``args`` set ``--speculative-config.field`` (vLLM's dotted form), which kvpilot does not
    read: the plan then names speculative decoding as not budgeted."""
    return any(flag.startswith(SPECULATIVE_CONFIG_FLAG + ".") for _, flag, _ in iter_flags(args))

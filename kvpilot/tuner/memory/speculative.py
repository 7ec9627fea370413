"""The GPU memory vLLM 0.33 takes for speculative decoding (``--speculative-config``) on one rank.

:mod:`kvpilot.tuner.vllm.speculative` holds vLLM's facts and cites them; this is the arithmetic.

Budgeted, for ``method: mtp`` with a drafter kvpilot models (:data:`kvpilot.tuner.vllm.MTP_DRAFTERS`)
and one pipeline stage:

* the drafter's weights, loaded inside "Model loading took X GiB": per MTP layer one more decoder layer
  of the target's (MoE or MLP, quantized as the target's; DeepSeek-V3's MLA, GLM-4.5's GQA, Qwen3-Next's
  and Qwen3.5 / 3.6's gated full attention), and its ``2h x h`` projections in the model dtype with three
  RMSNorms each (DeepSeek, GLM: an ``eh_proj`` per MTP layer, whole on every TP rank; Qwen: one ``fc``
  for all, split over TP); its embedding and LM head are the target's after load;
* its KV layers: each MTP layer's attention is one more layer of the target's kind in the KV pool, so a
  GiB holds fewer tokens (:func:`with_mtp_layers` is the model the KV layout is computed for);
* a gated-DeltaNet hybrid's state (Qwen3-Next, Qwen3.5, Qwen3.6): ``num_speculative_tokens`` more conv
  positions per state page and that many more state pages per request
  (:func:`speculative_state_tokens`, threaded into :func:`kvpilot.tuner.memory.compute_kv_layout`);
* the proposer's buffers (``max_num_batched_tokens`` ids, positions, slot mapping, hidden states and
  input embeddings; ``max_num_seqs`` ids), allocated after the init snapshot.

``ngram`` and ``suffix`` run on the CPU: nothing on the GPU beyond what the wider batches change.

The CUDA graphs: the target's for uniform-decode batches of ``1 + num_speculative_tokens`` tokens and a
counted drafter's (MTP, EAGLE3, a draft model) are in the graph estimate (:mod:`.graphs`,
:func:`kvpilot.tuner.vllm.cuda_graph_counts`, :func:`.budget.graph_speculation`).

Not budgeted (:func:`speculative_unbudgeted_reason` names what; the plan warns): the graphs of a drafter
kvpilot does not count, the drafter's and the rejection sampler's share of the profile run; EAGLE / DFlash /
DSpark drafters (kvpilot does not read their checkpoints) and MTP drafters of
other families. An EAGLE3 drafter of Llama's shape is budgeted when its ``config.json`` is given
(``SpeculativeFlags.draft_config``; :mod:`.eagle3`: its weights, its KV layers, the same proposer
buffers); so is a separate draft model (``draft_model``; :mod:`.draft_model`: the whole model's weights,
its KV layers, the standalone speculator's buffers); without the config the plan says how to give it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvpilot.tuner import errors, vllm
from kvpilot.tuner.memory.draft_model import (
    budgeted_draft_model,
    check_draft_model,
    compute_draft_model_weight_bytes,
    draft_model_unbudgeted_reason,
    with_draft_model_layers,
)
from kvpilot.tuner.memory.eagle3 import (
    budgeted_eagle3_draft,
    compute_eagle3_weight_bytes,
    eagle3_unbudgeted_reason,
    with_eagle3_layers,
)
from kvpilot.tuner.memory.weights import compute_weight_breakdown
from kvpilot.tuner.model import DTYPE_BYTES, LINEAR, Eagle3DraftSpec, ModelSpec

_INT32, _INT64, _FP32 = 4, 8, 4


def speculative_unbudgeted_reason(
    model: ModelSpec, spec: vllm.SpeculativeFlags, pp: int = 1, tp: int | None = None
) -> str | None:
    """Why kvpilot cannot budget ``spec`` for this model (``tp``: the target's, when known), or ``None``
    when it does."""
    if spec.method in vllm.NO_MODEL_METHODS:
        return None
    if spec.method == vllm.EAGLE3:  # budgeted given the draft's config.json (:mod:`.eagle3`)
        return eagle3_unbudgeted_reason(spec, pp)
    if spec.method == vllm.DRAFT_MODEL:  # budgeted given the draft's config.json (:mod:`.draft_model`)
        return draft_model_unbudgeted_reason(spec, pp, tp)
    if spec.method != vllm.MTP:
        return (
            f"method {spec.given_method!r} loads a draft model (its own config.json and weights) that "
            "kvpilot does not read"
        )
    if spec.draft_model is not None:
        return f"method 'mtp' with the draft checkpoint {spec.draft_model!r}, which kvpilot does not read"
    if model.model_type not in vllm.MTP_DRAFTERS:
        modelled = ", ".join(sorted(vllm.MTP_DRAFTERS))
        return (
            f"vLLM's MTP drafter for {model.architecture} (model_type {model.model_type!r}) is not "
            f"modelled (kvpilot models the MTP drafters of model_type {modelled})"
        )
    if pp > 1:
        return "with pipeline parallelism the drafter loads its own embedding; kvpilot models one stage"
    return None


def describe_unbudgeted_speculative(
    model: ModelSpec,
    spec: vllm.SpeculativeFlags | None,
    flags: tuple[str, ...],
    pp: int = 1,
    tp: int | None = None,
) -> str | None:
    """The plan's warning when speculative decoding is given (``flags``: the spellings given) and kvpilot
    does not budget its drafter, naming the flag, why and what to do; ``None`` when nothing is given or
    it is budgeted."""
    if not flags:
        return None
    flag = flags[0]
    if spec is None:  # a dotted --speculative-config.field, which kvpilot does not read
        return (
            f"{flag} is not in kvpilot's memory model in this form (give --speculative-config one JSON "
            "object): the drafter's weights and KV cache, and the CUDA graphs for uniform-decode batches of "
            "1 + num_speculative_tokens tokens, are not budgeted; lower --gpu-memory-utilization "
            f"by their size, or pin --kv-cache-memory-bytes; {vllm.SPECULATIVE_UNBUDGETED}."
        )
    reason = speculative_unbudgeted_reason(model, spec, pp, tp)
    if reason is None:
        return None
    return (
        f"{flag} is not in kvpilot's memory model for {model.architecture} ({reason}): the drafter's "
        "weights and KV cache are not budgeted; lower --gpu-memory-utilization by their size, or pin "
        f"--kv-cache-memory-bytes; {vllm.SPECULATIVE_UNBUDGETED}."
    )


def check_speculative_model(
    model: ModelSpec, spec: vllm.SpeculativeFlags, tensor_parallel_size: int | None = None
) -> None:
    """Refuse what vLLM 0.33 refuses of an MTP drafter for this model: a checkpoint without MTP layers,
    a ``num_speculative_tokens`` above the layers that is not a multiple of them
    (``config/speculative.py:1603``); and of a draft model (:func:`.draft_model.check_draft_model`). With
    the target's ``tensor_parallel_size`` (the planner's, once chosen), a ``draft_tensor_parallel_size``
    neither 1 nor it, whatever the method (:func:`kvpilot.tuner.vllm.check_draft_tensor_parallel`)."""
    check_draft_model(model, spec, tensor_parallel_size)
    if spec.method == vllm.MTP and spec.draft_model is None and model.model_type in vllm.MTP_DRAFTERS:
        _check_mtp_layers(model, spec)  # else another checkpoint's drafter: not read
    if tensor_parallel_size is not None:
        vllm.check_draft_tensor_parallel(spec.draft_tensor_parallel_size, tensor_parallel_size)


def _check_mtp_layers(model: ModelSpec, spec: vllm.SpeculativeFlags) -> None:
    """The checkpoint's MTP layers against ``method: mtp`` and its ``num_speculative_tokens``."""
    key = vllm.MTP_DRAFTERS[model.model_type].layers_key
    layers, tokens = model.num_mtp_layers, spec.num_speculative_tokens
    if layers < 1:
        raise errors.InvalidEngineArgs(
            f"{vllm.SPECULATIVE_CONFIG_FLAG}: method 'mtp' needs the checkpoint's MTP layers, and "
            f"{model.architecture}'s config has {key} = 0",
            flag=vllm.SPECULATIVE_CONFIG_FLAG,
        )
    if tokens is not None and tokens > layers and tokens % layers:
        raise errors.InvalidEngineArgs(
            f"{vllm.SPECULATIVE_CONFIG_FLAG}: num_speculative_tokens {tokens} must be divisible by the "
            f"{layers} MTP layers of {model.architecture} ({key}; vLLM refuses it)",
            flag=vllm.SPECULATIVE_CONFIG_FLAG,
        )


def budgets_mtp(model: ModelSpec, spec: vllm.SpeculativeFlags | None, pp: int = 1) -> bool:
    """Whether the budget counts an MTP drafter for ``spec`` (else: no drafter, or one not modelled)."""
    return (
        spec is not None
        and spec.method == vllm.MTP
        and model.num_mtp_layers > 0
        and speculative_unbudgeted_reason(model, spec, pp) is None
    )


@dataclass(frozen=True, slots=True)
class Drafter:
    """The drafter the budget counts for a speculative config, resolved once (:func:`resolve_drafter`: a
    draft's ``config.json`` read once) and handed to each term that sizes it: its weights and the
    proposer's buffers (:func:`compute_drafter_bytes`), its KV layers (:func:`with_drafter_layers`), a
    hybrid's state (:attr:`state_holds_draft_tokens`)."""

    method: str
    """:data:`kvpilot.tuner.vllm.MTP`, :data:`~kvpilot.tuner.vllm.EAGLE3` or
    :data:`~kvpilot.tuner.vllm.DRAFT_MODEL`."""
    spec: vllm.SpeculativeFlags
    """The speculative config it was resolved from (its ``num_speculative_tokens`` sizes the buffers)."""
    kv_layers: int
    """The attention layers it adds to the KV pool: the MTP layers, or the draft's decoder layers."""
    draft: ModelSpec | None = None
    """A separate draft model's spec (``draft_model``)."""
    eagle3: Eagle3DraftSpec | None = None
    """An EAGLE3 drafter's read config (``eagle3``)."""

    @property
    def state_holds_draft_tokens(self) -> bool:
        """Whether the budget sizes a hybrid's state layers for the draft tokens too (more state pages and
        conv positions, :func:`speculative_state_tokens`): for an MTP drafter and a draft model; vLLM does
        for any method, and the plan says that an EAGLE3 drafter's are not budgeted."""
        return self.method != vllm.EAGLE3


def resolve_drafter(
    model: ModelSpec, spec: vllm.SpeculativeFlags | None, pp: int = 1, tp: int | None = None
) -> Drafter | None:
    """The drafter the budget counts for ``spec`` on ``pp`` stages of ``tp`` GPUs (``tp``: the target's,
    when known); ``None``: none, or one kvpilot does not budget (:func:`speculative_unbudgeted_reason`)."""
    if spec is None:
        return None
    if budgets_mtp(model, spec, pp):
        return Drafter(vllm.MTP, spec, model.num_mtp_layers)
    draft = budgeted_draft_model(spec, pp, tp)
    if draft is not None:
        return Drafter(vllm.DRAFT_MODEL, spec, draft.num_layers, draft=draft)
    eagle3 = budgeted_eagle3_draft(spec, pp)
    if eagle3 is not None:
        return Drafter(vllm.EAGLE3, spec, eagle3.num_layers, eagle3=eagle3)
    return None


def with_drafter_layers(model: ModelSpec, drafter: Drafter | None) -> ModelSpec:
    """The model the KV layout is computed for: the target's layers and a budgeted drafter's."""
    if drafter is None:
        return model
    if drafter.draft is not None:
        return with_draft_model_layers(model, drafter.draft)
    if drafter.eagle3 is not None:
        return with_eagle3_layers(model, drafter.eagle3)
    return with_mtp_layers(model)


def speculative_state_tokens(model: ModelSpec, spec: vllm.SpeculativeFlags | None) -> int:
    """The ``num_speculative_tokens`` vLLM sizes a hybrid's state layers for (``VllmConfig
    .num_speculative_tokens``: the count given, else the drafter's ``n_predict``); 0 without speculative
    decoding."""
    if spec is None:
        return 0
    return spec.num_speculative_tokens or model.num_mtp_layers


def with_mtp_layers(model: ModelSpec) -> ModelSpec:
    """``model`` with its MTP layers appended as decoder layers ``num_layers .. num_layers + n - 1``: each
    a copy of the last attention decoder layer (DeepSeek-V3's: MLA and MoE, as ``DeepseekV2DecoderLayer``
    of that index builds it; GLM-4.5's: GQA full attention and MoE, as ``Glm4MoeDecoderLayer`` does;
    Qwen3-Next's and Qwen3.5's: the last full-attention layer, gated attention and MoE or MLP, as their
    decoder layer builds it with ``layer_type="full_attention"``, never a gated DeltaNet one)."""
    n = model.num_mtp_layers
    if n == 0:
        return model
    moe = model.moe
    if moe is not None:
        moe = dataclasses.replace(moe, num_moe_layers=moe.num_moe_layers + n)
    last = next((layer for layer in reversed(model.layers) if layer.kind != LINEAR), model.layers[-1])
    return dataclasses.replace(
        model,
        num_layers=model.num_layers + n,
        layers=model.layers + (last,) * n,
        moe=moe,
        num_mtp_layers=0,
    )


def compute_drafter_weight_bytes(
    model: ModelSpec, *, tensor_parallel_size: int = 1, dtype: str | None = None
) -> int:
    """Bytes of the MTP drafter's weights on one TP rank once loaded (its embedding and LM head are the
    target's): its decoder layers, and its ``2h -> h`` projections and their three RMSNorms (DeepSeek,
    GLM: ``eh_proj``, ``enorm``, ``hnorm``, ``shared_head.norm`` per MTP layer, the projection whole on
    every rank; Qwen: one ``fc``, split over TP, and ``norm``, ``pre_fc_norm_hidden``,
    ``pre_fc_norm_embedding`` for all its layers: :class:`kvpilot.tuner.vllm.MtpDrafter`)."""
    n = model.num_mtp_layers
    if n == 0:
        return 0
    drafter = vllm.MTP_DRAFTERS[model.model_type]
    tp = tensor_parallel_size
    b = DTYPE_BYTES[dtype or model.dtype]
    layers = compute_weight_breakdown(with_mtp_layers(model), tensor_parallel_size=tp, dtype=dtype).params
    layers -= compute_weight_breakdown(model, tensor_parallel_size=tp, dtype=dtype).params
    h = model.hidden_size
    projections = n if drafter.projection_per_layer else 1
    projection = 2 * h * (h // tp if drafter.projection_split_by_tp else h)
    return layers + projections * (projection + 3 * h) * b


def compute_proposer_buffer_bytes(
    model: ModelSpec,
    spec: vllm.SpeculativeFlags,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    dtype: str | None = None,
    model_runner_v2: bool = True,
    draft: ModelSpec | None = None,
) -> int:
    """The proposer's GPU buffers (an MTP or EAGLE3 drafter's; ``draft``: a separate draft model's),
    allocated with the model runner after the init snapshot.

    Model Runner V2 (0.33's default): ``DraftModelSpeculator``
    (``v1/worker/gpu/spec_decode/speculator.py:149``: ``InputBuffers``, ``idx_mapping``,
    ``temperature``, ``seeds``, ``draft_tokens`` and their fp32 confidences) and
    ``TargetDependentARSpeculator`` (``target_dependent_ar/speculator.py:36``: the hidden states, two
    ``int64`` per-request indices); a draft model's ``StandaloneARSpeculator`` instead of the latter
    (``standalone_ar/speculator.py:47``-``:63``: ``last_token_indices``, ``arange``, the step counter,
    ``expanded_input_ids`` and ``expanded_positions`` of ``max_num_batched_tokens + max_num_seqs``; no
    hidden states). The V1 runner's proposer: ``v1/spec_decode/llm_base_proposer.py:184`` to ``:265``
    (hidden states and input embeddings of the draft's width; a draft model's two ``bool`` token masks,
    ``:232``)."""
    t, s, n = max_num_batched_tokens, max_num_seqs, spec.num_speculative_tokens or model.num_mtp_layers
    b = DTYPE_BYTES[dtype or model.dtype]
    if model_runner_v2:
        # InputBuffers (input_batch.py:29): ids, positions, padding flags; query starts, two lengths
        inputs = t * (_INT32 + _INT64 + 1) + _INT32 * (s + 1) + 2 * _INT32 * s
        requests = s * (_INT64 + _FP32 + _INT64) + s * n * (_INT64 + _FP32)
        if draft is not None:
            expanded = (t + s) * (_INT32 + _INT64)
            return inputs + requests + _INT64 * s + _INT32 * (s + 1) + _INT64 + expanded
        return inputs + requests + t * model.hidden_size * b + _INT64 * (1 + 2 * s)
    ids = _INT32 * t + _INT64 * t + _INT64 * t  # input_ids, positions, slot mapping
    states = 2 * t * (draft or model).hidden_size * b  # hidden_states, inputs_embeds
    masks = 2 * t if draft is not None else 0  # is_rejected_token_mask, is_masked_token_mask
    return ids + states + masks + _INT32 * max(s + 1, t) + _INT32 * s  # arange, backup_next_token_ids


def compute_speculative_bytes(
    model: ModelSpec,
    spec: vllm.SpeculativeFlags | None,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    dtype: str | None = None,
    max_num_batched_tokens: int = 0,
    max_num_seqs: int = 0,
    model_runner_v2: bool = True,
) -> int:
    """The drafter's weights and the proposer's buffers on one rank (0 when nothing is budgeted)."""
    tp = tensor_parallel_size
    return compute_drafter_bytes(
        model,
        resolve_drafter(model, spec, pipeline_parallel_size, tp),
        tensor_parallel_size=tp,
        dtype=dtype,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        model_runner_v2=model_runner_v2,
    )


def compute_drafter_bytes(
    model: ModelSpec,
    drafter: Drafter | None,
    *,
    tensor_parallel_size: int = 1,
    dtype: str | None = None,
    max_num_batched_tokens: int = 0,
    max_num_seqs: int = 0,
    model_runner_v2: bool = True,
) -> int:
    """:func:`compute_speculative_bytes` of a drafter already resolved (0 for ``None``)."""
    if drafter is None:
        return 0
    tp = tensor_parallel_size
    if drafter.draft is not None:
        weights = compute_draft_model_weight_bytes(drafter.draft, model, tensor_parallel_size=tp, dtype=dtype)
    elif drafter.eagle3 is not None:
        weights = compute_eagle3_weight_bytes(drafter.eagle3, model, tensor_parallel_size=tp, dtype=dtype)
    else:
        weights = compute_drafter_weight_bytes(model, tensor_parallel_size=tp, dtype=dtype)
    buffers = compute_proposer_buffer_bytes(
        model,
        drafter.spec,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        dtype=dtype,
        model_runner_v2=model_runner_v2,
        draft=drafter.draft,
    )
    return weights + buffers

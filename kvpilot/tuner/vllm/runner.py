"""Model Runner V2, vLLM's GPU model runner (``vllm/v1/worker/gpu/``): what it keeps and what it captures.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there); which release runs it is
:func:`~kvpilot.tuner.vllm.versions.uses_model_runner_v2`. The memory budget
(:mod:`kvpilot.tuner.memory.budget`) asks this module for the bytes of the runner's persistent
sampler state, the sampler warm-up's bytes per logit and the CUDA-graph capture sizes. Each
function cites the 0.33.0 wheel's source it mirrors; ``tests/contract/test_contract_runner.py``
checks them against vLLM's own classes on CPU.
"""

from __future__ import annotations

from kvpilot.tuner.arith import cdiv
from kvpilot.tuner.types import GpuSpec
from kvpilot.tuner.vllm.versions import Version

BITMASK_WORD_BITS = 32
"""Vocabulary bitmasks are int32 words of 32 tokens (``cdiv(vocab_size, 32)``)."""
INT32_BYTES = 4


def compute_sampler_state_bytes(max_num_seqs: int, vocab_size: int, decode_query_len: int = 1) -> int:
    """GPU bytes Model Runner V2 keeps per engine for sampling, allocated after the init snapshot.

    * ``v1/worker/gpu/sample/penalties.py::PenaltiesState.__init__``: ``output_bin_counts``
      (``max_num_reqs x vocab_size`` int32) and ``prompt_bin_mask`` (``max_num_reqs x
      cdiv(vocab_size, 32)`` int32), unconditionally;
    * ``v1/worker/gpu/structured_outputs.py::StructuredOutputsWorker.__init__``: ``grammar_bitmask``
      (``max_num_reqs x decode_query_len`` rows of ``cdiv(vocab_size, 32)`` int32) and
      ``logits_indices`` (one int32 per row).

    ``max_num_reqs`` is ``max_num_seqs`` and ``vocab_size`` the config's (unpadded,
    ``ModelConfig.get_vocab_size``), both from ``v1/worker/gpu/model_runner.py``; built on the
    last pipeline stage of a generative model only. The per-request scalars (temperature, seeds,
    penalties' factors) live in pinned host memory (UVA) and are not counted.
    """
    words = cdiv(vocab_size, BITMASK_WORD_BITS)
    penalties = max_num_seqs * (vocab_size + words) * INT32_BYTES
    rows = max_num_seqs * decode_query_len
    structured = rows * (words + 1) * INT32_BYTES
    return penalties + structured


SAMPLER_WARMUP_V2_BYTES_PER_LOGIT = (4.0, 12.0)
"""The range, beyond the logits themselves (model dtype), of bytes per (row x vocab) element the
V2 sampler warm-up's second pass holds at its peak, read from the code; not measured.

``v1/worker/gpu/model_runner.py::_dummy_sampler_run`` runs the sampler twice over
``min(max_num_batched_tokens, max_num_seqs)`` rows; the second pass uses
``SamplingParams.for_sampler_warmup()`` (``sampling_params.py``: temperature, top-k 50, top-p,
min-p, penalties, logit bias, bad words, logprobs 5). ``sample/sampler.py::apply_sampling_params``
copies the logits to fp32 (4 B, the floor); penalties, min-p and temperature work in place. Top-k /
top-p then takes FlashInfer's fused ``top_k_top_p_sampling_from_logits`` on CUDA GPUs with more than
16 SMs (``VLLM_USE_FLASHINFER_SAMPLER`` defaults to 1), which holds a masked fp32 copy and fp32
probabilities (+8 B, the ceiling); without FlashInfer, the Triton top-k/top-p masks in place with a
per-program buffer (``v1/sample/ops/topk_topp_triton.py``; not per row). Raw-mode logprobs take a
top-5 of the model-dtype logits (``sample/logprob.py::compute_topk_scores``): no vocab-wide buffer."""


PROFILE_SAMPLER_WARMUP_PASS_SINCE: Version = (0, 33)
"""The first release whose V2 profile run samples a second time with ``SamplingParams.for_sampler_warmup()``
(the fp32 pipeline :data:`SAMPLER_WARMUP_V2_BYTES_PER_LOGIT` describes). 0.21-0.32's
``v1/worker/gpu/model_runner.py::_dummy_sampler_run`` runs one default pass: the dummy requests need no
logits processing (``sample/sampler.py::_requires_logits_processing``), so no fp32 copy is made and
``sample/gumbel.py::gumbel_sample`` keeps only per-block maxima (``rows x cdiv(vocab, 1024)``): the peak
is the model-dtype logits. Established from each wheel (``bench/vllm_release_facts.py``,
``sampler_warmup.used_by``)."""


def profile_samples_in_fp32(version: Version) -> bool:
    """Whether Model Runner V2's profile run pays for the fp32 sampling pipeline
    (:data:`PROFILE_SAMPLER_WARMUP_PASS_SINCE`); before it, its sampler peak is the logits alone."""
    return version >= PROFILE_SAMPLER_WARMUP_PASS_SINCE


CAPTURE_OFF_GRID_SIZES_SINCE: Version = (0, 31)
"""The first release that also captures ``max_num_seqs`` and ``max_num_batched_tokens`` off the grid
(and caps the grid at ``max_num_batched_tokens`` before building it); 0.19-0.30 build the grid only.
Established by running each wheel's ``_set_cudagraph_sizes`` (``bench/vllm_capture_sizes.py``)."""

BLACKWELL_CAPTURE_LIMIT_SINCE: Version = (0, 28)
"""The first release whose largest default capture size is 1024 on the SM100 family (512 before,
and on every other GPU); from the same runs."""


def cuda_graph_capture_sizes(
    version: Version,
    gpu: GpuSpec,
    max_num_seqs: int,
    max_num_batched_tokens: int | None = None,
    performance_mode: str | None = None,
) -> tuple[int, ...]:
    """The batch sizes vLLM captures CUDA graphs for (no speculative decoding, no explicit sizes).

    ``config/vllm.py::VllmConfig._set_cudagraph_sizes`` of each release, run on CPU by
    ``bench/vllm_capture_sizes.py`` into ``tests/data/vllm_capture_sizes.json``: the largest size is
    ``min(2 x max_num_seqs, limit)`` (limit 1024 on the SM100 family from
    :data:`BLACKWELL_CAPTURE_LIMIT_SINCE`, else 512), capped at ``max_num_batched_tokens``; sizes
    ``[1, 2, 4] + 8..248 step 8 + 256..largest step 16`` (``--performance-mode interactivity``, in
    every modelled release: every size from 1 to 32, then the same grid); from
    :data:`CAPTURE_OFF_GRID_SIZES_SINCE`, plus ``max_num_batched_tokens`` and ``max_num_seqs`` when
    they fit and are off the grid. Without ``max_num_batched_tokens`` the grid is not capped.
    """
    blackwell = (10, 0) <= gpu.compute_capability < (11, 0) and version >= BLACKWELL_CAPTURE_LIMIT_SINCE
    largest = min(2 * max_num_seqs, 1024 if blackwell else 512)
    extra: list[int] = []
    if max_num_batched_tokens is not None:
        if version >= CAPTURE_OFF_GRID_SIZES_SINCE and max_num_seqs <= largest:
            extra.append(max_num_seqs)
        largest = min(max_num_batched_tokens, largest)
        if version >= CAPTURE_OFF_GRID_SIZES_SINCE and max_num_batched_tokens <= largest:
            extra.append(max_num_batched_tokens)
        extra = [s for s in extra if s <= max_num_batched_tokens]
    if performance_mode == "interactivity":
        sizes = list(range(1, min(largest, 32) + 1))
    else:
        sizes = [s for s in (1, 2, 4) if s <= largest]
    if largest >= 8:
        sizes += list(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes += list(range(256, largest + 1, 16))
    return tuple(sorted(set(sizes + extra)))

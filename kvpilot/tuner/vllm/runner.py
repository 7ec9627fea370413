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
"""The first release that also captures ``max_num_seqs`` off the grid (without speculative decoding);
0.19-0.30 do not. Established by running each wheel's ``_set_cudagraph_sizes``
(``bench/vllm_capture_sizes.py``)."""

CAPTURE_BATCHED_TOKENS_SINCE: Version = (0, 20)
"""The first release that also captures ``max_num_batched_tokens`` off the grid when it is within the
largest size ("ensure max_num_tokens is captured if within max capture size", ``config/vllm.py``
0.20-0.33); 0.19 builds the grid only. From the same runs (the grid's 100 and 300 batched tokens)."""

BLACKWELL_CAPTURE_LIMIT_SINCE: Version = (0, 28)
"""The first release whose largest default capture size is 1024 on the SM100 family (512 before,
and on every other GPU); from the same runs."""


UNIFORM_DECODE_SIZES_SINCE: Version = (0, 29)
"""The first release whose ``_set_cudagraph_sizes`` appends the uniform-decode sizes with speculative
decoding: ``n x (1 + k)`` for ``n`` on the request grid up to ``min(max_num_seqs, limit)`` (and
``max_num_seqs`` itself), where they fit under the largest size. 0.19-0.28 only widen the largest size
to ``2 x max_num_seqs x (1 + k)``. From the same runs (``speculative`` in the data file)."""

SPEC_DECODE_ADJUST_ANY_RUNNER_BEFORE: Version = (0, 25)
"""Before this release ``adjust_cudagraph_sizes_for_spec_decode`` re-cuts the sizes whatever the runner
(``config/compilation.py::resolve_cudagraph_mode_and_sizes`` 0.20-0.24 has no runner condition, and Model
Runner V2's ``v1/worker/gpu/cudagraph_utils.py`` 0.21-0.24 calls it too); from it, the V1 runner only
(``not use_v2_model_runner``, 0.25-0.33: "MRV2 handles cudagraph capture sizing in cudagraph_utils.py")."""


def _request_grid(largest: int, performance_mode: str | None = None) -> list[int]:
    """``[1, 2, 4] + 8..248 step 8 + 256..largest step 16`` up to ``largest`` (interactivity: 1..32 first)."""
    if performance_mode == "interactivity":
        sizes = list(range(1, min(largest, 32) + 1))
    else:
        sizes = [s for s in (1, 2, 4) if s <= largest]
    if largest >= 8:
        sizes += list(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes += list(range(256, largest + 1, 16))
    return sizes


def cuda_graph_capture_sizes(
    version: Version,
    gpu: GpuSpec,
    max_num_seqs: int,
    max_num_batched_tokens: int | None = None,
    performance_mode: str | None = None,
    num_speculative_tokens: int = 0,
) -> tuple[int, ...]:
    """The batch sizes vLLM's config asks CUDA graphs for (no explicit sizes), before the runner re-cuts them.

    ``config/vllm.py::VllmConfig._set_cudagraph_sizes`` of each release, run on CPU by
    ``bench/vllm_capture_sizes.py`` into ``tests/data/vllm_capture_sizes.json``: the largest size is
    ``min(2 x max_num_seqs x (1 + num_speculative_tokens), limit)`` (limit 1024 on the SM100 family from
    :data:`BLACKWELL_CAPTURE_LIMIT_SINCE`, else 512), capped at ``max_num_batched_tokens``; sizes
    ``[1, 2, 4] + 8..248 step 8 + 256..largest step 16`` (``--performance-mode interactivity``, in
    every modelled release: every size from 1 to 32, then the same grid); plus ``max_num_batched_tokens``
    from :data:`CAPTURE_BATCHED_TOKENS_SINCE` and (without speculative decoding) ``max_num_seqs`` from
    :data:`CAPTURE_OFF_GRID_SIZES_SINCE` when they fit and are off the grid; with speculative decoding from
    :data:`UNIFORM_DECODE_SIZES_SINCE`, plus the uniform-decode sizes (``0.33 config/vllm.py:2471-2549``).
    Without ``max_num_batched_tokens`` the grid is not capped. What the runner captures of them:
    :func:`cuda_graph_counts`.
    """
    query_len = 1 + num_speculative_tokens
    blackwell = (10, 0) <= gpu.compute_capability < (11, 0) and version >= BLACKWELL_CAPTURE_LIMIT_SINCE
    limit = 1024 if blackwell else 512
    largest = min(2 * max_num_seqs * query_len, limit)
    extra: list[int] = []
    if query_len > 1:
        if version >= UNIFORM_DECODE_SIZES_SINCE:
            requests = min(max_num_seqs, limit)
            counts = set(_request_grid(requests)) | {requests}
            extra = [n * query_len for n in counts if n * query_len <= largest]
    elif version >= CAPTURE_OFF_GRID_SIZES_SINCE and max_num_seqs <= largest:
        extra.append(max_num_seqs)
    if max_num_batched_tokens is not None:
        largest = min(max_num_batched_tokens, largest)
        if version >= CAPTURE_BATCHED_TOKENS_SINCE and max_num_batched_tokens <= largest:
            extra.append(max_num_batched_tokens)
        extra = [s for s in extra if s <= max_num_batched_tokens]
    return tuple(sorted(set(_request_grid(largest, performance_mode) + extra)))


def adjust_sizes_for_spec_decode(sizes: tuple[int, ...], num_speculative_tokens: int) -> tuple[int, ...]:
    """The sizes the V1 runner captures with FULL decode graphs and speculative decoding:
    ``config/compilation.py::CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`` (the same in
    every release 0.19-0.33 at TP 1 or without sequence parallelism; ``0.33 compilation.py:1537-1565``)
    rounds each size up to a multiple of ``1 + k`` and keeps those within the largest; none where even
    ``1 + k`` does not fit (vLLM refuses to start: "No valid cudagraph sizes")."""
    query_len = 1 + num_speculative_tokens
    if not sizes or query_len <= 1:
        return sizes
    rounded = sorted({-(-s // query_len) * query_len for s in sizes})
    kept = tuple(s for s in rounded if s <= max(sizes))
    if not kept and query_len <= max(sizes):
        return (query_len,)
    return kept


def full_decode_sizes(
    sizes: tuple[int, ...], max_num_seqs: int, num_speculative_tokens: int = 0
) -> tuple[int, ...]:
    """The sizes that get a FULL decode graph besides their PIECEWISE one (``FULL_AND_PIECEWISE``):
    ``v1/cudagraph_dispatcher.py::CudagraphDispatcher.initialize_cudagraph_keys`` (the same rule in every
    release 0.19-0.33; ``0.33 cudagraph_dispatcher.py:209-220``), ``1 + k <= x <= (1 + k) x max_num_seqs``."""
    query_len = 1 + num_speculative_tokens
    return tuple(s for s in sizes if query_len <= s <= query_len * max_num_seqs)


def cuda_graph_counts(
    version: Version,
    gpu: GpuSpec,
    max_num_seqs: int,
    max_num_batched_tokens: int | None = None,
    performance_mode: str | None = None,
    num_speculative_tokens: int = 0,
    model_runner_v2: bool = False,
) -> tuple[int, int]:
    """(PIECEWISE, FULL) decoder graphs one rank captures under ``FULL_AND_PIECEWISE``.

    Without speculative decoding: every size of :func:`cuda_graph_capture_sizes` PIECEWISE, those up to
    ``max_num_seqs`` FULL. With ``k`` speculative tokens, the V1 runner (and any runner before
    :data:`SPEC_DECODE_ADJUST_ANY_RUNNER_BEFORE`) captures :func:`adjust_sizes_for_spec_decode`'s sizes,
    PIECEWISE all of them and FULL :func:`full_decode_sizes`'; Model Runner V2 from 0.25 captures the
    config's sizes PIECEWISE and, FULL, each rounded up to a multiple of ``1 + k`` within
    ``(1 + k) x max_num_seqs`` and the largest size, once (``v1/worker/gpu/cudagraph_utils.py::
    CudaGraphManager._init_candidates``, 0.33 lines 321-345, the same rule 0.29-0.33): the same FULL set.
    """
    sizes = cuda_graph_capture_sizes(
        version, gpu, max_num_seqs, max_num_batched_tokens, performance_mode, num_speculative_tokens
    )
    if num_speculative_tokens <= 0:
        return len(sizes), len(full_decode_sizes(sizes, max_num_seqs))
    adjusted = adjust_sizes_for_spec_decode(sizes, num_speculative_tokens)
    full = len(full_decode_sizes(adjusted, max_num_seqs, num_speculative_tokens))
    if model_runner_v2 and version >= SPEC_DECODE_ADJUST_ANY_RUNNER_BEFORE:
        return len(sizes), full
    return len(adjusted), full

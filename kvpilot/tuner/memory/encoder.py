"""The vision encoder's part of the profile run: the peak of one encoder forward over vLLM's dummy
items, and the encoder cache those items leave for the decoder's dummy run.

Sits beside :mod:`kvpilot.tuner.memory.budget`, which takes the larger of the encoder's peak and the
decoder's (they run one after the other, ``profile_run``). Derived from the pinned wheel's code, not
fitted: no start-up log of a Qwen VL model is in the calibration set (docs/memory-model.md, "Peak
activation of the profile run").

One forward over ``N`` patches (``N = merged tokens x spatial_merge_size**2``), at width ``d``,
MLP width ``I``, tensor parallelism ``t`` (``mm_encoder_tp_mode`` "weights", the default: QKV,
``fc1``/``gate_up`` and the merger's ``fc1`` are column-sharded), in elements per patch:

* held throughout: the processor's fp32 pixels (``in_channels x temporal x patch**2``, 4 bytes), the
  residual stream ``d``, Qwen3-VL's position embeddings ``d`` and the deepstack features already
  taken (``out_hidden / 4`` each);
* attention (``Qwen2_5_VisionAttention.forward``): ``qkv`` 3d/t, the contiguous ``qk`` 2d/t and its
  rotated copy 2d/t, the attention output d/t and its contiguous rearrangement d/t: ``9d/t``; then the
  projection's output d beside ``8d/t`` still referenced. The varlen kernels (FlashAttention, SDPA
  per frame) keep nothing quadratic in ``N``;
* MLP: the norm's output ``d``, then ``fc1`` and its activation ``2I/t`` (gate/up and ``SiluAndMul``
  ``3I/t``);
* merger: the norm ``d``, ``fc1`` and GELU ``2d/t`` (on ``N/4`` rows of ``4d``), the output ``out/4``;
  Qwen3-VL's final ``torch.cat`` of the merger and deepstack outputs holds both: ``2(1+k) out/4``.

The encoder's output, ``merged tokens x out_hidden x (1 + deepstack)``, stays in the encoder cache while
the decoder's dummy forward runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpilot.tuner.model.vision import VisionTower
from kvpilot.tuner.vllm import multimodal

PIXEL_BYTES = 4
"""The image processor returns float32 pixel values; the tower casts its own copy (``IdentityInputNorm``)."""


@dataclass(frozen=True, slots=True)
class EncoderPeak:
    """Bytes on one rank: the encoder forward's peak, and the encoder cache it leaves behind."""

    forward_bytes: int
    cache_bytes: int
    profile: multimodal.EncoderProfile


def compute_encoder_peak(
    tower: VisionTower, profile: multimodal.EncoderProfile, *, tp: int, dtype_bytes: int
) -> EncoderPeak:
    """The encoder forward's torch peak over ``profile``'s batch on one TP rank (see the module docstring)."""
    patches = profile.tokens * tower.spatial_merge_size**2
    d, t = tower.hidden, tp
    quarter_out = tower.out_hidden / tower.spatial_merge_size**2  # one merged token's output, per patch
    k = tower.deepstack_layers
    held = d + (d if tower.learned_pos_embed else 0) + k * quarter_out
    attention = max(9 * d / t, 8 * d / t + d)
    mlp = d + (3 if tower.mlp_gated else 2) * tower.intermediate / t
    merger = d + 2 * d / t + quarter_out
    block = held + max(attention, mlp, merger)
    concat = (d if tower.learned_pos_embed else 0) + 2 * (1 + k) * quarter_out
    activations = patches * dtype_bytes * max(block, concat)
    pixels = patches * tower.patch_pixels * PIXEL_BYTES
    cache = profile.tokens * tower.output_width * dtype_bytes
    return EncoderPeak(int(activations + pixels), int(cache), profile)


def compute_encoder_profile_peak(
    tower: VisionTower | None,
    *,
    tp: int,
    dtype_bytes: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
) -> EncoderPeak | None:
    """The encoder's profile peak for the batch vLLM 0.33 profiles; ``None`` for a text-only model or a
    tower kvpilot does not model (:mod:`kvpilot.tuner.model.vision`)."""
    if tower is None:
        return None
    profile = tower.profile(
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, max_model_len=max_model_len
    )
    if profile is None:
        return None
    return compute_encoder_peak(tower, profile, tp=tp, dtype_bytes=dtype_bytes)

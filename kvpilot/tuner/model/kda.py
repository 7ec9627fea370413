"""Kimi-K3's decoder layers, read from its ``linear_attn_config``: MLA layers and Kimi Delta Attention.

Sits beside :mod:`kvpilot.tuner.model.readers` and below :mod:`kvpilot.tuner.model.spec`, which calls it
for an MLA config with ``linear_attn_config``. vLLM 0.33 (``vllm/models/kimi_k3/nvidia/model.py``,
``transformers_utils/configs/kimi_linear.py::is_kda_layer``) builds layer ``i`` as a KDA layer when
``i + 1`` is in ``kda_layers`` (the lists count from 1) and as an MLA layer otherwise. A KDA layer keeps
one state per request (``MambaStateShapeCalculator.kda_state_shape``): a conv state of
``3 x num_heads x head_dim`` channels (q, k and v) over ``short_conv_kernel_size - 1`` steps in the
model's dtype, and a recurrent state of ``num_heads x head_dim x head_dim`` in float32
(``kda_state_dtype`` with ``--mamba-ssm-cache-dtype auto``).
"""

from __future__ import annotations

from kvpilot.tuner.model.fields import MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, MAX_SMALL, Fields, refuse
from kvpilot.tuner.model.layers import KDA, LINEAR, MLA, LayerSpec, LinearStateSpec


def read_kda_layers(text: Fields, num_layers: int, latent: int) -> tuple[list[LayerSpec], LinearStateSpec]:
    """Kimi-K3's layers (MLA, or ``LINEAR`` for KDA) and the KDA state of one layer."""
    config = text.child("linear_attn_config")
    if config is None:
        raise text.missing("linear_attn_config")
    kda = set(config.ints("kda_layers", limit=MAX_LAYERS, minimum=1) or [])
    if not kda:
        raise config.missing("kda_layers")
    if max(kda) > num_layers:
        raise refuse(config.path("kda_layers"), f"layer numbers 1..{num_layers}", max(kda))
    if len(kda) == num_layers:
        raise refuse(config.path("kda_layers"), "at least one MLA layer beside the KDA layers", len(kda))
    heads = config.need_int("num_heads", limit=MAX_HEADS)
    head_dim = config.need_int("head_dim", limit=MAX_HEAD_DIM)
    kernel = config.need_int("short_conv_kernel_size", limit=MAX_SMALL)
    state = LinearStateSpec(
        conv_dim=3 * heads * head_dim,
        conv_kernel=kernel,
        num_heads=heads,
        head_k_dim=head_dim,
        head_v_dim=head_dim,
        family=KDA,
        ssm_dtype="float32",
        bounded_gate=config.present("gate_lower_bound"),
    )
    mla = LayerSpec(MLA, 1, latent, 0)
    return [LayerSpec(LINEAR) if i + 1 in kda else mla for i in range(num_layers)], state


__all__ = ["read_kda_layers"]

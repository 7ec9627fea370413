"""vLLM 0.33 flags that change what the engine holds in memory and that kvpilot's plan does not budget.

A plan is for the engine the pods run (:mod:`.engine_flags` reads the untuned flags it does budget:
``--enforce-eager``, ``--performance-mode``, prefix caching and ``--enable-lora`` with its sizes). The
flags below change the engine's memory in ways the memory model does not count, so a plan made while
one of them is given is the plan of another engine: the planner says so by name, with what the flag
costs and what to do, in the plan's warnings (:func:`list_unmodelled_flags`). Each is a flag of vLLM
0.33's parser (``tests/contract/test_contract_engine_flags.py`` checks it).

``--max-num-active-seqs`` is not one: it caps admission and has no memory of its own (:mod:`.active_seqs`).
Nor are ``--data-parallel-size`` and ``--enable-expert-parallel``: the plan budgets one data-parallel engine
and the group's expert shards (:mod:`.parallel`). Nor are the speculative-decoding flags: what of them is
budgeted depends on the method and the model, so the plan names what it leaves out itself
(:data:`SPECULATIVE_UNBUDGETED`, :mod:`.speculative`). Nor is ``--moe-backend``: which kernel it runs depends
on the model's quantization (:mod:`.moe_backends`). ``cutlass`` on W4A4 NVFP4 experts (``CutlassExpertsFp4``)
is budgeted from vLLM's code from 0.20 (:mod:`kvpilot.tuner.memory.moe_kernels`); for any other value, another
quantization or an older release, the plan warns by name (:func:`describe_unbudgeted_moe_backend`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpilot.tuner.vllm.args import iter_flags

_KV_OFFLOADING = (
    "a CPU tier of the KV cache: --kv-offloading-size GiB of pinned host memory in all (the native "
    "backend), out of the pod's memory, not the GPU's; the operator refuses a memory limit below it "
    "(kvpilot.tuner.vllm.kv_offloading), and vllm#52656 reports tiers that never finish starting above a "
    "size that depends on the host; size the pod's memory limit for it"
)

UNMODELLED_MEMORY_FLAGS: Mapping[str, str] = {
    "--kv-offloading-size": _KV_OFFLOADING,
    "--kv-offloading-backend": _KV_OFFLOADING,
    "--kv-transfer-config": (
        "a KV connector kvpilot could not read (the dotted --kv-transfer-config.<field> form, or no "
        "kv_connector with its kv_role): what it allocates after vLLM sizes the KV cache (LMCache: a "
        "staging buffer of chunk_size tokens of KV per GPU, and max_local_cpu_size GiB of pinned host "
        "memory per GPU) is not budgeted; give --kv-transfer-config as one JSON object"
    ),
    "--cpu-offload-gb": (
        "weights offloaded to host memory are still counted on the GPU: the plan is pessimistic"
    ),
}
"""vLLM 0.33 flag -> what it changes that kvpilot does not budget, and what to do."""

SPECULATIVE_UNBUDGETED = (
    "the drafter's and the rejection sampler's share of the profile run, and the CUDA graphs of a drafter "
    "whose layers kvpilot does not count, are not budgeted (the target's graphs for uniform-decode batches "
    "of 1 + num_speculative_tokens tokens and a counted drafter's are, as vLLM's FULL_AND_PIECEWISE mode "
    "captures them; an attention backend that drops speculative decoding to PIECEWISE captures fewer); "
    "leave headroom in --gpu-memory-utilization"
)
"""What of speculative decoding the plan never budgets, whatever the method (:mod:`.speculative`)."""


MOE_BACKEND_UNBUDGETED = (
    "its kernels' workspaces and temporaries in the profile run, and any weight layout of their own, are "
    "not budgeted (the fitted MoE term is the default triton path's; a FlashInfer backend took +11.5 GiB "
    "on a real log): leave the backend to vLLM (auto), or lower --gpu-memory-utilization"
)
"""What the plan says of a ``--moe-backend`` value whose kernel kvpilot does not budget on the model."""


def describe_unbudgeted_moe_backend(backend: str) -> str:
    """The plan's warning for ``--moe-backend backend`` on a model whose kernel for it is not budgeted."""
    return (
        f"--moe-backend {backend} is not in kvpilot's memory model for this model (only cutlass on W4A4 "
        f"NVFP4 experts, from vLLM 0.20, is): {MOE_BACKEND_UNBUDGETED}."
    )


def list_unmodelled_flags(args: Sequence[str]) -> tuple[str, ...]:
    """The flags of ``args`` (canonical spelling; a dotted ``--x.field=v`` counts as ``--x``) that change
    memory kvpilot does not budget, each once, in order of first appearance."""
    found: list[str] = []
    for _, flag, _ in iter_flags(args):
        base = flag.split(".", 1)[0]
        if base in UNMODELLED_MEMORY_FLAGS and base not in found:
            found.append(base)
    return tuple(found)


def describe_unmodelled_flag(flag: str) -> str:
    """The plan's warning for one flag of :data:`UNMODELLED_MEMORY_FLAGS`."""
    return f"{flag} is not in kvpilot's memory model: {UNMODELLED_MEMORY_FLAGS[flag]}."

"""vLLM 0.33 flags that change what the engine holds in memory and that kvpilot's plan does not budget.

A plan is for the engine the pods run (:mod:`.engine_flags` reads the untuned flags it does budget:
``--enforce-eager``, ``--performance-mode``, prefix caching and ``--enable-lora`` with its sizes). The
flags below change the engine's memory in ways the memory model does not count, so a plan made while
one of them is given is the plan of another engine: the planner says so by name, with what the flag
costs and what to do, in the plan's warnings (:func:`list_unmodelled_flags`). Each is a flag of vLLM
0.33's parser (``tests/contract/test_contract_engine_flags.py`` checks it).

``--max-num-active-seqs`` is not one: it caps admission and has no memory of its own (:mod:`.active_seqs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpilot.tuner.vllm.args import iter_flags

_SPECULATIVE = (
    "speculative decoding: the draft model's or MTP layers' weights, their KV cache and the wider CUDA "
    "graphs are not budgeted; lower --gpu-memory-utilization by their size, or pin --kv-cache-memory-bytes"
)
_KV_OFFLOADING = (
    "a CPU tier of the KV cache: --kv-offloading-size GiB of pinned host memory in all (the native "
    "backend), out of the pod's memory, not the GPU's; the operator refuses a memory limit below it "
    "(kvpilot.tuner.vllm.kv_offloading), and vllm#52656 reports tiers that never finish starting above a "
    "size that depends on the host; size the pod's memory limit for it"
)

UNMODELLED_MEMORY_FLAGS: Mapping[str, str] = {
    "--speculative-config": _SPECULATIVE,
    "--spec-method": _SPECULATIVE,
    "--spec-model": _SPECULATIVE,
    "--spec-tokens": _SPECULATIVE,
    "--kv-offloading-size": _KV_OFFLOADING,
    "--kv-offloading-backend": _KV_OFFLOADING,
    "--kv-transfer-config": (
        "a KV connector: connectors such as LMCache allocate GPU buffers at start-up (+22 % on a real "
        "log), not budgeted; lower --gpu-memory-utilization by the connector's buffers"
    ),
    "--moe-backend": (
        "the MoE kernels' workspaces and weight layout depend on the backend (a FlashInfer backend took "
        "+11.5 GiB on a real log), not budgeted; leave the backend to vLLM or lower --gpu-memory-utilization"
    ),
    "--cpu-offload-gb": (
        "weights offloaded to host memory are still counted on the GPU: the plan is pessimistic"
    ),
    "--enable-expert-parallel": (
        "expert parallelism shards the experts over DP x TP ranks, which the plan (TP only) does not model"
    ),
    "--data-parallel-size": (
        "data parallelism: the plan is for one engine of TP ranks; each DP rank is sized alike"
    ),
}
"""vLLM 0.33 flag -> what it changes that kvpilot does not budget, and what to do."""


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

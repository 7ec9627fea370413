"""Which of a service's untuned flags and environment may change what vLLM 0.33 holds in GPU memory.

Fleet learning (:mod:`kvpilot.tuner.plan.profiles`) pools observations only between engines whose memory
behaves alike. The tuned flags are settings (pinned when a user gives them); of the rest, only a short list
is known to leave GPU memory alone (:data:`MEMORY_NEUTRAL_FLAGS`: the API server's, the tokenizer's, logging,
tool and reasoning parsers). Every other flag may change it -- ``--hf-overrides`` rewrites the model config
the memory model predicted from (``{"num_hidden_layers": 1}`` makes a 32-layer model one layer deep, so its
KV cache holds 32 times the tokens), ``--quantization``, ``--load-format bitsandbytes``, ``--enable-lora``,
``--speculative-config``, ``--cpu-offload-gb``, ``--block-size``, ``--compilation-config``,
``--enable-expert-parallel``, ``--limit-mm-per-prompt``, ``--kv-offloading-size``, ``--enforce-eager`` (no
CUDA graph pool) -- and so does an environment variable vLLM, PyTorch, CUDA or NCCL reads
(:data:`SIZING_ENV_PREFIXES`; ``PYTORCH_CUDA_ALLOC_CONF`` and ``VLLM_ATTENTION_BACKEND`` among them).

Unknown flags count as sizing flags: a flag vLLM adds in a later release is treated as one that changes
memory until it is listed here. ``tests/contract/test_contract_sizing_flags.py`` checks that every neutral
flag is one vLLM 0.33's parser has.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvpilot.tuner.vllm.args import FLAGS, iter_flags

MEMORY_NEUTRAL_FLAGS = frozenset(
    {
        # the OpenAI-compatible server
        "--served-model-name",
        "--api-key",
        "--root-path",
        "--allowed-origins",
        "--allowed-methods",
        "--allowed-headers",
        "--allow-credentials",
        "--ssl-keyfile",
        "--ssl-certfile",
        "--ssl-ca-certs",
        "--ssl-cert-reqs",
        "--middleware",
        "--disable-fastapi-docs",
        "--enable-request-id-headers",
        "--enable-server-load-tracking",
        "--enable-force-include-usage",
        "--enable-prompt-tokens-details",
        "--return-tokens-as-token-ids",
        "--response-role",
        "--max-log-len",
        # chat templates, tools, reasoning
        "--chat-template",
        "--chat-template-content-format",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "--tool-parser-plugin",
        "--reasoning-parser",
        # tokenizer and config loading
        "--tokenizer",
        "--tokenizer-mode",
        "--tokenizer-revision",
        "--trust-remote-code",
        "--code-revision",
        "--download-dir",
        "--generation-config",
        "--override-generation-config",
        "--seed",
        # logging
        "--disable-log-requests",
        "--enable-log-requests",
        "--disable-log-stats",
        "--uvicorn-log-level",
        "--disable-uvicorn-access-log",
        "--enable-log-outputs",
        # weights of the model's own dtype size (kvpilot.tuner.vllm.check_dtype refuses any other)
        "--dtype",
    }
)
"""Untuned vLLM 0.33 flags known not to change what the engine holds in GPU memory."""

SIZING_ENV_PREFIXES = ("VLLM_", "PYTORCH_", "TORCH_", "CUDA_", "NCCL_")
"""Environment variables with these prefixes may change the engine's memory (attention backend, allocator,
model runner, graph capture)."""


def compute_sizing_args(args: Sequence[str]) -> tuple[str, ...]:
    """The tokens of ``args`` that may change vLLM's memory: every flag that is neither tuned (a pinned
    setting) nor in :data:`MEMORY_NEUTRAL_FLAGS`, in vLLM's canonical spelling (dashes, aliases
    resolved), with the values that follow it, in order. Empty: the engine is the plain one."""
    flags = list(iter_flags(args))
    out: list[str] = []
    tuned = set(FLAGS.values())
    for n, (index, flag, inline) in enumerate(flags):
        end = flags[n + 1][0] if n + 1 < len(flags) else len(args)
        if flag in MEMORY_NEUTRAL_FLAGS or flag in tuned:
            continue
        out.append(flag if inline is None else f"{flag}={inline}")
        out.extend(args[index + 1 : end])
    return tuple(out)


def compute_sizing_env(env: Iterable[tuple[str, str | None]]) -> tuple[str, ...]:
    """``NAME=value`` (``NAME`` alone for a value from a reference) of every variable of ``env`` (name,
    literal value) that may change vLLM's memory (:data:`SIZING_ENV_PREFIXES`), sorted."""
    out = [
        name if value is None else f"{name}={value}"
        for name, value in env
        if name.startswith(SIZING_ENV_PREFIXES)
    ]
    return tuple(sorted(out))


__all__ = ["MEMORY_NEUTRAL_FLAGS", "SIZING_ENV_PREFIXES", "compute_sizing_args", "compute_sizing_env"]

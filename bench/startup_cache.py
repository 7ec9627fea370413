"""The fleet's start-up with and without a warm compile cache, and the restart cost the policy then prices.

For three checkpoint sizes (an 8B, a 32B and a 70B in bf16), the fleet's start-up model
(:class:`e2e.fleet.truth.StartupModel`, calibrated on real GPU logs: ``tests/data/vllm_logs/``) gives the
seconds to listening of a start that downloads the weights, one that finds them on its volume and compiles
(a cold compile cache: a retune that changes a setting in vLLM's compile hash), and one that also finds its
compiled graphs (a warm cache: a restart with the same hash, or a change of ``gpu_memory_utilization``
alone). Beside them, what the closed loop's trade prices a retune at with the cold start as its measured
restart (``status.startupSeconds``) on pods that keep the cache (:func:`kvpilot.tuner.loop.trade.
compute_warm_compile_seconds` with the policy's default ``compile_seconds``). Then the load with vLLM's
default loader and with the streaming one (``spec.model.loader: RunaiStreamer``) from a local disk and from
a network volume read at 0.22 GiB/s (case-068 of ``tests/data/vllm_memory_cases.json``). Pure arithmetic,
instant: ``python -m bench.startup_cache``.
"""

from __future__ import annotations

from e2e.fleet.truth import StartupModel
from kvpilot.tuner.loop import trade
from kvpilot.tuner.loop.config import PolicyConfig
from kvpilot.tuner.types import EngineSettings

CHECKPOINTS = (("8B", 15.0), ("32B", 61.0), ("70B", 131.0))
CURRENT = EngineSettings(
    max_model_len=8192,
    max_num_seqs=256,
    gpu_memory_utilization=0.9,
    kv_cache_dtype="auto",
    tensor_parallel_size=1,
    max_num_batched_tokens=8192,
)
RETUNES = (
    (
        "gpu_memory_utilization 0.90 -> 0.95",
        EngineSettings(**{**CURRENT.as_dict(), "gpu_memory_utilization": 0.95}),
    ),
    ("max_num_seqs 256 -> 128", EngineSettings(**{**CURRENT.as_dict(), "max_num_seqs": 128})),
)


def compute_rows() -> list[tuple[str, float, float, float, float]]:
    """Per checkpoint: the download, cold-compile and warm-compile starts (simulated seconds) and how much
    of the cold restart the warm one spares."""
    rows = []
    for name, gib in CHECKPOINTS:
        model = StartupModel(checkpoint_gib=gib)
        download = model.simulated_seconds(cached=False)
        cold = model.simulated_seconds(cached=True)
        warm = model.simulated_seconds(cached=True, compile_cached=True)
        rows.append((name, gib, download, cold, warm))
    return rows


def compute_priced(restart_seconds: float) -> list[tuple[str, float]]:
    """The restart cost the policy's trade counts for each retune (pods keeping the compile cache)."""
    policy = PolicyConfig()
    out = []
    for label, proposed in RETUNES:
        spared = trade.compute_warm_compile_seconds(
            CURRENT,
            proposed,
            persistent=True,
            compile_seconds=policy.compile_seconds,
            restart_seconds=restart_seconds,
        )
        out.append((label, restart_seconds - spared))
    return out


def main() -> None:
    model = StartupModel()
    print(
        f"fleet start-up terms: load at {model.disk_gib_per_s} GiB/s, download at {model.download_gib_per_s} "
        f"GiB/s, engine {model.engine_s:.0f} s with a cold compile of {model.compile_s:.0f} s "
        f"(warm: {model.warm_compile_s:.0f} s)"
    )
    print(
        f"{'model':<6}{'GiB':>6}{'download':>10}{'cold':>8}{'warm':>8}{'saved':>8}  policy's priced restart"
    )
    for name, gib, download, cold, warm in compute_rows():
        priced = "; ".join(f"{label}: {cost:.0f} s" for label, cost in compute_priced(cold))
        print(
            f"{name:<6}{gib:>6.0f}{download:>9.1f}s{cold:>7.1f}s{warm:>7.1f}s{cold - warm:>7.1f}s  {priced}"
        )

    print(f"\n{'model':<6}{'volume':>9}{'default loader':>16}{'streamer':>10}  (weights, compile cache warm)")
    for name, gib in CHECKPOINTS:
        for volume, rate in (("local", model.disk_gib_per_s), ("network", 0.22)):
            startup = StartupModel(checkpoint_gib=gib, disk_gib_per_s=rate)
            default, streamed = (
                startup.simulated_seconds(cached=True, compile_cached=True, streamer=s) for s in (False, True)
            )
            print(f"{name:<6}{volume:>9}{default:>15.1f}s{streamed:>9.1f}s")


if __name__ == "__main__":
    main()

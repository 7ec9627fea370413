"""vLLM 0.33's ``--max-num-active-seqs``: the admission cap below ``--max-num-seqs``, and what it means for
the plan and the closed loop.

What vLLM 0.33 does with it (every line cited is of the pinned wheel):

* **default and validation**: ``SchedulerConfig.max_num_active_seqs: int | None = None`` with ``ge=1``
  (``config/scheduler.py:69``); ``None`` keeps the admission limit at ``max_num_seqs``
  (``v1/core/sched/scheduler.py:134-138``). A value above ``max_num_seqs`` is refused at start-up:
  "max_num_active_seqs (N) cannot be greater than max_num_seqs (M)" (``config/scheduler.py:338-345``).
  The CLI flag is ``--max-num-active-seqs`` (``engine/arg_utils.py:1761``, ``EngineArgs`` field at
  ``:623``), parsed by ``optional_type(int)``: the literal ``None`` unsets it, ``0`` passes the parser and
  fails the config's ``ge=1``.
* **admission only**: the scheduler stops taking waiting requests into RUNNING once the running ones (and
  paused streaming sessions) reach it (``v1/core/sched/scheduler.py:1071-1074``); ``max_num_seqs`` stays
  the model runner's slot count (``:131``, asserted at ``:1633``).
* **no memory of its own**: the model runner's per-request buffers (``v1/worker/gpu_model_runner.py:525``),
  the profiling dummy run (``:5525``) and the CUDA-graph capture sizes (``config/vllm.py:2467-2550``) are
  all sized by ``max_num_seqs``. So the memory model ignores the flag (it is not one of
  :data:`.unmodelled.UNMODELLED_MEMORY_FLAGS`) and ``max_num_seqs`` stays the capacity the plan sizes.
* **metrics**: ``vllm:num_requests_running`` is ``len(running)`` (``scheduler.py:2921-2922, 3290``), so it
  never exceeds the cap; the requests the cap holds back stay in ``waiting`` and are counted by
  ``vllm:num_requests_waiting`` (reason ``capacity``). A queue with running requests at the cap is
  therefore the "queue at the sequence limit" the closed loop looks for, at the cap, not at
  ``max_num_seqs``.
* DFlash/DSpark speculative decoding may lower the cap to what ``max_num_batched_tokens`` drafts for
  (``config/vllm.py:2379-2396``); kvpilot reads the value given, the larger.

kvpilot's choice: the flag is the user's (``spec.engine.extraArgs`` or an EngineTuner target's own
command) and kvpilot never rewrites it. The plan keeps ``--max-num-seqs`` as the memory and graph capacity,
refuses a cap above it by name (vLLM would not start) and says which limit admits and which sizes memory.
The closed loop compares the running requests with the admission limit
(:func:`compute_admission_limit`); a raise of ``--max-num-seqs`` admits nothing more while the cap is there
and a cut below the cap does not start, so the sequence rules hold and name the flag
(:func:`describe_active_cap_binds`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpilot.tuner import errors
from kvpilot.tuner.vllm.args import find_flag_values

ACTIVE_SEQS_FLAG = "--max-num-active-seqs"
"""vLLM 0.33's flag (``engine/arg_utils.py:1761``); its default is ``None``: the admission limit is
``max_num_seqs`` (``config/scheduler.py:69``)."""

_UNSET = "None"
"""``optional_type(int)`` reads the literal ``None`` as not given (``engine/arg_utils.py:1762``)."""


def find_active_seqs(args: Sequence[str]) -> int | None:
    """The cap ``args`` set (the last occurrence wins, as with argparse), ``None`` when not given, unset
    with ``None``, or not a positive integer (:func:`check_active_seqs` refuses that one)."""
    cap: int | None = None
    for text in find_flag_values(args, ACTIVE_SEQS_FLAG):
        value = text.strip()
        try:
            number = int(value)
        except ValueError:
            number = None
        cap = number if number is not None and number >= 1 else None
    return cap


def check_active_seqs(args: Sequence[str]) -> None:
    """Refuse a cap vLLM 0.33 refuses: not an integer (its parser) or below 1 (``ge=1``,
    ``config/scheduler.py:69``); the literal ``None`` unsets it."""
    for text in find_flag_values(args, ACTIVE_SEQS_FLAG):
        value = text.strip()
        if value == _UNSET:
            continue
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            raise errors.InvalidEngineArgs(
                f"{ACTIVE_SEQS_FLAG} {value[:32]!r} must be a positive integer (vLLM 0.33 refuses it)",
                flag=ACTIVE_SEQS_FLAG,
            )


def check_active_below_seqs(cap: int | None, max_num_seqs: int | None) -> None:
    """Refuse a cap above ``max_num_seqs``: vLLM 0.33 does not start (``config/scheduler.py:338-345``)."""
    if cap is not None and max_num_seqs is not None and cap > max_num_seqs:
        raise errors.InvalidEngineArgs(
            f"{ACTIVE_SEQS_FLAG} {cap} is above --max-num-seqs {max_num_seqs}, the requests the engine's "
            f"memory and CUDA graphs are sized for: vLLM 0.33 refuses to start ('max_num_active_seqs "
            f"cannot be greater than max_num_seqs'); lower {ACTIVE_SEQS_FLAG} to at most {max_num_seqs}, "
            "or allow more sequences (a larger concurrency or a pinned --max-num-seqs that fits)",
            flag=ACTIVE_SEQS_FLAG,
        )


def compute_admission_limit(max_num_seqs: int, cap: int | None) -> int:
    """The requests the scheduler admits into RUNNING: the cap when given, else ``max_num_seqs``
    (``v1/core/sched/scheduler.py:134-138``; vLLM keeps the cap at or below ``max_num_seqs``)."""
    return max_num_seqs if cap is None else min(max_num_seqs, cap)


def describe_active_seqs_plan(cap: int, max_num_seqs: int) -> str:
    """The plan's note: which limit admits and which sizes memory."""
    return (
        f"{ACTIVE_SEQS_FLAG} {cap} admits the running requests; --max-num-seqs {max_num_seqs} sizes the "
        "model runner's per-request buffers, the memory profile and the CUDA graphs (vLLM 0.33: the cap has "
        "no memory of its own), and the KV cache is planned for it."
    )


def describe_active_cap_binds(cap: int, max_num_seqs: int, *, more: bool) -> str:
    """Why a sequence rule of the closed loop holds: the cap admits, kvpilot does not own it, and a change
    of ``--max-num-seqs`` alone either admits nothing more (``more``) or does not start (fewer)."""
    if more:
        change = (
            f"a raise of --max-num-seqs ({max_num_seqs}) admits no more requests while the cap stays; raise "
            f"{ACTIVE_SEQS_FLAG} in the engine's arguments (up to {max_num_seqs}) to admit more"
        )
    else:
        change = (
            f"a cut of --max-num-seqs below the cap does not start (vLLM 0.33 refuses "
            f"max_num_active_seqs > max_num_seqs); lower {ACTIVE_SEQS_FLAG} in the engine's arguments"
        )
    return f"{ACTIVE_SEQS_FLAG} {cap} admits the running requests, and kvpilot does not tune it: {change}"

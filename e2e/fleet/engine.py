"""The engine model: one vLLM V1 engine, step by step, in simulated time.

The e2e fleet, the demo and ``bench/closed_loop.py`` all run this one model. Per engine step, as
vLLM V1's scheduler does:

* **Requests** arrive as a Poisson process with uniform or lognormal lengths
  (:class:`e2e.fleet.truth.Workload`).
* **Token budget**: running sequences first (one decode token each, or the next chunk of a prompt
  still being prefilled), then waiting requests first come first served, while fewer than
  ``max_num_seqs`` run, the ``max_num_batched_tokens`` budget lasts (chunked prefill) and the KV cache
  has free blocks for the tokens scheduled.
* **Preemption by recomputation**: when a running sequence needs a block and none is free, the most
  recently admitted one is preempted: its blocks are freed, it keeps its generated tokens and goes to
  the head of the queue, to be prefilled again (prompt + generated) when readmitted.
* **Step time** from a roofline (:class:`e2e.fleet.truth.EnginePerf`): prefill compute-bound, decode
  memory-bound (weights plus the KV of every scheduled context), fp8 KV halving the KV read.
* **Latency** per request: queue time, time to first token, inter-token latency, end to end.

Steps that only decode, with nothing to admit, are taken several at a time (up to the next arrival,
finish or block boundary): the result is the same as one at a time, only faster, so hours of traffic
simulate in seconds.

No I/O and no wall clock: :meth:`SimEngine.advance` takes a duration. The numbers it produces
(gauges, counter increments, finished requests) are exported by :mod:`e2e.fleet.exposition`.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random

from e2e.fleet.truth import FP8_KV_DTYPES, EngineArgs, GroundTruth, Workload

MAX_MACRO_STEPS = 64
"""Pure-decode steps taken at once at most."""


@dataclasses.dataclass
class Request:
    id: int
    prompt: int
    output: int
    arrived: float
    generated: int = 0
    computed: int = 0
    """Tokens whose KV is in the cache (prompt, then generated tokens; 0 again after a preemption)."""
    blocks: int = 0
    preemptions: int = 0
    prompt_counted: bool = False
    scheduled_at: float | None = None
    first_token_at: float | None = None
    finished_reason: str = "stop"

    @property
    def prefill_target(self) -> int:
        """Tokens to (re)compute before the next token can be sampled."""
        return self.prompt + max(0, self.generated - 1) if self.generated else self.prompt

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prefill_target


@dataclasses.dataclass(frozen=True)
class Finished:
    prompt_tokens: int
    generation_tokens: int
    max_tokens: int
    finished_reason: str
    preemptions: int
    queue_s: float
    ttft_s: float
    e2e_s: float
    inference_s: float

    @property
    def itl_s(self) -> float:
        """Mean inter-token latency (vLLM's TPOT: decode time over the tokens after the first)."""
        return (self.e2e_s - self.ttft_s) / max(1, self.generation_tokens - 1)


@dataclasses.dataclass
class Deltas:
    """What happened since the last :meth:`SimEngine.drain`."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    iterations: int = 0
    iteration_tokens: list[int] = dataclasses.field(default_factory=list)
    finished: list[Finished] = dataclasses.field(default_factory=list)


class SimEngine:
    def __init__(
        self,
        truth: GroundTruth,
        workload: Workload,
        args: EngineArgs,
        *,
        seed: int = 0,
        closed_loop_clients: int | None = None,
    ) -> None:
        """``closed_loop_clients``: instead of Poisson arrivals, that many clients each send their next
        request when the last one finishes (``vllm bench serve --max-concurrency N --request-rate inf``)."""
        self.truth = truth
        self.workload = workload
        self.args = args
        self.rng = random.Random(seed)
        self.block_size = truth.block(args)
        self.num_blocks = truth.num_gpu_blocks(args)
        self.max_num_seqs = truth.max_num_seqs(args)
        self.max_model_len = truth.max_model_len(args)
        self.max_num_batched_tokens = truth.max_num_batched_tokens(args)
        self.fp8_kv = args.kv_cache_dtype in FP8_KV_DTYPES and truth.fp8_kv_supported
        self.now = 0.0
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.used_blocks = 0
        self._next_id = 0
        self._clients = closed_loop_clients
        self._next_arrival = math.inf if closed_loop_clients else self._interarrival()
        self.deltas = Deltas()
        self.total_preemptions = 0
        self.total_finished = 0
        self.busy_s = 0.0
        for _ in range(closed_loop_clients or 0):
            self._new_request(self.now)

    # ------------------------------------------------------------------ traffic
    def _interarrival(self) -> float:
        rate = self.workload.arrival_rate
        return self.rng.expovariate(rate) if rate > 0 else math.inf

    def _length(self, mean: int) -> int:
        w = self.workload
        if w.distribution == "lognormal" and w.spread > 0:
            sigma = math.sqrt(math.log(1 + w.spread**2))
            return max(1, int(round(self.rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma))))
        return max(1, int(round(mean * self.rng.uniform(1 - w.spread, 1 + w.spread))))

    def _new_request(self, at: float) -> None:
        prompt = min(self._length(self.workload.prompt_tokens), self.max_model_len - 1)
        output = self._length(self.workload.output_tokens)
        req = Request(self._next_id, prompt, output, at)
        if prompt + output > self.max_model_len:
            req.output = self.max_model_len - prompt
            req.finished_reason = "length"
        self._next_id += 1
        self.waiting.append(req)

    def _arrive(self) -> None:
        while self._next_arrival <= self.now:
            self._new_request(self._next_arrival)
            self._next_arrival += self._interarrival()

    # ------------------------------------------------------------------ scheduling
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _preempt_last(self) -> None:
        victim = self.running.pop()
        self.used_blocks -= victim.blocks
        victim.blocks = victim.computed = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        self.deltas.preemptions += 1
        self.total_preemptions += 1

    def _grow(self, req: Request, tokens: int) -> bool:
        """Blocks for ``tokens`` more of ``req``'s KV; False when the cache has none left."""
        need = self._blocks_for(req.computed + tokens) - req.blocks
        if need > self.num_blocks - self.used_blocks:
            return False
        req.blocks += max(0, need)
        self.used_blocks += max(0, need)
        return True

    def _schedule(self) -> list[tuple[Request, int]]:
        """One step's work: (request, tokens to compute), running first, then admissions."""
        budget = self.max_num_batched_tokens
        work: list[tuple[Request, int]] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            tokens = min(req.prefill_target - req.computed, budget) if req.prefilling else 1
            while not self._grow(req, tokens):
                if self.running[-1] is req:  # nothing left to preempt but itself
                    self._preempt_last()
                    return work
                self._preempt_last()
            work.append((req, tokens))
            budget -= tokens
            i += 1
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            req = self.waiting[0]
            tokens = min(req.prefill_target - req.computed, budget)
            if not self._grow(req, tokens):
                break
            self.waiting.popleft()
            self.running.append(req)
            if req.scheduled_at is None:
                req.scheduled_at = self.now
            if not req.prompt_counted:
                req.prompt_counted = True
                self.deltas.prompt_tokens += req.prompt
            work.append((req, tokens))
            budget -= tokens
        return work

    def _step_seconds(self, decode: int, context: int, prefill: int, pairs: float) -> float:
        return self.truth.perf.step_seconds(
            decode=decode, prefill=prefill, context_tokens=context, prefill_pairs=pairs,
            kv_bytes_per_token=self.truth.kv_bytes_per_token, fp8_kv=self.fp8_kv,
        )  # fmt: skip

    def _macro_steps(self, work: list[tuple[Request, int]]) -> int:
        """How many identical pure-decode steps can be taken at once (1 when anything else happens)."""
        if any(req.prefilling or t != 1 for req, t in work):
            return 1
        if self.waiting and len(self.running) < self.max_num_seqs:
            return 1  # admission may happen next step
        k = min(MAX_MACRO_STEPS, min(req.output - req.generated for req, _ in work))
        # block boundaries: each sequence needs a new block every block_size tokens
        free = self.num_blocks - self.used_blocks
        # tokens that still fit in each sequence's blocks (>= 1: this step's token was allocated)
        distances = sorted(req.blocks * self.block_size - req.computed for req, _ in work)
        if len(distances) > free:
            k = min(k, distances[free])  # the (free+1)-th new block would not fit
        return max(1, min(k, self.block_size))

    def _step(self, until: float) -> bool:
        """Run one engine step (or several identical ones); False when idle until ``until``."""
        self._arrive()
        work = self._schedule()
        if not work:
            nxt = min(self._next_arrival, until)
            self.now = max(self.now, nxt)
            return self._next_arrival <= until
        k = self._macro_steps(work)
        decode = sum(1 for req, t in work if not req.prefilling)
        context = sum(req.computed for req, t in work if not req.prefilling) + decode * (k - 1) // 2
        prefill = sum(t for req, t in work if req.prefilling)
        pairs = sum(t * (req.computed + t / 2) for req, t in work if req.prefilling)
        step = self._step_seconds(decode, context, prefill, pairs)
        if k > 1 and self._next_arrival < math.inf:  # stop at the next arrival
            k = max(1, min(k, int((self._next_arrival - self.now) / step) + 1))
            for req, _ in work:  # the block growth of the extra steps (they fit: _macro_steps)
                self._grow(req, k)
        self.now += step * k
        self.busy_s += step * k
        self._apply(work, k)
        self.deltas.iterations += k
        self.deltas.iteration_tokens.extend([decode + prefill] * min(k, 4))
        return True

    def _apply(self, work: list[tuple[Request, int]], k: int) -> None:
        finished: list[Request] = []
        generated = 0
        for req, tokens in work:
            was_prefilling = req.prefilling
            req.computed += tokens * k if not was_prefilling else tokens
            if was_prefilling and req.prefilling:
                continue  # a chunk of the prompt: no token sampled yet
            new = k if not was_prefilling else 1
            if was_prefilling and req.generated:  # a recomputed sequence resumes: no token is lost
                new = 1
            new = min(new, req.output - req.generated)
            req.generated += new
            generated += new
            if req.first_token_at is None and new > 0:
                req.first_token_at = self.now
            if req.generated >= req.output:
                finished.append(req)
        self.deltas.generation_tokens += generated
        for req in finished:
            self.running.remove(req)
            self.used_blocks -= req.blocks
            self._finish(req)

    def _finish(self, req: Request) -> None:
        self.total_finished += 1
        scheduled = req.scheduled_at if req.scheduled_at is not None else self.now
        first = req.first_token_at if req.first_token_at is not None else self.now
        self.deltas.finished.append(
            Finished(
                prompt_tokens=req.prompt,
                generation_tokens=req.generated,
                max_tokens=req.output,
                finished_reason=req.finished_reason,
                preemptions=req.preemptions,
                queue_s=scheduled - req.arrived,
                ttft_s=first - req.arrived,
                e2e_s=self.now - req.arrived,
                inference_s=self.now - scheduled,
            )
        )
        if self._clients:
            self._new_request(self.now)

    # ------------------------------------------------------------------ API
    def advance(self, dt: float) -> None:
        """Run the engine for ``dt`` simulated seconds."""
        until = self.now + dt
        while self.now < until:
            if not self._step(until):
                self.now = until
                break

    def drain(self) -> Deltas:
        d, self.deltas = self.deltas, Deltas()
        return d

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def total_arrived(self) -> int:
        return self._next_id

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

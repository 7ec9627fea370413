"""A small queueing model of one vLLM V1 engine, in simulated time.

Requests arrive as a Poisson process; the scheduler admits them first come,
first served while fewer than ``max_num_seqs`` run, the prefill token budget
(``max_num_batched_tokens`` per step) allows and the KV cache has free blocks
for the prompt. Every engine step decodes one token per running sequence; a
step takes ``decode_step_s + decode_step_per_seq_s * running``. When a running
sequence needs a block and none is free, the most recently admitted sequence
is preempted by recomputation (its blocks are freed, it goes back to the head
of the queue and is prefilled again later), as V1's scheduler does. That is
all a preemption storm is: more concurrent sequences than the KV cache holds.

No I/O and no wall clock: :meth:`SimEngine.advance` takes a duration. The
numbers it produces (gauges, counter increments, finished requests) are
exported by :mod:`e2e.fleet.exposition`.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random

from e2e.fleet.truth import EngineArgs, GroundTruth, Workload

#: Simulated seconds per inner iteration (several engine steps at once).
ITERATION_S = 0.05


@dataclasses.dataclass
class Request:
    id: int
    prompt: int
    output: int
    arrived: float
    generated: int = 0
    blocks: int = 0
    preemptions: int = 0
    prompt_counted: bool = False
    scheduled_at: float | None = None
    first_token_at: float | None = None
    finished_reason: str = "stop"


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
    def __init__(self, truth: GroundTruth, workload: Workload, args: EngineArgs, *, seed: int = 0) -> None:
        self.truth = truth
        self.workload = workload
        self.args = args
        self.rng = random.Random(seed)
        self.block_size = truth.block(args)
        self.num_blocks = truth.num_gpu_blocks(args)
        self.max_num_seqs = truth.max_num_seqs(args)
        self.max_model_len = truth.max_model_len(args)
        self.max_num_batched_tokens = args.max_num_batched_tokens or 8192
        self.now = 0.0
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.used_blocks = 0
        self._next_id = 0
        self._next_arrival = self._interarrival()
        self._step_carry = 0.0
        self.deltas = Deltas()
        self.total_preemptions = 0
        self.total_finished = 0

    # ------------------------------------------------------------------ traffic
    def _interarrival(self) -> float:
        rate = self.workload.arrival_rate
        return self.rng.expovariate(rate) if rate > 0 else math.inf

    def _length(self, mean: int) -> int:
        s = self.workload.spread
        return max(1, int(round(mean * self.rng.uniform(1 - s, 1 + s))))

    def _arrive(self) -> None:
        while self._next_arrival <= self.now:
            prompt = min(self._length(self.workload.prompt_tokens), self.max_model_len - 1)
            output = self._length(self.workload.output_tokens)
            req = Request(self._next_id, prompt, output, self._next_arrival)
            if prompt + output > self.max_model_len:
                req.output = self.max_model_len - prompt
                req.finished_reason = "length"
            self._next_id += 1
            self.waiting.append(req)
            self._next_arrival += self._interarrival()

    # ------------------------------------------------------------------ scheduling
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _preempt_last(self) -> None:
        victim = self.running.pop()
        self.used_blocks -= victim.blocks
        victim.blocks = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        self.deltas.preemptions += 1
        self.total_preemptions += 1

    def _admit(self, budget: int) -> int:
        """Admit waiting requests FCFS; returns the prefill tokens computed."""
        computed = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            tokens = req.prompt + req.generated  # recomputation after a preemption
            need = self._blocks_for(tokens + 1)
            if need > self.num_blocks - self.used_blocks or (computed and computed + tokens > budget):
                break
            self.waiting.popleft()
            req.blocks = need
            self.used_blocks += need
            self.running.append(req)
            computed += tokens
            if req.scheduled_at is None:
                req.scheduled_at = self.now
            if not req.prompt_counted:
                req.prompt_counted = True
                self.deltas.prompt_tokens += req.prompt
        return computed

    def _iterate(self, dt: float) -> None:
        w = self.workload
        step = w.decode_step_s + w.decode_step_per_seq_s * len(self.running)
        self._step_carry += dt / step
        steps = int(self._step_carry)
        self._step_carry -= steps
        self.now += dt
        self._arrive()
        if steps == 0:
            return
        # decode `steps` tokens per running sequence, growing their KV blocks
        finished: list[Request] = []
        generated = 0
        for req in self.running:
            n = min(steps, req.output - req.generated)
            req.generated += n
            generated += n
            if req.first_token_at is None and n > 0:
                req.first_token_at = self.now
            need = self._blocks_for(req.prompt + req.generated + 1)
            if need > req.blocks:
                self.used_blocks += need - req.blocks
                req.blocks = need
            if req.generated >= req.output:
                finished.append(req)
        self.deltas.generation_tokens += generated
        for req in finished:
            self.running.remove(req)
            self.used_blocks -= req.blocks
            self._finish(req)
        # out of blocks: preempt the most recently admitted sequences (recompute later)
        while self.used_blocks > self.num_blocks and self.running:
            self._preempt_last()
        prefill = self._admit(self.max_num_batched_tokens * steps)
        self.deltas.iterations += steps
        per_step = (generated + prefill) / steps
        self.deltas.iteration_tokens.extend([int(per_step)] * min(steps, 4))

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

    # ------------------------------------------------------------------ API
    def advance(self, dt: float) -> None:
        """Run the engine for ``dt`` simulated seconds."""
        while dt > 1e-12:
            d = min(dt, ITERATION_S)
            self._iterate(d)
            dt -= d

    def drain(self) -> Deltas:
        d, self.deltas = self.deltas, Deltas()
        return d

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

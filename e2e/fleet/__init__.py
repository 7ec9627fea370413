"""A fleet simulator of vLLM, SGLang and TGI pods for kvpilot's e2e suite and demo (test tooling).

* :mod:`e2e.fleet.truth` -- each scenario's ground truth (GPU memory, KV bytes, fault thresholds),
  the workload, and vLLM's start-up/OOM texts. Never imports kvpilot's tuner.
* :mod:`e2e.fleet.engine` -- a queueing model of one vLLM V1 engine in simulated time.
* :mod:`e2e.fleet.exposition` -- vLLM 0.33's ``/metrics`` (names, types, labels, buckets), with a
  switch for the pre-rename names.
* :mod:`e2e.fleet.fleet` -- :class:`Fleet`: plays the container of every kvpilot-managed pod on the
  KWOK cluster (start-up, serving, crash loop), serves ``/metrics`` per pod on 127.0.0.1 and writes
  Prometheus' ``file_sd`` targets.
* :mod:`e2e.fleet.sglang_truth`, :mod:`e2e.fleet.sglang_exposition` -- SGLang 0.5.23 pods
  (``python3 -m sglang.launch_server``): their flags, the KV pool SGLang sizes, its failure texts and its
  ``/metrics``, from SGLang's own source; the queueing is the same engine model's.
* :mod:`e2e.fleet.tgi_truth`, :mod:`e2e.fleet.tgi_exposition` -- TGI 3.3.7 pods (``text-generation-launcher``,
  or TGI's image): their flags, the KV capacity the warm-up infers from the memory left after its prefill
  (x ``--cuda-memory-fraction`` x 0.90), the two start-up failures and a run-time CUDA OOM in the launcher's
  log, the router's admission limit (429 "Model is overloaded" beyond ``--max-concurrent-requests``) and its
  ``/metrics``. TGI's names and texts come from :mod:`kvpilot.tuner.tgi` (their one home); the arithmetic is
  the fleet's own, from TGI's source. Not modelled: TGI's reservation of whole requests (the engine model
  preempts instead), the launcher's compute-optimal prefill default, validation, prefix caching.
* :mod:`e2e.fleet.players` -- the one protocol the fleet plays SGLang and TGI through (vLLM is its own).
* :mod:`e2e.fleet.pod` -- one simulated container: state, ``/metrics`` server, the pod status kubelet
  would report when it (re)starts.
* :mod:`e2e.fleet.real_engines` -- the pods that run a real vLLM engine instead
  (:mod:`e2e.vllm_cpu.engine_process`): launch, ``/health``, exit (docs/real-engine.md).
* :mod:`e2e.fleet.stack`, :mod:`e2e.fleet.kopf_process`, :mod:`e2e.fleet.testing` -- the harness the
  closed-loop tests and the demo share: CRD, Prometheus, fleet and the operator as a host process.

Run it in-process (``with Fleet(kubeconfig, prom.targets_file) as fleet: ...``) or as a process:
``python -m e2e.fleet --kubeconfig K --targets F [--scenarios scenarios.json]``.
"""

from e2e.fleet.engine import SimEngine
from e2e.fleet.exposition import VllmMetrics
from e2e.fleet.fleet import Fleet, FleetEvent, storm_workload
from e2e.fleet.truth import EngineArgs, GroundTruth, Scenario, Workload

__all__ = [
    "EngineArgs",
    "Fleet",
    "FleetEvent",
    "GroundTruth",
    "Scenario",
    "SimEngine",
    "VllmMetrics",
    "Workload",
    "storm_workload",
]

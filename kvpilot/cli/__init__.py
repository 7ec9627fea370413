"""The ``kvpilot`` command: plan vLLM engine arguments, list the catalogues, estimate, render.

The edge for people and scripts, beside the operator: it reads files and argv,
calls the pure tuner, and prints. Subcommands:

* ``plan`` -- engine settings for a model on a GPU type, as a table or ``--json``; with ``--nodes N``
  (or ``auto``), or more ``--gpus`` than ``--gpus-per-node``, a replica over several nodes
  (:func:`kvpilot.tuner.plan.compute_node_plan`); with ``--engine sglang``, SGLang's own budget
  (:func:`kvpilot.tuner.engines.plan_sglang_budget`) explained; with ``--engine tgi``, TGI 3.3.7's warm-up
  budget (:func:`kvpilot.tuner.engines.plan_tgi_budget`) explained;
* ``gpus`` / ``models`` -- the built-in catalogues;
* ``estimate --cases FILE`` -- the memory model over a JSON list of vLLM start-up cases;
* ``render -f isvc.yaml`` -- the Deployment and Service the operator would apply (a LeaderWorkerSet for a
  replica over several nodes, which the operator applies where LeaderWorkerSet is installed);
* ``diagnose [LOG | --pod NAME]`` -- what a vLLM log says happened, and what to change
  (:mod:`kvpilot.tuner.diagnose`); with ``--gpu`` and a catalogue model in the log, kvpilot's plan;
* ``timeline NAME`` -- an SVG of one InferenceService's settings and decisions over time
  (:mod:`kvpilot.observability.timeline`), with KV usage and preemptions from ``--prometheus``.

Exit status: 0 done; 1 ``plan`` found nothing that fits (the plan says why); 2 bad
input (an unknown GPU or model, an unreadable file, a config the memory model cannot
account for). Errors are one message on stderr, never a traceback.

Each subcommand is a module here (``plan``, ``engine_plans``, ``catalogues``, ``cases``, ``render``,
``diagnose``, ``timeline``); :mod:`kvpilot.cli.main` parses argv and runs one.
"""

from kvpilot.cli.inputs import EXIT_INFEASIBLE, EXIT_OK, EXIT_USAGE, CliError
from kvpilot.cli.main import build_parser, main

__all__ = ["EXIT_INFEASIBLE", "EXIT_OK", "EXIT_USAGE", "CliError", "build_parser", "main"]

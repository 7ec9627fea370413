"""kvpilot: a Kubernetes operator that plans and retunes vLLM engine arguments.

Sub-packages:

* :mod:`kvpilot.tuner` -- pure, sans-I/O: model specs, the GPU catalogue, vLLM's
  memory model, the static planner and the closed-loop policy.
* :mod:`kvpilot.operator` -- the kopf edge: Kubernetes objects in, tuner types
  through, patches out.
"""

__version__ = "0.1.0"
"""The one home of the version: packaging reads it (pyproject's dynamic version), the chart's appVersion
matches it (tests/test_versions.py)."""

"""What kvpilot shows people: the Grafana dashboard and the Prometheus alert rules, built from code.

:mod:`.series` names every series both read (vLLM's from :mod:`kvpilot.tuner.vllm.serving`, the
operator's own from :mod:`kvpilot.operator.clients.metrics`, dcgm-exporter's from the operator's
Prometheus client) and how one InferenceService's pods are selected; :mod:`.dashboard` and
:mod:`.alerts` return the JSON and YAML documents as data; ``python -m kvpilot.observability``
writes them where the chart and the docs ship them (``tests/observability`` checks the committed
files are what the code builds). docs/observability.md explains each panel and alert.
"""

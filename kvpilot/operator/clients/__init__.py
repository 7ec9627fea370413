"""The operator's clients: the only modules that talk to Kubernetes (``kube``) and Prometheus
(``prometheus``),
with their settings (``prometheus_settings``) and the operator's own metrics (``metrics``)."""

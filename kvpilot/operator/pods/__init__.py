"""The workload kvpilot renders and reads back: the Deployment (``workloads``), the pod template
(``pod_template``), the weight storage (``storage``), GPU capacity (``capacity``), the rollout strategy
(``rollout_strategy``) and the pods' own readings (``pod_view``, ``pod_summary``, ``pod_reading``,
``pod_cache``)."""

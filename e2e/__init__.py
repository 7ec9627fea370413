"""kvpilot's end-to-end harness: a real local Kubernetes control plane with KWOK GPU nodes.

``e2e.cluster.LocalCluster`` starts it; ``e2e.nodes`` defines the GPU node pools;
``e2e.pods.simulate_container_crash`` makes a pod look like a crashing vLLM container.
"""

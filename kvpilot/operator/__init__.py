"""kvpilot's Kubernetes edge: kopf handlers in, tuner types through, patches out.

Wings, top down (import-linter's ``operator-layers`` contract keeps the order; docs/operator.md draws it):

``main``
    every kopf registration and the start-up.
``inferenceservice`` | ``enginetuner``
    one package per kind; neither imports the other.
``loop``
    what both kinds' closed loops share (settings, the state read back from status).
``status``
    the one writer of status: patches built, records written, events.
``planning`` | ``pods``
    the way to a plan (model resolution, release, profiles, modes) and the workload kvpilot renders
    (Deployment, pod template, storage, capacity, rollout, pod readings).
``clients``
    the only modules that talk to Kubernetes, Prometheus and the Hub.
``api`` | ``errors`` and ``conditions`` | ``labels`` | ``timers`` | ``kopf_internals``
    the custom resources' types, the error tree and the smallest shared helpers.
"""

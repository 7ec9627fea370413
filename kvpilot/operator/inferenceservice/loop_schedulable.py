"""The ``Schedulable`` condition of an InferenceService: could some node ever take one of its pods?

Checked by the closed loop (:mod:`.closed_loop`, every mode) against the nodes' labels, GPU product, taints
and allocatable ``nvidia.com/gpu`` (:mod:`kvpilot.operator.pods.capacity`), only while a pod cannot schedule
or the condition is False, so that it follows the nodes as they change.
"""

from __future__ import annotations

from kvpilot.operator import conditions, errors
from kvpilot.operator.inferenceservice import loop_actions, loop_observing
from kvpilot.operator.inferenceservice.loop_reading import Service
from kvpilot.operator.loop.loop_deps import LoopDeps
from kvpilot.operator.planning import resolve
from kvpilot.operator.pods import capacity, pod_view
from kvpilot.operator.status import status_patch


async def fetch_schedulable(
    deps: LoopDeps,
    svc: Service,
    inputs: resolve.Inputs | None,
    views: list[pod_view.PodView],
    cluster: loop_observing.Cluster | None,
) -> list[status_patch.Update]:
    """The ``Schedulable`` condition: checked against the nodes while a pod cannot schedule or it is False
    (so it follows the nodes as they change); True without a read once every pod is on a node. ``inputs``
    ``None`` (mode Off resolves nothing): resolved here, when needed."""
    old = svc.old
    was_false = (conditions.find_condition(old.get("conditions"), conditions.SCHEDULABLE) or {}).get(
        "status"
    ) == conditions.FALSE
    pending = any(v.unschedulable for v in views)
    if not pending and not was_false:
        if views and all(v.started_at is not None for v in views if not v.terminating):
            return [(conditions.SCHEDULABLE, conditions.TRUE, "Scheduled", "every pod is on a node")]
        return []
    if deps.kube is None:
        return []
    if inputs is None:
        try:
            inputs = await resolve.fetch_inputs(svc.spec, svc.namespace, deps.kube, deps.hub)
        except Exception:  # noqa: BLE001 -- the reconciler reports resolution failures
            return []
    if cluster is not None:
        nodes = cluster[0]
    else:  # the nodes alone: what could ever fit does not depend on the pods
        try:
            nodes = [capacity.build_node_view(n) for n in await deps.nodes.fetch(deps.kube, deps.clock())]
        except errors.OperatorError:
            return []
    deployment = loop_actions.build_loop_deployment(svc.meta, svc.spec, inputs, svc.state.current)
    shape = capacity.build_pod_shape(deployment)
    verdict = capacity.compute_schedulable(shape, nodes)
    status = conditions.TRUE if verdict.schedulable else conditions.FALSE
    return [(conditions.SCHEDULABLE, status, verdict.reason, verdict.message)]

"""Never adopt what kvpilot does not own: an object of a wanted name that someone else controls is a conflict.

kvpilot server-side applies its objects with ``force=True`` and a controller owner reference, so an apply onto
an object of the same name that another team made would take it over: its fields rewritten, its owner
reference added, and the garbage collector deleting it with the InferenceService (an InferenceService named
like another team's Service redirected its traffic; one named ``ledger`` mounted the claim
``ledger-model-cache`` of another team, then deleted it). Before anything is applied, each object is read by
name: one that exists and is not controlled by this InferenceService is a
:class:`~kvpilot.operator.errors.NameConflict`, and nothing of that InferenceService is applied.

"Controlled by" is the controller owner reference's ``uid`` (the InferenceService's own, set by
:func:`~kvpilot.operator.pods.workloads.build_owner_reference`); a manifest built without a uid (no uid known)
is compared by kind and name instead. Deployments and Services found to be ours are remembered
(:class:`VerifiedOwners`, bounded) so the closed loop's re-applies cost no extra read; drift repair watches
those two kinds and forgets one when it is deleted. The memory is one object of the operator's state, made at
start-up (:func:`kvpilot.operator.main.configure`) and handed to the reconciler, the closed loop and drift
repair, so that a deletion drift repair sees is forgotten by every writer. Claims and PodDisruptionBudgets
are read on every apply: no watch would see one deleted and re-made by another team, and only a reconcile
(not the loop) applies them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator import api, errors
from kvpilot.operator.clients.kube import Kube

ObjectKey = tuple[str, str, str, str]
"""(kind, namespace, name, the owner's uid or name)."""

REMEMBERED_KINDS = frozenset({"Deployment", "Service"})
"""The kinds whose deletion drift repair sees (:mod:`kvpilot.operator.inferenceservice.drift`), so whose
verified ownership may be remembered; any other kind is read before every apply."""


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object's controller owner reference, if any."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller")), None)


def is_controlled_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    """Whether ``owner`` (an InferenceService) is ``obj``'s controller, by uid."""
    ref = controller_of(obj)
    uid = (owner.get("metadata") or {}).get("uid")
    return ref is not None and bool(uid) and ref.get("uid") == uid


def _owner_label(manifest: Mapping[str, Any]) -> str:
    labels = (manifest.get("metadata") or {}).get("labels") or {}
    return str(labels.get(api.SERVICE_LABEL, ""))


def compute_conflict(manifest: Mapping[str, Any], existing: Mapping[str, Any] | None) -> str | None:
    """Why ``manifest`` must not be applied onto ``existing`` (``None``: absent, or controlled by the same
    InferenceService)."""
    if existing is None:
        return None
    wanted, have = controller_of(manifest), controller_of(existing)
    if have is not None and wanted is not None and have.get("uid") == wanted.get("uid"):
        return None
    if (
        wanted is None
        and have is not None
        and have.get("kind") == api.KIND
        and have.get("name") == _owner_label(manifest)
    ):
        return None
    meta = manifest["metadata"]
    owner = f"{have.get('kind')} {have.get('name')}" if have is not None else "no owner"
    mine = _owner_label(manifest) or meta["name"]
    return (
        f"{manifest['kind']} {meta['namespace']}/{meta['name']} already exists and is not kvpilot's "
        f"(controlled by: {owner}); kvpilot never modifies or adopts another's object. Rename the "
        f"InferenceService {mine}, or remove that {manifest['kind']} if it is no longer used. Retrying."
    )


class VerifiedOwners:
    """Objects already found to be controlled by their InferenceService, least recently used first out."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._seen: OrderedDict[ObjectKey, None] = OrderedDict()

    @staticmethod
    def key(manifest: Mapping[str, Any]) -> ObjectKey:
        meta = manifest["metadata"]
        owner = controller_of(manifest)
        who = str(owner.get("uid")) if owner is not None else _owner_label(manifest)
        return manifest["kind"], meta["namespace"], meta["name"], who

    def __contains__(self, key: ObjectKey) -> bool:
        if key in self._seen:
            self._seen.move_to_end(key)
            return True
        return False

    def add(self, key: ObjectKey) -> None:
        self._seen[key] = None
        self._seen.move_to_end(key)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """After the object was deleted: the next apply reads it again (someone else may take the name)."""
        for key in [k for k in self._seen if k[:3] == (kind, namespace, name)]:
            del self._seen[key]


def check_ownership(manifests: Sequence[Mapping[str, Any]], kube: Kube, verified: VerifiedOwners) -> None:
    """Raise :class:`~kvpilot.operator.errors.NameConflict` naming every object another controls (blocking
    reads: run it in :data:`~kvpilot.operator.clients.kube.IO_POOL`); ``verified``: the operator's memory of
    objects already found to be its own (per process; a restart reads each once)."""
    problems = []
    for manifest in manifests:
        key = verified.key(manifest)
        if key in verified:
            continue
        meta = manifest["metadata"]
        existing = kube.read_object(manifest["kind"], meta["namespace"], meta["name"])
        conflict = compute_conflict(manifest, existing)
        if conflict is None:
            if manifest["kind"] in REMEMBERED_KINDS:
                verified.add(key)
        else:
            problems.append(conflict)
    if problems:
        raise errors.NameConflict("; ".join(problems))

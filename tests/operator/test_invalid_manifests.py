"""The invalid-manifest table without an API server: schema and CEL cases are refused by the
pydantic models and the CEL equivalents; operator cases by the reconciliation."""

from __future__ import annotations

import re

import kopf
import pytest
from invalid_manifests import CASES, Case
from operator_fakes import Harness

from kvpilot.operator import errors
from kvpilot.operator.inferenceservice import desired

API_SERVER_CASES = [c for c in CASES if c.expect in ("schema", "cel")]
OPERATOR_CASES = [c for c in CASES if c.expect == "operator"]


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 15
    assert {c.expect for c in CASES} == {"schema", "cel", "operator"}
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", API_SERVER_CASES, ids=lambda c: c.name)
def test_refused_before_planning(case: Case) -> None:
    with pytest.raises(errors.InvalidSpec) as info:
        desired.parse_spec(case.manifest()["spec"])
    # the operator names list items as pydantic does (tolerations.0), the API server as tolerations[0]
    where = re.sub(r"\[(\d+)\]", r".\1", case.match) if case.expect == "schema" else case.match
    assert where in info.value.message


@pytest.mark.parametrize("case", OPERATOR_CASES, ids=lambda c: c.name)
async def test_answered_with_ready_false(case: Case, harness: Harness) -> None:
    body = case.manifest()
    body["metadata"].update(namespace="ns1", uid="u1", generation=1)
    harness.deps.plan_fn = None  # the real planner decides what does not fit
    with pytest.raises((kopf.PermanentError, kopf.TemporaryError)):
        await harness.run(body)
    ready = next(c for c in body["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", case.match)
    assert harness.emitter.events[-1][:2] == ("Warning", case.match)
    assert harness.kube.applied == []

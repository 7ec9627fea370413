"""A transport failure talking to the API server reaches tenant-visible text (conditions, events) as its kind
only; the exception's own words (the API server's address, its answer) stay in the operator's log."""

from __future__ import annotations

import logging

import pytest
from kubernetes import client

from kvpilot.operator import errors
from kvpilot.operator.clients.kube import ClusterKube


def _unreachable_cluster() -> ClusterKube:
    configuration = client.Configuration(host="http://127.0.0.1:1")  # nothing listens on port 1
    configuration.retries = False
    return ClusterKube(client.ApiClient(configuration))


def test_a_refused_connection_names_its_kind_not_its_address(caplog: pytest.LogCaptureFixture) -> None:
    kube = _unreachable_cluster()
    with caplog.at_level(logging.WARNING), pytest.raises(errors.ApplyFailed) as raised:
        kube.read_config_map_data("team-a", "model-config")
    text = str(raised.value)
    assert text.startswith("reading model-config failed: ") and "talking to the API server" in text
    assert "127.0.0.1" not in text and ":1" not in text
    assert "127.0.0.1" in caplog.text  # the detail is kept for the operator's administrator


def test_an_apply_that_cannot_connect_omits_the_address(caplog: pytest.LogCaptureFixture) -> None:
    kube = _unreachable_cluster()
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment"}
    deployment["metadata"] = {"name": "llm", "namespace": "a"}
    with caplog.at_level(logging.WARNING), pytest.raises(errors.ApplyFailed) as raised:
        kube.apply(deployment)
    assert "127.0.0.1" not in str(raised.value) and "127.0.0.1" in caplog.text


def test_discovering_leader_worker_sets_without_a_connection_fails_loudly_not_as_absent() -> None:
    """An unreachable API server is an ApplyFailed (retried), never "the LWS CRD is not installed"."""
    kube = _unreachable_cluster()
    with pytest.raises(errors.ApplyFailed) as raised:
        kube.serves_kind("LeaderWorkerSet")
    assert str(raised.value).startswith("discovering leaderworkerset.x-k8s.io/v1 failed: ")
    assert "127.0.0.1" not in str(raised.value)
    group = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "llm", "namespace": "a"},
    }
    with pytest.raises(errors.ApplyFailed, match="applying LeaderWorkerSet llm failed"):
        kube.apply(group)

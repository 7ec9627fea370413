"""Label and toleration syntax: the CRD's CEL rules and the operator's checks are the same rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpilot.operator import api, labels

CRD = Path(__file__).resolve().parents[2] / "crds" / "inferenceservices.kvpilot.io.yaml"


def test_the_crd_embeds_the_patterns_and_the_messages() -> None:
    text = " ".join(CRD.read_text().split())
    assert text.count(labels.LABEL_KEY_PATTERN) == 2  # nodeSelector keys, toleration keys
    assert text.count(labels.LABEL_VALUE_PATTERN) == 2  # nodeSelector values, toleration values
    messages = (
        labels.SELECTOR_KEY,
        labels.SELECTOR_VALUE,
        labels.TOLERATION_KEY,
        labels.TOLERATION_VALUE,
        labels.EXISTS_WITH_VALUE,
        labels.NO_KEY_NOT_EXISTS,
        labels.SECONDS_NOT_NOEXECUTE,
    )
    for message in messages:
        assert message in text, message


VALID_KEYS = ["zone", "example.com/zone", "kubernetes.io/hostname", "nvidia.com/gpu.product", "a_b.c-d", "A1"]
INVALID_KEYS = ["", "zone name", "-zone", "zone-", "/zone", "Example.com/zone", "a/b/c", "x" * 64]


@pytest.mark.parametrize("key", VALID_KEYS)
def test_valid_label_keys(key: str) -> None:
    assert labels.is_label_key(key)


@pytest.mark.parametrize("key", [*INVALID_KEYS, "a" * 254 + "/b"])
def test_invalid_label_keys(key: str) -> None:
    assert not labels.is_label_key(key)


@pytest.mark.parametrize(("value", "ok"), [("", True), ("a-1", True), ("a b", False), ("a" * 64, False)])
def test_label_values(value: str, ok: bool) -> None:
    assert labels.is_label_value(value) == ok


def test_the_spec_reports_every_problem_as_invalid_spec() -> None:
    spec = api.InferenceServiceSpec.model_validate(
        {
            "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
            "nodeSelector": {"bad key": "ok", "ok": "bad value"},
            "engine": {
                "tolerations": [
                    {"key": "k", "operator": "Exists", "value": "v"},
                    {"operator": "Equal", "value": "v"},
                    {"key": "k", "tolerationSeconds": 5},
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                ]
            },
        }
    )
    problems = spec.semantic_errors()
    assert len(problems) == 5, problems
    assert any(labels.SELECTOR_KEY in p and "'bad key'" in p for p in problems)
    assert any(labels.SELECTOR_VALUE in p and "'bad value'" in p for p in problems)
    assert any("tolerations[0]" in p and "Exists takes no value" in p for p in problems)
    assert any("tolerations[1]" in p and "without a key" in p for p in problems)
    assert any("tolerations[2]" in p and "NoExecute" in p for p in problems)

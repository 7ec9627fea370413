"""The contract tests fail, never skip, when vLLM cannot be imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.contract

HERE = Path(__file__).resolve().parent

HIDE_VLLM_AND_RUN = """
import sys
sys.modules["vllm"] = None  # as if the vllm extra were not installed
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rfE", sys.argv[1]]))
"""


def test_missing_vllm_fails_the_contract_tests() -> None:
    target = f"{HERE / 'test_contract_vllm_args.py'}::test_kv_cache_dtypes_are_vllms"
    proc = subprocess.run(
        [sys.executable, "-c", HIDE_VLLM_AND_RUN, target],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=HERE.parents[1],
    )
    assert proc.returncode != 0
    assert "required for the contract tests" in proc.stdout
    assert "skipped" not in proc.stdout.splitlines()[-1]

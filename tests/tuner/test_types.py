"""``EngineSettings.replace`` is typed through ``SettingsChanges``: the two must name the same fields with the
same types, or the type checker checks ``replace`` calls against a stale list."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from kvpilot.tuner.types import EngineSettings, SettingsChanges


def test_settings_changes_mirror_engine_settings_fields() -> None:
    assert typing.get_type_hints(SettingsChanges) == typing.get_type_hints(EngineSettings)
    assert list(SettingsChanges.__annotations__) == [f.name for f in dataclasses.fields(EngineSettings)]
    assert SettingsChanges.__required_keys__ == frozenset()


def test_replace_applies_only_the_given_fields() -> None:
    base = EngineSettings(max_model_len=4096, max_num_seqs=64, kv_cache_dtype="fp8")
    changed = base.replace(max_num_seqs=32, kv_cache_dtype=None)
    assert changed == EngineSettings(max_model_len=4096, max_num_seqs=32)
    assert base.max_num_seqs == 64  # frozen: the original is untouched


def test_replace_refuses_a_name_that_is_not_a_field() -> None:
    with pytest.raises(TypeError):
        EngineSettings().replace(**{"batch_size": 8})

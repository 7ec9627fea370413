"""Contract: ``--kv-transfer-config`` as vLLM 0.33 reads it.

vLLM's own parser (``EngineArgs.add_cli_args``) builds the ``KVTransferConfig`` kvpilot reads, its connector
factory's registry is the list kvpilot accepts, and the factory's refusal of any other name is the one
kvpilot gives. LMCache is not a dependency of kvpilot (nor of its ``vllm`` extra), so it cannot be imported
here and this contract does not run LMCache's code: the LMCache 0.5.6 facts kvpilot uses (its config
defaults, where they are read, the staging buffer's shape) are recorded with file:line citations in
:mod:`kvpilot.tuner.vllm.kv_connectors`, and ``tests/tuner/test_kv_connectors.py`` pins their reading. (When
they were written, :func:`~kvpilot.tuner.vllm.kv_connectors.read_lmcache_settings` was compared with
``LMCacheEngineConfig.from_env`` and ``validate_and_set_config_value`` of the 0.5.6 wheel, unpacked on
``PYTHONPATH``, over 7 environments x 5 extra configs: the same six settings, except where an environment
variable LMCache cannot convert makes LMCache's value ``None``, which kvpilot names as not read.)
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import pytest

from kvpilot.tuner import errors
from kvpilot.tuner.vllm import kv_connectors

pytestmark = pytest.mark.contract

FLAG = kv_connectors.KV_TRANSFER_CONFIG_FLAG


def _config(**fields: object) -> list[str]:
    return [FLAG, json.dumps(fields)]


READ = [
    _config(kv_connector="LMCacheConnectorV1", kv_role="kv_both"),
    _config(kv_connector="NixlConnector", kv_role="kv_producer", kv_buffer_device="cpu"),
    _config(
        kv_connector="LMCacheConnectorV1",
        kv_role="kv_consumer",
        kv_connector_extra_config={"lmcache.chunk_size": 512, "use_native": True},
    ),
    _config(kv_connector="Mine", kv_role="kv_both", kv_connector_module_path="my.module"),
    [
        *_config(kv_connector="NixlConnector", kv_role="kv_both"),
        *_config(kv_connector="X", kv_role="kv_both"),
    ],
    [f"{FLAG}={json.dumps({'kv_connector': 'OffloadingConnector', 'kv_role': 'kv_both'})}"],
]

REFUSED = [
    [FLAG, "not json"],
    [FLAG, "[1, 2]"],
    _config(kv_connector="LMCacheConnectorV1", kv_role="kv_both", bogus=1),
    _config(kv_connector="LMCacheConnectorV1", kv_role="both"),
    _config(kv_connector="LMCacheConnectorV1"),
    _config(kv_connector=5, kv_role="kv_both"),
]

UNREGISTERED = ["P2pNcclConnector", "PyNcclConnector", "LMCacheConnector", "SharedStorageConnector", "Nope"]


@pytest.mark.parametrize("args", READ)
def test_the_connector_is_the_one_vllms_parser_builds(args: list[str], vllm_parser: Any) -> None:
    config = vllm_parser.parse_args(args).kv_transfer_config
    ours = kv_connectors.read_kv_connector(args)
    assert ours is not None
    assert (ours.name, ours.role) == (config.kv_connector, config.kv_role)
    assert ours.module_path == config.kv_connector_module_path
    assert ours.use_native == config.get_from_extra_config("use_native", False)
    given = json.loads(args[-1].split("=", 1)[1] if args[-1].startswith(FLAG) else args[-1])
    assert ours.kv_buffer_device == given.get("kv_buffer_device")  # None: vLLM's platform default


@pytest.mark.parametrize("args", REFUSED)
def test_what_vllms_parser_refuses_kvpilot_refuses(args: list[str], vllm_parser: Any) -> None:
    with pytest.raises(SystemExit):
        vllm_parser.parse_args(args)
    with pytest.raises(errors.InvalidEngineArgs) as refused:
        kv_connectors.check_kv_transfer_config(args)
    assert refused.value.flag == FLAG


def test_the_connectors_are_the_factorys_registry(vllm: Any) -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    assert tuple(KVConnectorFactory._registry) == kv_connectors.KV_CONNECTORS
    budgeted = {kv_connectors.LMCACHE_CONNECTOR, *kv_connectors.NO_GPU_BUFFER_CONNECTORS}
    assert budgeted <= set(KVConnectorFactory._registry)


@pytest.mark.parametrize("name", UNREGISTERED)
def test_a_name_the_factory_does_not_register_is_refused_as_vllm_refuses_it(
    name: str, vllm_parser: Any
) -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    args = _config(kv_connector=name, kv_role="kv_both")
    config = vllm_parser.parse_args(args).kv_transfer_config  # the parser takes any name
    with pytest.raises(ValueError, match=f"Unsupported connector type: {name}") as vllms:
        KVConnectorFactory.get_connector_class(config)
    with pytest.raises(errors.InvalidEngineArgs) as ours:
        kv_connectors.check_kv_transfer_config(args)
    assert str(vllms.value) in str(ours.value)


def test_the_fields_and_roles_are_kvtransferconfigs(vllm: Any) -> None:
    from vllm.config.kv_transfer import KVRole, KVTransferConfig

    assert set(kv_connectors.KV_TRANSFER_CONFIG_KEYS) == {
        f.name for f in dataclasses.fields(KVTransferConfig)
    }
    assert set(kv_connectors.KV_ROLES) == set(typing.get_args(KVRole))


def test_lmcaches_adapter_is_the_default_of_vllms_connector(vllm: Any) -> None:
    """Without ``use_native`` vLLM loads LMCache's own adapter, whose settings kvpilot reads."""
    import inspect

    from vllm.distributed.kv_transfer.kv_connector.v1 import lmcache_connector

    source = inspect.getsource(lmcache_connector.LMCacheConnectorV1.__init__)
    assert '"use_native", False' in " ".join(source.split())
    assert "lmcache.integration.vllm.vllm_v1_adapter" in source


def test_an_empty_module_path_is_refused_as_the_factory_refuses_it(vllm_parser: Any) -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    args = _config(kv_connector="NixlConnector", kv_role="kv_both", kv_connector_module_path="")
    config = vllm_parser.parse_args(args).kv_transfer_config
    with pytest.raises(ValueError, match="cannot be an empty string"):
        KVConnectorFactory.get_connector_class(config)
    with pytest.raises(errors.InvalidEngineArgs, match="cannot be an empty string"):
        kv_connectors.check_kv_transfer_config(args)


def test_the_connectors_without_hma_are_the_classes_that_are_not_supportshma(vllm: Any) -> None:
    """vLLM turns the hybrid KV cache manager off for a connector class that is not ``SupportsHMA``. Classes
    whose module needs a package the CPU build lacks (LMCache's MP adapter, MoRIIO's msgpack) are not
    loaded; every class kvpilot names as without HMA is."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma

    loaded = {}
    for name in KVConnectorFactory._registry:
        try:
            loaded[name] = KVConnectorFactory.get_connector_class_by_name(name)
        except ImportError:
            continue
    assert set(kv_connectors.NO_HMA_CONNECTORS) <= set(loaded)
    assert {name for name, cls in loaded.items() if not supports_hma(cls)} == set(
        kv_connectors.NO_HMA_CONNECTORS
    )

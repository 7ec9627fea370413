"""vLLM 0.33's KV connectors (``--kv-transfer-config``): which one runs, and what it takes at start-up.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there; the arithmetic is
:mod:`kvpilot.tuner.memory.kv_connector`'s). Paths are vLLM 0.33's (``vllm/``) and LMCache 0.5.6's
(``lmcache/``, the ``lmcache`` wheel on PyPI).

**Parsing.** ``--kv-transfer-config`` is one JSON object that vLLM's parser turns into a ``KVTransferConfig``
(``vllm/config/kv_transfer.py:56``), a pydantic dataclass: an unknown key, a ``kv_role`` other than
``kv_producer`` / ``kv_consumer`` / ``kv_both`` (``:11``-``:13``) and a ``kv_connector`` without a
``kv_role`` (``:120``) are refused as the argument is parsed. The connector name must be one of the factory's
(``vllm/distributed/kv_transfer/kv_connector/factory.py:153``-``:249``, :data:`KV_CONNECTORS`) unless
``kv_connector_module_path`` names an external module (``factory.py:106``); ``VllmConfig.__post_init__``
asks the factory for the class (``vllm/config/vllm.py:2264``, the HMA check), which refuses any other name
with ``Unsupported connector type: <name>`` (``factory.py:128``). ``P2pNcclConnector`` (and the other V0
connectors) are not registered in 0.33. The dotted form (``--kv-transfer-config.kv_connector X``) is
vLLM's too; kvpilot reads the JSON form only and warns by name for the other.

**When.** The worker's connector is built in ``Worker.initialize_from_config``
(``vllm/v1/worker/gpu_worker.py:887``, ``ensure_kv_transfer_initialized``), after
``determine_available_memory`` (``:641``) has sized the KV cache and just before the KV cache is allocated
(``:907``). What a connector allocates on the GPU at start-up is therefore **outside vLLM's memory
profiling**: it does not shrink the KV cache vLLM sizes, it takes from the memory
``--gpu-memory-utilization`` leaves free, and the engine fails with CUDA out of memory if that is too small.

**What each connector allocates** (the worker side; the scheduler side holds no GPU memory):

* ``LMCacheConnectorV1``: without ``"use_native": true`` in ``kv_connector_extra_config`` vLLM loads
  LMCache's own adapter (``lmcache_connector.py:88``-``:106``,
  ``lmcache.integration.vllm.vllm_v1_adapter``). Its config is LMCache's: the file ``LMCACHE_CONFIG_FILE``
  names, else ``LMCACHE_<KEY>`` environment variables (``lmcache/integration/vllm/utils.py:182``-``:201``,
  ``lmcache/v1/config_base.py:260``), then ``"lmcache.<key>"`` entries of ``kv_connector_extra_config``
  override it (``vllm_v1_adapter.py:494``-``:509``). The worker builds a GPU connector
  (``lmcache/integration/vllm/vllm_service_factory.py:203``): by default ``VLLMPagedMemGPUConnectorV2``,
  whose staging buffer is ``torch.empty((2, layers, chunk_size, kv_heads / tp, head_size))`` in the KV
  cache's dtype (one K/V plane under MLA; ``lmcache/v1/gpu_connector/gpu_connectors.py:191``-``:202``,
  ``:427``; the shape from ``vllm_service_factory.py:97``-``:109``): ``chunk_size`` tokens of KV, 256 by
  default (``lmcache/v1/config.py:90``). No buffer with ``enable_pd`` (``gpu_connector/utils.py:60``).
  With ``use_layerwise`` (``config.py:121``) the buffer is one layer of the whole KV cache, allocated at
  the first transfer (``gpu_connectors.py:1162``-``:1195``), not at start-up. Host memory: each worker
  (every TP x PP rank) pins ``max_local_cpu_size`` GiB (5.0 by default, ``config.py:96``) for its CPU
  backend when ``local_cpu`` is on or ``enable_pd`` off (``lmcache/v1/storage_backend/__init__.py:173``-
  ``:190``, pinned by ``alloc_pinned_ptr``, ``lmcache/v1/memory_management.py:544``), once the KV caches
  are registered (``vllm_v1_adapter.py:753``): out of the pod's memory, like vLLM's own offloading tier.
* ``NixlConnector`` / ``NixlPullConnector`` / ``NixlPushConnector``: register vLLM's own KV cache with NIXL
  (``nixl/base_worker.py:1519``-``:1531``), nothing of their own on the GPU. With
  ``"kv_buffer_device": "cpu"`` they stage through a host copy of the whole KV cache instead
  (``initialize_host_xfer_buffer``, ``:1280``), not modelled here.
* ``OffloadingConnector`` / ``SimpleCPUOffloadConnector``: a tier in host memory (``cpu_bytes_to_use``,
  pinned: ``vllm/v1/kv_offload/cpu/gpu_worker.py:846``); on the GPU only the copy ops' index arrays.
* The others (``LMCacheMPConnector``, ``MooncakeConnector``, ``MooncakeStoreConnector``, ``MoRIIOConnector``,
  ``FlexKVConnectorV1``, ``HF3FSKVConnector``, ``HiSparseConnector``, ``MultiConnector``, the example and
  benchmark connectors) are not established here: the plan names them (:func:`kv_connector_unmodelled`).

``tests/contract/test_contract_kv_connectors.py`` checks the parsing and the registry against vLLM's own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvpilot.tuner import errors
from kvpilot.tuner.vllm.args import find_flag_values, iter_flags

KV_TRANSFER_CONFIG_FLAG = "--kv-transfer-config"

LMCACHE_CONNECTOR = "LMCacheConnectorV1"
NIXL_CONNECTORS = ("NixlConnector", "NixlPullConnector", "NixlPushConnector")
OFFLOADING_CONNECTORS = ("OffloadingConnector", "SimpleCPUOffloadConnector")
KV_CONNECTORS = (
    "ExampleConnector",
    "ExampleHiddenStatesConnector",
    LMCACHE_CONNECTOR,
    "LMCacheMPConnector",
    *NIXL_CONNECTORS,
    "MultiConnector",
    "HiSparseConnector",
    "MoRIIOConnector",
    "OffloadingConnector",
    "DecodeBenchConnector",
    "MooncakeConnector",
    "MooncakeStoreConnector",
    "FlexKVConnectorV1",
    "SimpleCPUOffloadConnector",
    "HF3FSKVConnector",
)
"""The names vLLM 0.33's ``KVConnectorFactory`` registers (``factory.py:153``-``:249``), in its order."""
NO_GPU_BUFFER_CONNECTORS = (*NIXL_CONNECTORS, *OFFLOADING_CONNECTORS)
"""Connectors established to allocate nothing of their own on the GPU at start-up (module docstring)."""
NO_HMA_CONNECTORS = ("ExampleConnector", LMCACHE_CONNECTOR, "FlexKVConnectorV1", "HF3FSKVConnector")
"""Registered connectors whose class is not ``SupportsHMA`` (``kv_connector/v1/base.py:101``): with one,
``VllmConfig.__post_init__`` turns the hybrid KV cache manager off unless it was asked for
(``vllm/config/vllm.py:2258``-``:2276``; asked for, vLLM refuses to start): every attention layer then
gets a full-length page, so sliding-window and chunked-local layers no longer save KV memory, and models
with state layers, which need it, fail at start-up."""

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
"""``KVRole`` (``kv_transfer.py:11``-``:13``)."""
KV_TRANSFER_CONFIG_KEYS = (
    "kv_connector",
    "engine_id",
    "kv_buffer_device",
    "kv_role",
    "kv_port",
    "kv_connector_extra_config",
    "kv_connector_module_path",
    "enable_permute_local_kv",
    "kv_load_failure_policy",
)
"""``KVTransferConfig``'s fields (``kv_transfer.py:60``-``:88``): any other key is refused."""

LMCACHE_ENV_PREFIX = "LMCACHE_"
LMCACHE_CONFIG_FILE_ENV = "LMCACHE_CONFIG_FILE"
LMCACHE_EXTRA_PREFIX = "lmcache."


@dataclass(frozen=True, slots=True)
class LMCacheSettings:
    """What sizes LMCache 0.5.6's memory (``lmcache/v1/config.py``), defaults first."""

    chunk_size: int = 256
    """Tokens per chunk (``config.py:90``): the staging buffer holds one chunk."""
    local_cpu: bool = True
    """``config.py:91``."""
    max_local_cpu_size: float = 5.0
    """GiB of pinned host memory per worker for the CPU backend (``config.py:96``; ``x 1024**3``,
    ``lmcache/v1/storage_backend/local_cpu_backend.py:380``, ``:403``)."""
    use_layerwise: bool = False
    """``config.py:121``: the layerwise GPU connector (its buffer is allocated lazily)."""
    enable_pd: bool = False
    """``config.py:232``: disaggregated prefill; no staging buffer (``gpu_connector/utils.py:60``)."""
    use_gpu_connector_v3: bool = False
    """``config.py:588``: ``VLLMPagedMemGPUConnectorV3`` (one buffer per KV layer group)."""
    config_file: bool = False
    """``LMCACHE_CONFIG_FILE`` is set: its values are not read (they come before the environment and the
    extra config, which are)."""
    unread_env: tuple[str, ...] = ()
    """``LMCACHE_<KEY>`` variables of these settings set without a value kvpilot can read (from a Secret or
    ConfigMap, empty, or one LMCache cannot convert, which it turns into ``None``)."""

    @property
    def cpu_backend(self) -> bool:
        """Whether each worker pins ``max_local_cpu_size`` GiB
        (``storage_backend/__init__.py:173``-``:190``)."""
        return (not self.enable_pd or self.local_cpu) and self.max_local_cpu_size > 0


_LMCACHE_KEYS: Mapping[str, str] = {
    "chunk_size": "int",
    "local_cpu": "bool",
    "max_local_cpu_size": "float",
    "use_layerwise": "bool",
    "enable_pd": "bool",
    "use_gpu_connector_v3": "bool",
}


@dataclass(frozen=True, slots=True)
class KvConnector:
    """The connector ``--kv-transfer-config`` selects, as far as its memory goes."""

    name: str
    role: str
    kv_buffer_device: str | None = None
    """``None``: not given (the platform's device, ``cuda``)."""
    module_path: str | None = None
    """``kv_connector_module_path``: an external connector class, not vLLM's."""
    use_native: bool = False
    """``"use_native": true``: vLLM's own copy of the LMCache adapter (``lmcache_integration``)."""
    lmcache: LMCacheSettings | None = None
    """LMCache's settings (``LMCacheConnectorV1`` only)."""


def _convert(kind: str, value: object) -> int | float | bool | None:
    """LMCache's converters (``config_base.py:128`` ``_to_bool``, ``int``, ``float``); ``None``: LMCache
    logs a warning and keeps what it had."""
    try:
        if kind == "bool":
            return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1")
        if kind == "int":
            return int(value)  # type: ignore[call-overload,no-any-return]
        number = float(value)  # type: ignore[arg-type]
        return number if math.isfinite(number) else None
    except (TypeError, ValueError):
        return None


def _apply(settings: dict[str, Any], key: str, value: object) -> bool:
    """Set ``key`` as LMCache converts ``value``; ``False`` when it cannot (nothing set)."""
    kind = _LMCACHE_KEYS.get(key)
    if kind is None:
        return True
    converted = _convert(kind, value)
    if converted is not None:
        settings[key] = converted
    return converted is not None


def read_lmcache_settings(extra: Mapping[str, object], env: Mapping[str, str]) -> LMCacheSettings:
    """LMCache's settings as its vLLM adapter reads them: the defaults, then ``LMCACHE_<KEY>`` of ``env``
    (the pod's literal environment), then ``"lmcache.<key>"`` of ``kv_connector_extra_config``."""
    settings: dict[str, Any] = {}
    unread = []
    for key in _LMCACHE_KEYS:
        name = LMCACHE_ENV_PREFIX + key.upper()
        text = env.get(name)
        if text is not None and (text == "" or not _apply(settings, key, text.strip().strip("'\""))):
            unread.append(name)  # LMCache's from_env sets None then (config_base.py:28): not a size
    for name, value in extra.items():
        if name.startswith(LMCACHE_EXTRA_PREFIX):
            _apply(settings, name[len(LMCACHE_EXTRA_PREFIX) :], value)
    return LMCacheSettings(**settings, config_file=LMCACHE_CONFIG_FILE_ENV in env, unread_env=tuple(unread))


def _load(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def find_dotted_kv_transfer_flags(args: Sequence[str]) -> tuple[str, ...]:
    """The dotted ``--kv-transfer-config.<field>`` flags of ``args`` (kvpilot does not read them)."""
    prefix = KV_TRANSFER_CONFIG_FLAG + "."
    return tuple(flag for _, flag, _ in iter_flags(args) if flag.startswith(prefix))


def read_kv_connector(args: Sequence[str], env: Mapping[str, str] | None = None) -> KvConnector | None:
    """The connector of the last ``--kv-transfer-config`` in ``args`` (vLLM's parser keeps the last);
    ``None`` without one, with no ``kv_connector`` (vLLM then builds none: ``is_kv_transfer_instance``), or
    when a dotted ``--kv-transfer-config.<field>`` is given (vLLM merges those; kvpilot does not). ``env``:
    the pod's literal environment (LMCache reads its settings there). Never raises:
    :func:`check_kv_transfer_config` reports what vLLM refuses."""
    values = find_flag_values(args, KV_TRANSFER_CONFIG_FLAG)
    config = _load(values[-1]) if values else None
    if config is None or find_dotted_kv_transfer_flags(args):
        return None
    name, role = config.get("kv_connector"), config.get("kv_role")
    if not isinstance(name, str) or role not in KV_ROLES:
        return None
    extra = config.get("kv_connector_extra_config")
    extra = extra if isinstance(extra, dict) else {}
    device, module = config.get("kv_buffer_device"), config.get("kv_connector_module_path")
    use_native = extra.get("use_native", False) is True
    lmcache = None
    if name == LMCACHE_CONNECTOR and not module and not use_native:
        lmcache = read_lmcache_settings(extra, env or {})
    return KvConnector(
        name=name,
        role=str(role),
        kv_buffer_device=device if isinstance(device, str) else None,
        module_path=module if isinstance(module, str) and module else None,
        use_native=use_native,
        lmcache=lmcache,
    )


def check_kv_transfer_config(args: Sequence[str]) -> None:
    """Refuse what vLLM 0.33 refuses of ``--kv-transfer-config``: a value that is not a JSON object, a key
    ``KVTransferConfig`` does not have, an unknown ``kv_role``, a connector without a role, and a connector
    name its factory does not register (without ``kv_connector_module_path``)."""
    flag = KV_TRANSFER_CONFIG_FLAG
    for text in find_flag_values(args, flag):
        config = _load(text)
        if config is None:
            raise errors.InvalidEngineArgs(
                f"vLLM argument {flag} must be a JSON object (got {text!r})", flag=flag
            )
        unknown = sorted(set(config) - set(KV_TRANSFER_CONFIG_KEYS))
        if unknown:
            raise errors.InvalidEngineArgs(
                f"vLLM argument {flag}: KVTransferConfig has no field {', '.join(unknown)} (vLLM refuses "
                f"unexpected keys; fields: {', '.join(KV_TRANSFER_CONFIG_KEYS)})",
                flag=flag,
            )
        role, name = config.get("kv_role"), config.get("kv_connector")
        module = config.get("kv_connector_module_path")
        for key, value in (("kv_connector", name), ("kv_connector_module_path", module)):
            if value is not None and not isinstance(value, str):
                raise errors.InvalidEngineArgs(
                    f"vLLM argument {flag}: {key} must be a string (got {value!r})", flag=flag
                )
        if module == "":
            raise errors.InvalidEngineArgs(
                f"vLLM argument {flag}: kv_connector_module_path cannot be an empty string (factory.py:105)",
                flag=flag,
            )
        if role is not None and role not in KV_ROLES:
            raise errors.InvalidEngineArgs(
                f"vLLM argument {flag}: unsupported kv_role {role!r}; vLLM accepts {', '.join(KV_ROLES)}",
                flag=flag,
            )
        if name is not None and role is None:
            raise errors.InvalidEngineArgs(
                f"vLLM argument {flag}: please specify kv_role when kv_connector is set, supported roles "
                f"are {', '.join(KV_ROLES)}",
                flag=flag,
            )
        if name is not None and module is None and name not in KV_CONNECTORS:
            raise errors.InvalidEngineArgs(
                f"vLLM argument {flag}: Unsupported connector type: {name} (vLLM 0.33's connectors: "
                f"{', '.join(KV_CONNECTORS)}; an external one needs kv_connector_module_path)",
                flag=flag,
            )


def kv_connector_unmodelled(connector: KvConnector) -> str | None:
    """Why kvpilot does not budget ``connector``'s memory (all of it, or the part named), with what to do;
    ``None`` when everything it takes at start-up is budgeted."""
    name = connector.name
    if connector.module_path is not None:
        return (
            f"{name} is loaded from {connector.module_path}, not vLLM's registry: what it allocates is not "
            f"known to kvpilot; leave its GPU buffers free below --gpu-memory-utilization"
        )
    if name in NIXL_CONNECTORS:
        if connector.kv_buffer_device == "cpu":
            return (
                f"{name} with kv_buffer_device cpu stages transfers through a host copy of the whole KV "
                f"cache (nixl/base_worker.py:1280), not held against the pod's memory; size the limit for it"
            )
        return None
    if name in OFFLOADING_CONNECTORS:
        return (
            f"{name}'s host tier (cpu_bytes_to_use of kv_connector_extra_config) is pinned in the pod's "
            f"memory and not held against its limit when given here; prefer --kv-offloading-size"
        )
    if name != LMCACHE_CONNECTOR:
        return (
            f"{name}: what this connector allocates at start-up is not established for vLLM 0.33; it is "
            f"created after vLLM sizes the KV cache, so leave its buffers free below "
            f"--gpu-memory-utilization"
        )
    lm = connector.lmcache
    if connector.use_native or lm is None:
        return (
            f"{name} with use_native runs vLLM's copy of the LMCache adapter, not budgeted; lower "
            f"--gpu-memory-utilization by chunk_size x the KV bytes per token"
        )
    gaps = []
    if lm.config_file:
        gaps.append(
            f"{LMCACHE_CONFIG_FILE_ENV} is set and its values are not read (budgeted: LMCache's defaults, "
            f"LMCACHE_* variables and lmcache.* extra config)"
        )
    if lm.unread_env:
        gaps.append(
            f"{', '.join(lm.unread_env)} not read (no literal value LMCache can convert; budgeted: the other "
            f"sources)"
        )
    if lm.use_layerwise and not lm.enable_pd:
        gaps.append(
            "use_layerwise allocates, at the first transfer, a GPU buffer of one layer of the whole KV "
            "cache (about the KV cache / the layers), not budgeted"
        )
    if lm.use_gpu_connector_v3 and not lm.enable_pd and not lm.use_layerwise:
        gaps.append("use_gpu_connector_v3's per-group staging buffers are not budgeted")
    if not gaps:
        return None
    return f"{name}: " + "; ".join(gaps) + "; lower --gpu-memory-utilization by what it takes"


def kv_connector_turns_hma_off(connector: KvConnector) -> bool:
    """Whether vLLM turns the hybrid KV cache manager off for ``connector`` (:data:`NO_HMA_CONNECTORS`; an
    external class is not known, so not claimed)."""
    return connector.module_path is None and connector.name in NO_HMA_CONNECTORS


def lmcache_staging_chunk(connector: KvConnector | None) -> int:
    """Tokens of KV LMCache's ``VLLMPagedMemGPUConnectorV2`` stages on each GPU at start-up (its
    ``chunk_size``); 0 for any other connector or setting (no buffer, or one not budgeted)."""
    lm = connector.lmcache if connector is not None else None
    if connector is None or lm is None or connector.use_native:
        return 0
    if lm.enable_pd or lm.use_layerwise or lm.use_gpu_connector_v3:
        return 0
    return max(0, lm.chunk_size)


def compute_lmcache_host_bytes(connector: KvConnector | None, ranks: int) -> int | None:
    """Pinned host bytes LMCache's CPU backend takes for ``ranks`` workers (``max_local_cpu_size`` GiB
    each); ``None`` when it is not LMCache's, it pins none, or its size is not known (a config file, or a
    variable that sizes it without a literal value: the plan names those, :func:`kv_connector_unmodelled`)."""
    lm = connector.lmcache if connector is not None else None
    if lm is None or not lm.cpu_backend or lm.config_file:
        return None
    sizing = ("local_cpu", "max_local_cpu_size", "enable_pd")
    if {LMCACHE_ENV_PREFIX + key.upper() for key in sizing} & set(lm.unread_env):
        return None
    return ranks * int(lm.max_local_cpu_size * (1 << 30))

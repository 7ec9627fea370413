"""The closed loop's node list is cached for a short while (kvpilot.operator.clients.kube.NodeList)."""

from __future__ import annotations

import asyncio
from typing import Any

from kvpilot.operator.clients.kube import NodeList
from kvpilot.operator.loop import loop_deps
from kvpilot.operator.planning import resolve


class CountingKube:
    def __init__(self) -> None:
        self.lists = 0
        self.nodes: list[dict[str, Any]] = [{"metadata": {"name": "n1"}}]

    def list_nodes(self) -> list[dict[str, Any]]:
        self.lists += 1
        return list(self.nodes)


async def test_one_listing_per_ttl_and_one_for_concurrent_misses() -> None:
    kube, cache = CountingKube(), NodeList(ttl_s=30)
    got = await asyncio.gather(*(cache.fetch(kube, 100.0) for _ in range(20)))  # type: ignore[arg-type]
    assert kube.lists == 1 and all(g == kube.nodes for g in got)
    kube.nodes = [{"metadata": {"name": "n2"}}]
    assert await cache.fetch(kube, 129.9) == [{"metadata": {"name": "n1"}}]  # type: ignore[arg-type]
    assert await cache.fetch(kube, 130.0) == [{"metadata": {"name": "n2"}}]  # type: ignore[arg-type]
    assert kube.lists == 2
    assert await cache.fetch(kube, 10.0) == kube.nodes and kube.lists == 3  # type: ignore[arg-type]  # clock went back


def test_the_loop_shares_one_cache_with_the_resolvers_ttl() -> None:
    deps = loop_deps.LoopDeps(kube=None, pods=None, prom_url="")
    assert isinstance(deps.nodes, NodeList) and deps.nodes.ttl_s == resolve.NODE_CACHE_TTL_S
    assert loop_deps.LoopDeps(kube=None, pods=None, prom_url="").nodes is not deps.nodes  # per operator

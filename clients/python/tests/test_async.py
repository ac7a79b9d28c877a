"""The asyncio client against a real ``ce serve``: the same operations, awaited."""

from __future__ import annotations

import asyncio
import uuid
from typing import List

import pytest

from contextengine import (
    AsyncClient,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    UnauthorizedError,
    VersionConflictError,
)
from contextengine.types import KbProgress

WORDS = "marzipan heliotrope abacus"


def test_async_put_search_mv_rm(url: str, key_a: str, root: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(url, api_key=key_a) as ce:
            # Concurrent writes on one client.
            outcomes = await asyncio.gather(
                *(ce.put(f"{root}/n{i}", content=f"{WORDS} number {i}") for i in range(5))
            )
            assert [o["version"] for o in outcomes] == [1] * 5
            await ce.wait_until_indexed()
            for mode in ("vector", "keyword", "hybrid"):
                hits = (await ce.search(WORDS, mode=mode, subtree=root, top_k=10))["hits"]
                assert sorted(h["uri"] for h in hits) == [f"{root}/n{i}" for i in range(5)], mode
            deep = await ce.hierarchical_search(f"{WORDS} number 3", subtree=root, top_k=1)
            assert [h["uri"] for h in deep["hits"]] == [f"{root}/n3"]

            assert (await ce.cat(f"{root}/n2"))["text"] == f"{WORDS} number 2"
            assert len(await ce.ls(root)) == 5
            await ce.mv(f"{root}/n0", f"{root}/moved/n0")
            # 1 the put (a short leaf: its layers are derived in the write), 2 the move
            assert (await ce.stat(f"{root}/moved/n0"))["version"] == 2
            await ce.link(f"{root}/n1", f"{root}/n2", "next")
            assert (await ce.relations(f"{root}/n1"))["outgoing"][0]["to_uri"] == f"{root}/n2"
            await ce.wait_until_indexed(consumers=["relation"])
            edges = (await ce.related(f"{root}/n1"))["edges"]
            assert [e["other"] for e in edges] == [f"{root}/n2"]

            with pytest.raises(VersionConflictError):
                await ce.put(f"{root}/n1", content="stale", expect_version=7)
            with pytest.raises(ConflictError):
                await ce.rm(root)
            await ce.rm(root, recursive=True)
            with pytest.raises(NotFoundError):
                await ce.stat(root)
            await ce.wait_until_indexed()
            assert (await ce.search(WORDS, mode="keyword", subtree=root))["hits"] == []

    asyncio.run(scenario())


def test_async_errors_and_admin(url: str, key_b: str, key_admin: str, root: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(url, api_key=key_b) as other:
            with pytest.raises(ForbiddenError):
                await other.put(f"{root}/x", content="not b's")
            with pytest.raises(ForbiddenError):
                await other.jobs()
        async with AsyncClient(url) as anonymous:
            with pytest.raises(UnauthorizedError):
                await anonymous.ls()
            assert (await anonymous.readyz())["ready"] is True
        async with AsyncClient(url, api_key=key_admin) as admin:
            await admin.wait_until_indexed()
            status = await admin.status()
            assert all(c["lag_events"] == 0 for c in status["consumers"])
            assert await admin.outbox_stats()
            name = f"kb-{uuid.uuid4().hex[:12]}"
            await admin.kb_create(name, account="pykb")
            added = await admin.kb_add(name, notes=["The boiler is serviced every October."])
            seen: List[KbProgress] = []
            done = await admin.kb_follow(name, added, interval=0.05, timeout=60,
                                         on_progress=seen.append)
            assert (done["finished"], done["done"], done["failed"]) == (True, 1, 0), done
            assert seen[-1] == done
            await admin.kb_follow(name, await admin.kb_remove(name), interval=0.05, timeout=60)
            assert name not in [b["name"] for b in await admin.kb_list()]

    asyncio.run(scenario())

"""The blocking client against a real ``ce serve`` (see conftest.py)."""

from __future__ import annotations

import json
from typing import List, Mapping, Sequence

import httpx
import pytest

from contextengine import (
    AsyncClient,
    Client,
    ConflictError,
    ContextEngineError,
    ForbiddenError,
    IndexingTimeout,
    InvalidInputError,
    KbFollowTimeout,
    NetworkError,
    NotFoundError,
    ServerError,
    UnauthorizedError,
    UnavailableError,
    VersionConflictError,
)
from contextengine.types import KbProgress

WORDS = "zephyrine quokka lantern"


def uris(hits: Sequence[Mapping[str, object]]) -> List[str]:
    return [str(h["uri"]) for h in hits]


def test_put_is_found_by_every_search_mode_once_indexed(ce: Client, root: str) -> None:
    guide = f"{root}/docs/guide"
    other = f"{root}/docs/other"
    ce.put(guide, abstract=f"The {WORDS} guide.", content=f"All about the {WORDS}.",
           meta={"lang": "en", "rank": 3})
    ce.put(other, content="Unrelated text on tax forms.", meta={"lang": "de"})
    ce.wait_until_indexed()

    for mode in ("vector", "keyword", "hybrid"):
        answer = ce.search(WORDS, mode=mode, subtree=root)
        assert answer["mode_used"] == mode
        assert uris(answer["hits"])[0] == guide, (mode, answer)
        assert [x["events"] for x in answer["lag"]] == [0] * len(answer["lag"])
    hybrid = ce.search(WORDS, mode="hybrid", subtree=root)
    assert "fusion" in hybrid
    assert hybrid["hits"][0]["ranks"] == {"vector": 1, "keyword": 1}

    deep = ce.hierarchical_search(WORDS, subtree=root, alpha=0.5, seeds=5)
    assert uris(deep["hits"])[0] == guide
    assert deep["hits"][0]["path"][0]["uri"] == f"{root}/docs"

    # Filters: level, meta, top_k.
    l0 = ce.search(WORDS, mode="keyword", subtree=root, level=0)
    # Not the folder: its derived abstract restates the guide's, and flat search skips
    # roll-ups (hierarchical search seeds on them).
    assert [(h["uri"], h["level"]) for h in l0["hits"]] == [(guide, 0)]
    de = ce.search("tax forms", mode="keyword", subtree=root, filters={"meta": {"lang": "de"}})
    assert uris(de["hits"]) == [other]
    none = ce.search(WORDS, mode="keyword", subtree=root, filters={"meta": {"lang": "de"}})
    assert none["hits"] == []
    assert len(ce.search("the", mode="vector", subtree=root, top_k=1)["hits"]) == 1


def test_put_fields_modes_and_expect_version(ce: Client, root: str) -> None:
    uri = f"{root}/users/u1/memories/preferences/theme"
    first = ce.put(uri, abstract="Prefers dark mode.", overview="Chose dark mode twice.",
                   content="Set the theme to dark.", context_type="memory",
                   category="preferences", owner_space="user:u1",
                   meta={"source": "chat", "confidence": 0.9}, expect_version=0,
                   trace_id="py-trace-1")
    assert first["version"] == 1 and first["changed"] and first["trace_id"] == "py-trace-1"
    assert first["event_ids"]
    assert [ce.cat(uri, level)["text"] for level in (0, 1, 2)] == [
        "Prefers dark mode.", "Chose dark mode twice.", "Set the theme to dark."]
    assert ce.cat(uri)["level"] == 2
    st = ce.stat(uri)
    assert (st["context_type"], st["category"], st["owner_space"], st["kind"]) == (
        "memory", "preferences", "user:u1", "leaf")
    assert st["meta"] == {"source": "chat", "confidence": 0.9}
    ce.wait_until_indexed()
    for spaces, found in (("user:u1", [uri]), (["user:u2", "shared"], [])):
        mine = ce.search("dark theme", mode="keyword", subtree=root,
                         filters={"owner_space": spaces, "context_type": "memory"})
        assert uris(mine["hits"]) == found, spaces

    merged = ce.put(uri, mode="merge", meta={"confidence": None, "lang": "en"}, expect_version=1)
    assert merged["version"] == 2
    assert ce.stat(uri)["meta"] == {"source": "chat", "lang": "en"}
    assert ce.cat(uri, 2)["text"] == "Set the theme to dark."

    ce.put(uri, mode="append", content=" And the editor too.")
    assert ce.cat(uri, 2)["text"].endswith("And the editor too.")

    replaced = ce.put(uri, content="Only content now.")
    assert replaced["layers_removed"] == [0, 1]
    assert ce.cat(uri, 0)["text"] == ""

    with pytest.raises(VersionConflictError) as conflict:
        ce.put(uri, content="late edit", expect_version=1)
    e = conflict.value
    assert isinstance(e, ConflictError)
    assert (e.code, e.status, e.retryable) == ("version_conflict", 409, False)
    assert "expected version 1" in e.message
    with pytest.raises(InvalidInputError) as bad_mode:
        ce.put(uri, content="x", mode="upsert")
    assert bad_mode.value.code == "invalid_field"


def test_ls_tree_mv_and_recursive_rm(ce: Client, root: str) -> None:
    ce.put(f"{root}/a/one", content=f"{WORDS} one")
    ce.put(f"{root}/a/two", content="second leaf")
    assert [n["uri"] for n in ce.ls(f"{root}/a")] == [f"{root}/a/one", f"{root}/a/two"]
    tree = ce.tree(root)
    assert [n["uri"] for n in tree] == [root, f"{root}/a", f"{root}/a/one", f"{root}/a/two"]
    assert [n["uri"] for n in ce.tree(root, depth=1)] == [root, f"{root}/a"]
    account = root.split("/")[2]
    assert f"ctx://{account}" in [n["uri"] for n in ce.ls()]

    moved = ce.mv(f"{root}/a/one", f"{root}/b/one")
    assert moved["uri"] == f"{root}/b/one"
    with pytest.raises(NotFoundError):
        ce.stat(f"{root}/a/one")
    ce.wait_until_indexed()
    hits = ce.search(WORDS, mode="vector", subtree=root, min_score=0.3)["hits"]
    assert uris(hits) == [f"{root}/b/one"]

    with pytest.raises(VersionConflictError):
        ce.rm(f"{root}/a/two", expect_version=5)
    with pytest.raises(ConflictError) as not_empty:
        ce.rm(f"{root}/a")
    assert not_empty.value.code == "not_empty"
    removed = ce.rm(root, recursive=True)
    assert removed["nodes_affected"] >= 5
    with pytest.raises(NotFoundError):
        ce.tree(root)
    ce.wait_until_indexed()
    assert ce.search(WORDS, mode="keyword", subtree=root)["hits"] == []


def test_link_relations_related_unlink(ce: Client, root: str) -> None:
    a, b = f"{root}/a", f"{root}/b"
    ce.put(a, abstract="Source node.")
    ce.put(b, abstract="Target node.")
    ce.link(a, b, "see_also", weight=0.5, reason="same topic")
    rel = ce.relations(a)
    assert rel["outgoing"] == [{"from_uri": a, "to_uri": b, "relation_type": "see_also",
                                "weight": 0.5, "reason": "same topic"}]
    assert ce.relations(b)["incoming"][0]["from_uri"] == a
    ce.wait_until_indexed(consumers=["relation"])
    out = ce.related(a)
    assert [(e["other"], e["abstract"], e["direction"]) for e in out["edges"]] == [
        (b, "Target node.", "out")]
    inbound = ce.related(b, direction="in", relation_type="see_also", limit=5)
    assert [e["other"] for e in inbound["edges"]] == [a]
    assert ce.related(a, relation_type="other")["edges"] == []
    ce.unlink(a, b, "see_also")
    assert ce.relations(a)["outgoing"] == []


def test_error_families(ce: Client, ce_b: Client, url: str, root: str, account_b: str) -> None:
    ce.put(f"{root}/mine", content="account a only")
    with pytest.raises(NotFoundError) as nf:
        ce.cat(f"{root}/missing")
    assert (nf.value.code, nf.value.status, nf.value.retryable) == ("not_found", 404, False)
    with pytest.raises(InvalidInputError) as bad_uri:
        ce.stat(f"{root}//double")
    assert (bad_uri.value.code, bad_uri.value.status) == ("invalid_uri", 400)
    with pytest.raises(InvalidInputError) as bad_level:
        ce.cat(f"{root}/mine", 7)
    assert bad_level.value.code == "invalid_level"
    with pytest.raises(InvalidInputError) as empty:
        ce.search("", mode="keyword")
    assert empty.value.status == 400

    # Another account: reads are not found, writes forbidden, admin routes forbidden.
    with pytest.raises(NotFoundError):
        ce_b.cat(f"{root}/mine")
    with pytest.raises(ForbiddenError) as other_account:
        ce_b.put(f"{root}/intruder", content="x")
    assert (other_account.value.code, other_account.value.status) == ("forbidden", 403)
    with pytest.raises(ForbiddenError):
        ce.search("x", subtree=f"ctx://{account_b}")
    with pytest.raises(ForbiddenError):
        ce.status()

    with Client(url) as anonymous, pytest.raises(UnauthorizedError) as no_key:
        anonymous.stat(f"{root}/mine")
    assert (no_key.value.code, no_key.value.status) == ("unauthenticated", 401)
    with Client(url, api_key="not-a-key-of-this-server") as wrong:
        with pytest.raises(UnauthorizedError):
            wrong.ls()
        assert wrong.healthz() == {"status": "ok"}

    with Client("http://127.0.0.1:9", timeout=5) as down, pytest.raises(NetworkError) as net:
        down.healthz()
    assert isinstance(net.value, UnavailableError)
    assert (net.value.code, net.value.retryable, net.value.status) == ("network", True, None)


def test_admin_routes(admin: Client, ce: Client, url: str, root: str) -> None:
    ce.put(f"{root}/x", content="admin sees this")
    admin.wait_until_indexed()
    status = admin.status()
    assert status["ready"] is True
    assert {c["consumer"]: c["lag_events"] for c in status["consumers"]} == {
        "vector": 0, "keyword": 0, "relation": 0, "derive": 0}
    assert {s["consumer"] for s in admin.outbox_stats()} == {
        "vector", "keyword", "relation", "derive"}
    assert admin.stat(f"{root}/x")["uri"] == f"{root}/x"

    done = admin.reindex("keyword")
    assert done["consumer"] == "keyword" and done["requeued"] >= 1
    job = admin.job(done["job_id"])
    assert (job["job_type"], job["state"]) == ("reindex", "completed")
    assert done["job_id"] in [j["id"] for j in admin.jobs(job_type="reindex", limit=50)]
    assert all(j["state"] == "completed" for j in admin.jobs(state="completed"))
    with pytest.raises(ConflictError) as finished:
        admin.cancel_job(done["job_id"])
    assert finished.value.code == "state_transition"
    with pytest.raises(ConflictError):
        admin.retry_job(done["job_id"])
    with pytest.raises(NotFoundError):
        admin.job("job-does-not-exist")
    queued = admin.start_reindex("keyword")
    assert queued["job"]["job_type"] == "reindex" and queued["job_id"] == queued["job"]["id"]
    admin.wait_until_indexed()
    assert ce.search("admin sees this", mode="keyword", subtree=root)["hits"]

    with Client(url) as anonymous:
        assert anonymous.healthz() == {"status": "ok"}
        assert anonymous.readyz() == {"ready": True}


def test_environment_configures_the_client(
    monkeypatch: pytest.MonkeyPatch, url: str, key_a: str, root: str
) -> None:
    monkeypatch.setenv("CE_SERVER", url)
    monkeypatch.setenv("CE_API_KEY", key_a)
    with Client() as c:
        assert c.base_url == url
        assert c.put(f"{root}/env", content="via the environment")["version"] == 1
    monkeypatch.setenv("CE_API_KEY", "has a space")
    with pytest.raises(ValueError):
        Client()


def test_answers_that_are_not_the_servers_errors() -> None:
    """A proxy's page or an odd status still maps to the status's family."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return httpx.Response(502, text="<html>bad gateway</html>")
        if request.url.path == "/readyz":
            return httpx.Response(503, json={"code": "unavailable", "message": "model loading",
                                             "retryable": True, "reasons": ["model"]},
                                  headers={"Retry-After": "5"})
        if request.url.path == "/v1/status":
            return httpx.Response(409, json={"code": "busy", "message": "lock held",
                                             "retryable": True}, headers={"Retry-After": "1"})
        return httpx.Response(500, text="oops")

    with Client("http://ce.invalid", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(UnavailableError) as gateway:
            c.healthz()
        assert (gateway.value.status, gateway.value.retryable) == (502, True)
        assert "bad gateway" in gateway.value.message
        assert c.readyz()["reasons"] == ["model"]
        with pytest.raises(ConflictError) as busy:
            c.status()
        busy_error = (busy.value.code, busy.value.retryable, busy.value.retry_after)
        assert busy_error == ("busy", True, 1.0)
        with pytest.raises(ServerError) as internal:
            c.stat("ctx://a/b")
        assert isinstance(internal.value, ContextEngineError)
        assert (internal.value.code, internal.value.retryable) == ("internal", False)


def test_wait_until_indexed_retries_then_times_out_naming_the_lag() -> None:
    """Retryable answers and pending changes are waited out; the timeout names the lag."""
    answers = iter([
        httpx.Response(503, json={"code": "unavailable", "message": "model loading",
                                  "retryable": True}),
        httpx.Response(200, json={"consumers": [{"consumer": "vector", "lag_events": 2},
                                                {"consumer": "keyword", "lag_events": 0}]}),
    ])

    def handler(request: httpx.Request) -> httpx.Response:
        return next(answers, httpx.Response(200, json={"consumers": [
            {"consumer": "vector", "lag_events": 0}, {"consumer": "keyword", "lag_events": 3}]}))

    with Client("http://ce.invalid", transport=httpx.MockTransport(handler)) as c:
        c.wait_until_indexed(consumers=["vector"], interval=0.01, timeout=5)
        with pytest.raises(IndexingTimeout) as late:
            c.wait_until_indexed(interval=0.01, timeout=0.05)
    assert isinstance(late.value, TimeoutError) and late.value.retryable
    assert "keyword: 3 changes pending" in late.value.message

    # A queued reindex is waited for even when no consumer has lag yet.
    queued = {"consumers": [{"consumer": "vector", "lag_events": 0}],
              "jobs": {"counts": [{"job_type": "reindex", "state": "pending", "count": 1}]}}
    mock = httpx.MockTransport(lambda _: httpx.Response(200, json=queued))
    with Client("http://ce.invalid", transport=mock) as c:
        with pytest.raises(IndexingTimeout) as reindexing:
            c.wait_until_indexed(consumers=["vector"], interval=0.01, timeout=0.05)
    assert "reindex: 1 jobs not run yet" in reindexing.value.message


def test_both_clients_have_the_same_operations_with_the_same_signatures() -> None:
    import inspect

    def operations(cls: type) -> dict[str, inspect.Signature]:
        return {name: inspect.signature(f) for name, f in vars(cls).items()
                if callable(f) and not name.startswith("_") and name not in ("close", "aclose")}

    sync, asynchronous = operations(Client), operations(AsyncClient)
    assert sync == asynchronous
    assert {"put", "search", "hierarchical_search", "wait_until_indexed", "reindex"} <= set(sync)
    assert all(inspect.iscoroutinefunction(getattr(AsyncClient, n)) for n in asynchronous)


def test_knowledge_bases(admin: Client) -> None:
    import uuid

    name = f"kb-{uuid.uuid4().hex[:12]}"
    base = admin.kb_create(name, account="pykb", settings={"max_tokens": 128, "overlap_tokens": 16, "min_tokens": 32})
    assert base["root"] == f"ctx://pykb/resources/{name}"
    assert name in [b["name"] for b in admin.kb_list()]
    added = admin.kb_add(name, notes=["The launch checklist lives in the operations runbook.",
                                      "Rotate the signing keys every quarter."])
    roots = [i["id"] for i in added["items"]]
    seen: List[KbProgress] = []
    p = admin.kb_follow(name, added, interval=0.05, timeout=60, on_progress=seen.append)
    assert (p["finished"], p["done"], p["total"], p["failed"], p["jobs_open"]) == (True, 2, 2, 0, 0), p
    # Each change reported once, in order, ending with the answer.
    assert seen and seen[-1] == p, seen
    assert all(a != b for a, b in zip(seen, seen[1:])), seen
    assert all(x["total"] == 2 and x["done"] <= 2 and sum(x["by_status"].values()) == 2
               for x in seen), seen
    status = admin.kb_status(name)
    assert status["counts"]["completed"] == 2 and {i["kind"] for i in status["items"]} == {"note"}
    # A re-add of the same note is a re-sync: followed like an add, it ends at once unchanged.
    again = admin.kb_add(name, notes=["Rotate the signing keys every quarter."])
    assert [i["id"] for i in again["items"]] == roots[1:]
    assert admin.kb_follow(name, again, interval=0.05, timeout=60)["done"] == 1
    report = admin.status()["kb"]
    mine = [b for b in report["bases"] if b["name"] == name]
    assert mine and mine[0]["counts"]["completed"] == 2 and mine[0]["recent_failures"] == [], report
    assert "kb-index-documents" in report["active_jobs"], report
    with pytest.raises(InvalidInputError) as refused:
        admin.kb_add(name, paths=["/etc/passwd"])
    assert refused.value.code == "invalid_field"
    gone = admin.kb_delete_items(name, roots)
    assert gone["roots"] == roots
    assert admin.kb_status(name)["items"] == []
    cleaned = admin.kb_follow(name, gone, interval=0.05, timeout=60)
    assert (cleaned["finished"], cleaned["total"], cleaned["jobs_open"]) == (True, 0, 0), cleaned
    admin.kb_remove(name)


def test_kb_follow_waits_out_retryable_errors_then_times_out_with_the_last_progress() -> None:
    """``kb_follow`` polls the progress of the roots and jobs it was given; a retryable
    answer is no change, and the timeout carries the last progress."""
    running = {"done": 1, "total": 3, "failed": 0, "by_status": {"completed": 1, "reading": 2},
               "jobs_open": 2, "finished": False}
    answers = iter([
        httpx.Response(503, json={"code": "unavailable", "message": "restarting",
                                  "retryable": True}),
        httpx.Response(200, json=running),
    ])
    bodies: List[object] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append((request.url.path, json.loads(request.content)))
        return next(answers, httpx.Response(200, json=running))

    started = {"roots": ["r1"], "jobs": ["j1", "j2"]}
    seen: List[KbProgress] = []
    with Client("http://ce.invalid", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(KbFollowTimeout) as late:
            c.kb_follow("docs", started, interval=0.01, timeout=0.1,  # type: ignore[arg-type]
                        on_progress=seen.append)
    assert bodies[0] == ("/v1/kb/docs/progress", {"roots": ["r1"], "jobs": ["j1", "j2"]})
    assert seen == [running], seen
    assert isinstance(late.value, TimeoutError) and late.value.retryable
    assert late.value.progress == running
    assert "1/3 items done, 0 failed (1 completed, 2 reading), 2 jobs open" in late.value.message

    def refused(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"code": "not_found", "message": "no base",
                                         "retryable": False})

    with Client("http://ce.invalid", transport=httpx.MockTransport(refused)) as c:
        with pytest.raises(NotFoundError):
            c.kb_follow("gone", started, interval=0.01)  # type: ignore[arg-type]

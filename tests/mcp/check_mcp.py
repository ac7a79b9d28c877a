"""ContextEngine's MCP server through the official Python SDK (`mcp`, tests/requirements.txt).

    python3 tests/mcp/check_mcp.py stdio ROOT DOC COMMAND [ARGS...]   # e.g. local F ce --data-dir D mcp
    python3 tests/mcp/check_mcp.py http URL KEY_A KEY_B KEY_ADMIN DOC

Lists the tools, calls each one, checks results and errors, and (http) tenant isolation
between two API keys. A write is searched for once `status` says the indexes caught up.
The knowledge-base tools (admin only): a note and the file DOC (under the server's
`[ingest].allowed_paths`) added to a base, followed until completed, found by search, one
removed and gone from search at once; bad inputs get typed errors. DOC `-` (stdio): the
caller is a tenant, and the kb tools must answer `forbidden`.
Exits non-zero on the first failed check. Driven by crates/ce-cli/tests/cli/mcp.rs.
"""

import asyncio
import json
import sys
import time
from contextlib import asynccontextmanager

import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

TOOLS = {"search", "read", "list", "tree", "write", "edit", "move", "forget", "link", "related", "session_add", "session_commit", "status",
         "kb_list", "kb_create", "kb_add", "kb_status", "kb_remove_items", "kb_reindex"}


def check(cond, what):
    if not cond:
        raise AssertionError(what)


@asynccontextmanager
async def session_stdio(command):
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with stdio_client(params) as streams:
        async with ClientSession(streams[0], streams[1]) as s:
            await s.initialize()
            yield s


@asynccontextmanager
async def session_http(url, key):
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    async with client:
        async with streamable_http_client(f"{url}/mcp", http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                yield s


async def call(s, name, args):
    """(is_error, structured content) of a tool call; the text block is the same JSON."""
    r = await s.call_tool(name, args)
    structured = r.structured_content
    check(json.loads(r.content[0].text) == structured, f"{name}: text block != structuredContent")
    return bool(r.is_error), structured


async def ok(s, name, args):
    err, v = await call(s, name, args)
    check(not err, f"{name} {args} failed: {v}")
    return v


async def fails(s, name, args, code):
    err, v = await call(s, name, args)
    check(err, f"{name} {args} succeeded: {v}")
    check(v["code"] == code, f"{name} {args}: expected {code}, got {v}")
    check(isinstance(v["retryable"], bool) and v["message"], f"{name}: error shape {v}")
    return v["message"]


async def wait_indexed(s):
    deadline = time.monotonic() + 30
    while True:
        st = await ok(s, "status", {})
        if st["searchable"]:
            return
        check(time.monotonic() < deadline, f"indexes never caught up: {st}")
        await asyncio.sleep(0.1)


async def exercise(s, root):
    """Every tool, below `root` (e.g. ctx://a)."""
    tools = (await s.list_tools()).tools
    check({t.name for t in tools} == TOOLS, f"tools: {[t.name for t in tools]}")
    for t in tools:
        check(t.annotations is not None and t.annotations.read_only_hint is not None, f"{t.name}: annotations")
        check("anyOf" not in json.dumps(t.input_schema) and "$ref" not in json.dumps(t.input_schema), t.name)
    note = f"{root}/memories/python-sdk"
    w = await ok(s, "write", {"uri": note, "abstract": "quokka habitat survey",
                              "content": "Quokkas live on Rottnest Island. Count: 12000."})
    check("indexing" in w and isinstance(w["indexing"]["searchable"], bool), f"write: {w}")
    await wait_indexed(s)
    found = await ok(s, "search", {"query": "quokka habitat", "mode": "keyword", "subtree": root})
    check(found["hits"] and found["hits"][0]["uri"] == note, f"search after status: {found}")
    packed = await ok(s, "search", {"query": "quokka habitat", "mode": "keyword", "subtree": root,
                                    "detail": "content", "max_tokens": 15})
    check(packed["tokens"] <= 15, f"max_tokens: {packed}")
    r = await ok(s, "read", {"uris": [note], "level": 2})
    check(r["nodes"][0]["text"].startswith("Quokkas"), f"read: {r}")
    e = await ok(s, "edit", {"uri": note, "old": "12000", "new": "12500"})
    check(e["version"] == 2, f"edit: {e}")
    msg = await fails(s, "edit", {"uri": note, "old": "wombat", "new": "x"}, "invalid_field")
    check("does not occur" in msg, msg)
    await fails(s, "write", {"uri": note, "content": "x", "expect_version": 1}, "version_conflict")
    msg = await fails(s, "search", {"top_k": 3}, "invalid_field")
    check("`query`" in msg, msg)
    lst = await ok(s, "list", {"uri": f"{root}/memories"})
    check(any(c["uri"] == note for c in lst["children"]), f"list: {lst}")
    tr = await ok(s, "tree", {"uri": root, "depth": 3})
    check(any(n["uri"] == note for n in tr["nodes"]), f"tree: {tr}")
    other = f"{root}/memories/other"
    await ok(s, "write", {"uri": other, "content": "another note"})
    await ok(s, "link", {"from": note, "to": other, "type": "references"})
    await wait_indexed(s)
    rel = await ok(s, "related", {"uri": note})
    check(rel["edges"] and rel["edges"][0]["other"] == other, f"related: {rel}")
    moved = f"{root}/memories/moved"
    await ok(s, "move", {"from": other, "to": moved})
    r = await ok(s, "read", {"uris": [other, moved]})
    check(r["nodes"][0]["error"]["code"] == "not_found" and r["nodes"][1]["uri"] == moved, f"move: {r}")
    await fails(s, "forget", {"uri": f"{root}/memories"}, "not_empty")
    await ok(s, "forget", {"uri": moved})
    # Resources.
    res = await s.read_resource(f"{note}?level=0")
    check(res.contents[0].text == "quokka habitat survey", f"resource: {res}")
    templates = await s.list_resource_templates()
    check(templates.resource_templates, "resource templates")
    return note


async def search_uris(s, query, subtree):
    found = await ok(s, "search", {"query": query, "mode": "keyword", "subtree": subtree})
    return [h["uri"] for h in found["hits"]]


async def exercise_kb(s, root, doc):
    """The knowledge-base tools as the admin, below `root`; `doc` a file the server may read."""
    kb_root = f"{root}/resources/sdk-py"
    base = await ok(s, "kb_create", {"name": "sdk-py", "root": kb_root})
    check(base["root"] == kb_root and base["status"] == "active", f"kb_create: {base}")
    await fails(s, "kb_create", {"name": "sdk-py", "root": kb_root}, "already_exists")
    # Bad inputs: typed tool errors naming what is wrong, nothing added.
    msg = await fails(s, "kb_add", {"base": "sdk-py", "inputs": [{"path": "/etc/passwd"}]}, "invalid_field")
    check("allowed_paths" in msg, msg)
    await fails(s, "kb_add", {"base": "sdk-py", "inputs": [{"note": "x", "url": "https://example.com"}]},
                "invalid_field")
    msg = await fails(s, "kb_add", {"base": "sdk-py", "inputs": []}, "invalid_field")
    check("`inputs`" in msg, msg)
    await fails(s, "kb_add", {"base": "no-such-base", "inputs": [{"note": "x"}]}, "not_found")
    added = await ok(s, "kb_add", {"base": "sdk-py", "inputs": [
        {"note": "Narwhals grow a single spiral tusk up to three metres long.", "name": "narwhal"},
        {"path": doc}]})
    ids = [i["id"] for i in added["items"]]
    check(len(ids) == 2 and len(added["jobs"]) == 2, f"kb_add: {added}")
    deadline = time.monotonic() + 60
    while True:
        st = await ok(s, "kb_status", {"base": "sdk-py"})
        if st["total"] == 2 and st["done"] == 2:
            break
        check(time.monotonic() < deadline, f"kb items never finished: {st}")
        await asyncio.sleep(0.2)
    check(st["counts"]["completed"] == 2, f"kb items not completed: {st}")
    failed = await ok(s, "kb_status", {"base": "sdk-py", "status": "failed"})
    check(failed["items"] == [] and failed["items_matched"] == 0, f"kb_status failed: {failed}")
    narwhal = f"{kb_root}/narwhal"
    hits = await search_uris(s, "narwhals spiral tusk", kb_root)
    check(any(u.startswith(narwhal) for u in hits), f"the note is not found: {hits}")
    hits = await search_uris(s, "pangolins armoured scales", kb_root)
    check(any(u.startswith(f"{kb_root}/pangolin.md") for u in hits), f"the file is not found: {hits}")
    listed = await ok(s, "kb_list", {})
    mine = [b for b in listed["bases"] if b["name"] == "sdk-py"]
    check(mine and mine[0]["counts"]["completed"] == 2, f"kb_list: {listed}")
    # Removed: gone from search at once.
    rm = await ok(s, "kb_remove_items", {"base": "sdk-py", "items": [ids[0]]})
    check(rm["roots"] == [ids[0]], f"kb_remove_items: {rm}")
    hits = await search_uris(s, "narwhals spiral tusk", kb_root)
    check(not any(u.startswith(narwhal) for u in hits), f"a removed item is still found: {hits}")
    await fails(s, "kb_reindex", {"base": "sdk-py", "items": ["no-such-item"]}, "not_found")
    await fails(s, "kb_status", {"base": "sdk-py", "status": "sideways"}, "invalid_field")


async def kb_forbidden(s):
    """A tenant key: every knowledge-base tool is refused."""
    msg = await fails(s, "kb_list", {}, "forbidden")
    check("admin" in msg, msg)
    await fails(s, "kb_create", {"name": "mine"}, "forbidden")
    await fails(s, "kb_add", {"base": "sdk-py", "inputs": [{"note": "planted"}]}, "forbidden")
    await fails(s, "kb_status", {"base": "sdk-py"}, "forbidden")


async def stdio(root, doc, command):
    async with session_stdio(command) as s:
        await exercise(s, f"ctx://{root}")
        if doc == "-":
            await kb_forbidden(s)
        else:
            await exercise_kb(s, f"ctx://{root}", doc)


async def http(url, key_a, key_b, key_admin, doc):
    async with session_http(url, key_a) as a:
        note = await exercise(a, "ctx://a")
        await kb_forbidden(a)
    async with session_http(url, key_admin) as admin:
        await exercise_kb(admin, "ctx://a", doc)
    async with session_http(url, key_b) as b:
        await ok(b, "write", {"uri": "ctx://b/docs/secret", "abstract": "bravo confidential merger"})
        await wait_indexed(b)
        err, v = await call(b, "read", {"uris": [note]})
        check(not err and v["nodes"][0]["error"]["code"] == "not_found", f"b reads a: {v}")
        await fails(b, "write", {"uri": note, "content": "overwritten"}, "forbidden")
    async with session_http(url, key_a) as a:
        hits = await ok(a, "search", {"query": "bravo confidential merger", "mode": "keyword"})
        check(all(h["uri"].startswith("ctx://a/") for h in hits["hits"]), f"a sees b: {hits}")
        await fails(a, "search", {"query": "bravo", "subtree": "ctx://b"}, "forbidden")
        top = await ok(a, "list", {})
        check([c["uri"] for c in top["children"]] == ["ctx://a"], f"a lists: {top}")
    # A wrong key never gets in.
    try:
        async with session_http(url, "key-nobody-knows-000000") as s:
            await s.list_tools()
        check(False, "a wrong key was accepted")
    except AssertionError:
        raise
    except BaseException:  # the SDK raises an HTTP error (in an exception group)
        pass


def main():
    mode = sys.argv[1]
    if mode == "stdio":
        asyncio.run(stdio(sys.argv[2], sys.argv[3], sys.argv[4:]))
    else:
        asyncio.run(http(*sys.argv[2:7]))
    print(f"mcp python sdk ({mode}): ok")


if __name__ == "__main__":
    main()

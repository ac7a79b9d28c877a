// ContextEngine's MCP server through the official TypeScript SDK over Streamable HTTP.
//
//     node tests/mcp-ts/check.mjs URL KEY_A KEY_B KEY_ADMIN
//
// Lists the tools, calls each one, checks results and errors and tenant isolation between
// two API keys; a write is searched for once `status` says the indexes caught up. The
// knowledge-base tools as the admin: a note added to a base, followed until completed and
// found by search; a path outside `[ingest].allowed_paths` and bad arguments get typed
// errors; a tenant key is refused. Exits non-zero on the first failed check. Driven by
// crates/ce-cli/tests/cli/mcp.rs.
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, keyA, keyB, keyAdmin] = process.argv.slice(2);
const TOOLS = ["search", "read", "list", "tree", "write", "edit", "move", "forget", "link", "related", "session_add", "session_commit", "status",
  "kb_list", "kb_create", "kb_add", "kb_status", "kb_remove_items", "kb_reindex"];

async function connect(key) {
  const client = new Client({ name: "ce-ts-check", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  });
  await client.connect(transport);
  return client;
}

async function call(c, name, args) {
  const r = await c.callTool({ name, arguments: args });
  assert.deepEqual(JSON.parse(r.content[0].text), r.structuredContent, `${name}: text block`);
  return [r.isError === true, r.structuredContent];
}

async function ok(c, name, args) {
  const [err, v] = await call(c, name, args);
  assert.ok(!err, `${name} ${JSON.stringify(args)} failed: ${JSON.stringify(v)}`);
  return v;
}

async function fails(c, name, args, code) {
  const [err, v] = await call(c, name, args);
  assert.ok(err, `${name} ${JSON.stringify(args)} succeeded: ${JSON.stringify(v)}`);
  assert.equal(v.code, code, `${name}: ${JSON.stringify(v)}`);
  assert.equal(typeof v.retryable, "boolean");
  return v.message;
}

async function waitIndexed(c) {
  const deadline = Date.now() + 30000;
  for (;;) {
    const st = await ok(c, "status", {});
    if (st.searchable) return;
    assert.ok(Date.now() < deadline, `indexes never caught up: ${JSON.stringify(st)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const a = await connect(keyA);
const { tools } = await a.listTools();
assert.deepEqual(tools.map((t) => t.name).sort(), [...TOOLS].sort());
for (const t of tools) {
  const s = JSON.stringify(t.inputSchema);
  assert.ok(!s.includes("anyOf") && !s.includes("$ref") && !s.includes("oneOf"), t.name);
  assert.equal(typeof t.annotations.readOnlyHint, "boolean", t.name);
}
const note = "ctx://a/memories/ts-sdk";
const w = await ok(a, "write", { uri: note, abstract: "axolotl regeneration study", content: "Axolotls regrow limbs. Samples: 40." });
assert.equal(typeof w.indexing.searchable, "boolean");
await waitIndexed(a);
const found = await ok(a, "search", { query: "axolotl regeneration", mode: "keyword" });
assert.equal(found.hits[0].uri, note, JSON.stringify(found));
const packed = await ok(a, "search", { query: "axolotl regeneration", mode: "keyword", detail: "content", max_tokens: 12 });
assert.ok(packed.tokens <= 12, JSON.stringify(packed));
const r = await ok(a, "read", { uris: [note] });
assert.ok(r.nodes[0].text.startsWith("Axolotls"));
await ok(a, "edit", { uri: note, old: "40", new: "41" });
assert.match(await fails(a, "edit", { uri: note, old: "Axolotls", new: "x", layer: "abstract" }, "invalid_field"), /does not occur/);
assert.match(await fails(a, "read", { uris: "not-a-list" }, "invalid_field"), /`uris`/);
await fails(a, "write", { uri: note, content: "x", expect_version: 1 }, "version_conflict");
const lst = await ok(a, "list", { uri: "ctx://a/memories" });
assert.ok(lst.children.some((ch) => ch.uri === note));
const tr = await ok(a, "tree", { uri: "ctx://a", depth: 2 });
assert.ok(tr.nodes.some((n) => n.uri === note));
await ok(a, "write", { uri: "ctx://a/memories/ts-other", content: "other" });
await ok(a, "link", { from: note, to: "ctx://a/memories/ts-other", type: "references" });
await waitIndexed(a);
const rel = await ok(a, "related", { uri: note });
assert.equal(rel.edges[0].other, "ctx://a/memories/ts-other");
await ok(a, "move", { from: "ctx://a/memories/ts-other", to: "ctx://a/memories/ts-moved" });
await fails(a, "forget", { uri: "ctx://a/memories" }, "not_empty");
await ok(a, "forget", { uri: "ctx://a/memories/ts-moved" });
const res = await a.readResource({ uri: `${note}?level=0` });
assert.equal(res.contents[0].text, "axolotl regeneration study");
// Tenant isolation: b writes, a never sees it; b cannot touch a.
const b = await connect(keyB);
await ok(b, "write", { uri: "ctx://b/docs/ts-secret", abstract: "bravo axolotl merger" });
await waitIndexed(b);
const hits = await ok(a, "search", { query: "bravo axolotl merger", mode: "keyword" });
assert.ok(hits.hits.every((h) => h.uri.startsWith("ctx://a/")), JSON.stringify(hits));
const rb = await ok(a, "read", { uris: ["ctx://b/docs/ts-secret"] });
assert.equal(rb.nodes[0].error.code, "not_found");
await fails(b, "write", { uri: note, content: "overwritten" }, "forbidden");
await fails(a, "search", { query: "bravo", subtree: "ctx://b" }, "forbidden");
// Knowledge bases: admin only.
assert.match(await fails(a, "kb_list", {}, "forbidden"), /admin/);
await fails(a, "kb_add", { base: "ts-kb", inputs: [{ note: "planted" }] }, "forbidden");
const adm = await connect(keyAdmin);
const kbRoot = "ctx://a/resources/ts-kb";
const base = await ok(adm, "kb_create", { name: "ts-kb", root: kbRoot });
assert.equal(base.root, kbRoot);
assert.match(
  await fails(adm, "kb_add", { base: "ts-kb", inputs: [{ path: "/etc/hostname" }] }, "invalid_field"),
  /allowed_paths/,
);
assert.match(await fails(adm, "kb_add", { base: "ts-kb", inputs: "a note" }, "invalid_field"), /`inputs`/);
await fails(adm, "kb_status", { base: "no-such-base" }, "not_found");
const added = await ok(adm, "kb_add", {
  base: "ts-kb",
  inputs: [{ note: "Blobfish live in the deep sea off Australia at high pressure.", name: "blobfish" }],
});
assert.equal(added.items.length, 1);
const deadline = Date.now() + 60000;
let st;
for (;;) {
  st = await ok(adm, "kb_status", { base: "ts-kb" });
  if (st.total === 1 && st.done === 1) break;
  assert.ok(Date.now() < deadline, `kb item never finished: ${JSON.stringify(st)}`);
  await new Promise((r) => setTimeout(r, 200));
}
assert.equal(st.counts.completed, 1, JSON.stringify(st));
assert.equal(st.items[0].node_uri, `${kbRoot}/blobfish`);
const fish = await ok(adm, "search", { query: "blobfish deep sea", mode: "keyword", subtree: kbRoot });
assert.ok(fish.hits.some((h) => h.uri.startsWith(`${kbRoot}/blobfish`)), JSON.stringify(fish));
const bases = await ok(adm, "kb_list", {});
assert.equal(bases.bases.find((x) => x.name === "ts-kb").counts.completed, 1, JSON.stringify(bases));
await ok(adm, "kb_remove_items", { base: "ts-kb", items: [added.items[0].id] });
const gone = await ok(adm, "search", { query: "blobfish deep sea", mode: "keyword", subtree: kbRoot });
assert.ok(!gone.hits.some((h) => h.uri.startsWith(`${kbRoot}/blobfish`)), JSON.stringify(gone));
await adm.close();
await a.close();
await b.close();
// A wrong key never gets in.
await assert.rejects(connect("key-nobody-knows-000000"));
console.log("mcp typescript sdk (http): ok");

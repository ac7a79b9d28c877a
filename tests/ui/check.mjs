// The web console in a real browser: Debian's chromium, headless, driven by puppeteer-core,
// against a real `ce serve` seeded by crates/ce-cli/tests/cli/ui.rs.
//
// node check.mjs URL ADMIN_KEY KEY_A KEY_B SCREENSHOT_DIR
//
// Logs in with account A's key, browses to a node, edits its L0 and sees the new version,
// searches and sees a hit (with the per-mode ranks of hybrid), checks keyboard navigation of
// the tree and the layout at 400 % text zoom; logs in with the admin key, requeues the dead
// letter the test made and sees the lag return to 0; logs in with account B's key and sees
// nothing of account A. A screenshot of each page goes to SCREENSHOT_DIR. Prints
// "ui console check: ok" at the end; any failed check exits non-zero with the reason.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

const [url, adminKey, keyA, keyB, shots] = process.argv.slice(2);
if (!shots) {
  console.error("usage: node check.mjs URL ADMIN_KEY KEY_A KEY_B SCREENSHOT_DIR");
  process.exit(2);
}
mkdirSync(shots, { recursive: true });
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const TIMEOUT = 30000;

function check(cond, what) {
  if (!cond) throw new Error("check failed: " + what);
  console.log("ok: " + what);
}

const browser = await puppeteer.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const page = await browser.newPage();
page.setDefaultTimeout(TIMEOUT);
await page.setViewport({ width: 1280, height: 800 });
const problems = [];
// Error answers the checks provoke (404, 409) are logged by the browser as failed loads;
// anything else on the console is a bug.
page.on("console", (m) => {
  if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push("console: " + m.text());
});
page.on("pageerror", (e) => problems.push("page error: " + e.message));
const shot = (name) => page.screenshot({ path: join(shots, name + ".png"), fullPage: true });
const text = (sel) => page.$eval(sel, (e) => e.textContent);
const waitText = (sel, want) => page.waitForFunction(
  (s, w) => [...document.querySelectorAll(s)].some((e) => e.textContent.includes(w)), {}, sel, want);

async function login(key) {
  await page.goto(url + "/ui/", { waitUntil: "load" });
  await page.evaluate(() => sessionStorage.clear());
  await page.goto(url + "/ui/#/tree", { waitUntil: "load" });
  await page.waitForSelector("#key");
  await page.type("#key", key);
  await page.click('form.login button[type="submit"]');
  await page.waitForSelector('[role="tree"] [role="treeitem"]');
}

async function logout() {
  await page.click("#logout");
  await page.waitForSelector("#key");
}

try {
  // The page and its headers.
  const res = await page.goto(url + "/ui/", { waitUntil: "load" });
  const csp = res.headers()["content-security-policy"] || "";
  check(csp.includes("default-src 'none'") && csp.includes("script-src 'self'"), "strict Content-Security-Policy on /ui");
  await page.waitForSelector("#key");
  await shot("login");

  // Account A: browse to a node.
  await login(keyA);
  const accounts = await page.$$eval('[role="tree"] > [role="treeitem"]', (xs) => xs.map((x) => x.dataset.uri));
  check(accounts.length === 1 && accounts[0] === "ctx://a", "key A sees only its account in the tree: " + accounts);
  await waitText('[role="treeitem"] .name', "docs");
  const docs = '[data-uri="ctx://a/docs"]';
  await page.click(docs + " > .row");
  const guide = '[data-uri="ctx://a/docs/guide"]';
  await page.waitForSelector(guide);
  check((await text(guide + " > .row .l0")).includes("How to install the widget"), "the tree shows L0 beside each node");
  await page.click(guide + " > .row");
  await page.waitForFunction(() => document.querySelector("#node-title")?.textContent === "ctx://a/docs/guide"
    && document.querySelector("#layer-0-text"));
  const before = Number(await text("#node-version"));
  check((await text("#layer-0-prov")) === "user", "L0 provenance is shown (user)");
  await page.waitForFunction(() => [...document.querySelectorAll("td .state")].some((e) => e.textContent === "current"));
  check(true, "the node's index records are current");
  check((await text("#rel-title ~ .table-wrap")).includes("ctx://a/docs/faq"), "outgoing relation listed");
  await shot("tree-node");

  // Edit L0: a new version.
  await page.click("#layer-0-edit");
  await page.waitForSelector("#layer-0-input");
  await page.$eval("#layer-0-input", (e) => { e.value = ""; });
  await page.type("#layer-0-input", "Install the widget with one command.");
  await page.click("#layer-0-save");
  await page.waitForFunction((v) => Number(document.querySelector("#node-version")?.textContent) > v, {}, before);
  const after = Number(await text("#node-version"));
  check(after > before, `editing L0 made version ${after} (was ${before})`);
  check((await text("#layer-0-text")) === "Install the widget with one command.", "the new L0 is shown");

  // A stale edit: the version check refuses it with a clear message.
  await page.click("#layer-1-edit");
  await page.waitForSelector("#layer-1-input");
  await page.evaluate(async () => {
    const key = sessionStorage.getItem("ce.console.key");
    await fetch("/v1/put", { method: "POST", headers: { Authorization: "Bearer " + key, "Content-Type": "application/json" },
      body: JSON.stringify({ uri: "ctx://a/docs/guide", mode: "merge", meta: { touched: true } }) });
  });
  await page.type("#layer-1-input", " (edited)");
  await page.click("#layer-1-save");
  await page.waitForSelector(".conflict");
  check((await text(".conflict")).includes("changed since you opened it"), "a concurrent change is shown as a conflict");
  await shot("edit-conflict");

  // Keyboard: the tree is navigable with keys.
  await page.focus(docs);
  await page.keyboard.press("ArrowDown");
  const active = () => page.evaluate(() => document.activeElement?.dataset.uri);
  check(await active() === "ctx://a/docs/changelog", "ArrowDown moves to the next node");
  await page.keyboard.press("End");
  await page.keyboard.press("ArrowUp");
  check(await active() !== undefined, "End and ArrowUp keep the focus in the tree");
  await page.focus(guide);
  await page.keyboard.press("ArrowLeft");
  check(await active() === "ctx://a/docs", "ArrowLeft on a leaf moves to its parent");
  await page.keyboard.press("ArrowLeft");
  check(await page.evaluate(() => document.querySelector('[data-uri="ctx://a/docs"]').getAttribute("aria-expanded")) === "false", "ArrowLeft collapses");
  await page.keyboard.press("ArrowRight");
  await page.waitForSelector(guide);
  check(true, "ArrowRight expands again");

  // Remove shows the subtree count first.
  await page.goto(url + "/ui/#/tree?uri=" + encodeURIComponent("ctx://a/docs"), { waitUntil: "load" });
  await page.waitForFunction(() => document.querySelector("#node-title")?.textContent === "ctx://a/docs"
    && document.querySelector("#rm-start"));
  await page.click("#rm-start");
  await page.waitForSelector("#rm-confirm");
  const count = await page.$eval("#rm-confirm", (e) => e.textContent);
  check(/Remove it and \d+ nodes below/.test(count), "remove asks with the subtree count: " + count);
  await page.click("#rm-confirm + button");

  // Search: a hit, with the per-mode ranks of hybrid.
  await page.goto(url + "/ui/#/search", { waitUntil: "load" });
  await page.waitForSelector("#q");
  await page.type("#q", "frequently asked questions");
  await page.select("#mode", "hybrid");
  await page.click('.search-form button[type="submit"]');
  await page.waitForSelector("#search-results table");
  await waitText("#search-results td a", "ctx://a/docs/faq");
  const headers = await page.$$eval("#search-results th", (xs) => xs.map((x) => x.textContent));
  check(headers.includes("vector rank") && headers.includes("keyword rank"), "hybrid hits show the rank in each mode");
  await shot("search");

  // 400 % text zoom: a 320 CSS px wide window (1280 / 4) must not scroll sideways.
  await page.setViewport({ width: 320, height: 800, deviceScaleFactor: 1 });
  for (const route of ["#/tree?uri=" + encodeURIComponent("ctx://a/docs/guide"), "#/search"]) {
    await page.goto(url + "/ui/" + route, { waitUntil: "load" });
    await page.waitForSelector("main h1, main h2");
    await new Promise((r) => setTimeout(r, 500));
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
    check(overflow <= 0, `no horizontal scrolling at 400 % zoom on ${route} (overflow ${overflow}px)`);
  }
  await shot("tree-zoom-400");
  await page.setViewport({ width: 1280, height: 800 });

  // Admin: the dead letter, requeued; lag back to 0.
  await page.goto(url + "/ui/#/tree", { waitUntil: "load" });
  await logout();
  await login(adminKey);
  await page.goto(url + "/ui/#/indexes", { waitUntil: "load" });
  await page.waitForSelector("button.requeue");
  check(Number(await text('[data-dead="vector"]')) > 0, "the dead letter is listed and counted");
  await shot("indexes-dead");
  // Each dead letter's own button (the write and the derived write-back may both have died).
  for (let i = 0; i < 10 && await page.$("button.requeue"); i++) {
    const n = await page.$$eval("button.requeue", (xs) => xs.length);
    await page.click("button.requeue");
    await page.waitForFunction((n) => document.querySelectorAll("button.requeue").length < n, {}, n);
  }
  await page.waitForFunction(() => document.querySelector('[data-dead="vector"]')?.textContent === "0"
    && document.querySelector('[data-lag="vector"]')?.textContent === "0", { timeout: 60000 });
  check(true, "after requeue the vector consumer has no dead delivery and lag 0");
  check(await page.$$eval(".spark", (xs) => xs.length) > 0, "a lag sparkline per consumer");
  await waitText('[aria-labelledby="journal-title"] p', "what every consumer applied is kept");
  check(/\d+ events \(seq \d+–\d+\)/.test(await text('[aria-labelledby="journal-title"] p')),
    "the journal's extent is shown");
  await shot("indexes");

  await page.goto(url + "/ui/#/sessions", { waitUntil: "load" });
  await waitText("main a", "ctx://a/users/u1/sessions/s1");
  await page.click('a[href*="sessions%2Fs1"]');
  await waitText("main h3", "Archive 1");
  check(true, "the session's archive is listed");
  await shot("sessions");

  // Account B sees nothing of account A.
  await logout();
  await login(keyB);
  const seen = await page.$$eval('[role="tree"] > [role="treeitem"]', (xs) => xs.map((x) => x.dataset.uri));
  check(seen.length === 1 && seen[0] === "ctx://b", "key B sees only ctx://b: " + seen);
  await page.goto(url + "/ui/#/tree?uri=" + encodeURIComponent("ctx://a/docs/guide"), { waitUntil: "load" });
  await page.waitForSelector(".error");
  check((await text(".error")).includes("not_found"), "key B gets not_found for a node of A");
  await page.goto(url + "/ui/#/search", { waitUntil: "load" });
  await page.waitForSelector("#q");
  await page.type("#q", "widget install guide");
  await page.click('.search-form button[type="submit"]');
  await page.waitForSelector("#search-results table");
  check(!(await text("#search-results")).includes("ctx://a/"), "key B's search shows nothing of A");
  await page.goto(url + "/ui/#/indexes", { waitUntil: "load" });
  await waitText("main p", "need an admin key");
  check(true, "key B gets no index page");
  await shot("tenant-b");

  check(problems.length === 0, "no console errors: " + problems.join("; "));
  console.log("ui console check: ok");
} catch (e) {
  try { await shot("failure"); } catch { /* the page may be gone */ }
  console.error(e.stack || String(e));
  if (problems.length) console.error(problems.join("\n"));
  process.exitCode = 1;
} finally {
  await browser.close();
}

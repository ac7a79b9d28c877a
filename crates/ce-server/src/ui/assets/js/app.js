// The console's shell: login, navigation between pages (hash routes), who is logged in.
import * as api from "./api.js";
import { h, fill, errorBox } from "./dom.js";
import { treePage } from "./tree.js";
import { searchPage } from "./search.js";
import { indexesPage } from "./indexes.js";
import { sessionsPage } from "./sessions.js";

const PAGES = { tree: treePage, search: searchPage, indexes: indexesPage, sessions: sessionsPage };

/** What the logged-in key may do: `admin` (status, outbox, repair, jobs) and its accounts. */
export const session = { admin: false, accounts: [] };

// The page shown: its name and what it answered (`update(params)` for a new hash of the
// same page, `stop()` when leaving it).
let current = { name: null, ctl: null };

async function probe() {
  const accounts = await api.get("/v1/ls");
  session.accounts = accounts.map((a) => a.uri);
  try {
    await api.get("/v1/status/lag");
    session.admin = true;
  } catch (e) {
    if (e.status !== 403) throw e;
    session.admin = false;
  }
}

function loginPage(main, message) {
  const input = h("input", { id: "key", name: "key", type: "password", autocomplete: "off", "aria-describedby": "key-help" });
  const status = h("div", { "aria-live": "polite" }, message ? errorBox(message) : "");
  const form = h("form", { class: "login", "aria-labelledby": "login-title" },
    h("h1", { id: "login-title" }, "Log in"),
    h("label", { for: "key" }, "API key"),
    input,
    h("p", { id: "key-help", class: "muted" },
      "The key is kept in this tab only (sessionStorage) and sent as a bearer token. ",
      "A server without keys takes an empty one."),
    h("button", { type: "submit" }, "Log in"),
    status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    api.setKey(input.value.trim());
    try {
      await probe();
      location.hash = "#/tree";
      route();
    } catch (e) {
      api.forget();
      fill(status, errorBox(e.status === 401 ? { code: e.code, message: "this key is not known to the server" } : e));
    }
  });
  fill(main, form);
  input.focus();
}

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [name, q] = raw.split("?");
  return { name: name || "tree", params: new URLSearchParams(q || "") };
}

async function route() {
  const main = document.getElementById("main");
  const nav = document.getElementById("nav");
  const logout = document.getElementById("logout");
  if (api.key() === null) {
    current.ctl?.stop?.();
    current = { name: null, ctl: null };
    nav.hidden = true; logout.hidden = true;
    fill(document.getElementById("who"), "");
    return loginPage(main);
  }
  if (!session.probed) {
    try { await probe(); session.probed = true; } catch (e) {
      api.forget();
      return loginPage(main, e);
    }
  }
  nav.hidden = false; logout.hidden = false;
  fill(document.getElementById("who"),
    session.admin ? "admin key" : "tenant key: " + (session.accounts.join(", ") || "no account yet"));
  const { name, params } = parseHash();
  if (current.name === name && current.ctl?.update) return current.ctl.update(params);
  current.ctl?.stop?.();
  current = { name, ctl: null };
  const page = PAGES[name] || treePage;
  for (const a of nav.querySelectorAll("a")) {
    if (a.dataset.page === name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.title = name.charAt(0).toUpperCase() + name.slice(1) + " · ContextEngine console";
  fill(main);
  try {
    current.ctl = (await page(main, params, session)) || null;
  } catch (e) {
    main.append(errorBox(e));
  }
}

document.getElementById("logout").addEventListener("click", () => {
  api.forget();
  session.probed = false;
  location.hash = "#/tree";
  route();
});
window.addEventListener("hashchange", route);
route();

// Small DOM helpers: elements built from data, never from HTML strings (no injection).

/** Creates `<tag>` with attributes (`on*` are listeners) and children (strings or nodes). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces the children of `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A time in milliseconds since the epoch, as local date and time. */
export function when(ms) {
  if (ms === null || ms === undefined) return "";
  return new Date(ms).toLocaleString();
}

/** A table with a caption, column headers and rows of cells. */
export function table(caption, headers, rows) {
  return h("div", { class: "table-wrap" },
    h("table", {},
      h("caption", {}, caption),
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
      h("tbody", {}, rows.length
        ? rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))
        : h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, "none")))));
}

/** A link to a node's page in the tree. */
export function nodeLink(uri) {
  return h("a", { href: "#/tree?uri=" + encodeURIComponent(uri), class: "uri" }, uri);
}

/** Shows a short message in the live region. */
export function toast(text) {
  const t = document.getElementById("toast");
  fill(t, text);
  t.classList.add("shown");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => t.classList.remove("shown"), 4000);
}

/** An error box naming the API's code and message. */
export function errorBox(e) {
  return h("p", { class: "error", role: "alert" },
    e.code ? h("strong", {}, e.code + ": ") : "", e.message || String(e));
}

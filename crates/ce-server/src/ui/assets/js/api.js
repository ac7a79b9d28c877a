// The HTTP API from the browser: every call carries the key the user logged in with
// (kept in sessionStorage for this tab only), so the console sees what that key sees.

const KEY = "ce.console.key";

/** An error answer of the API: its HTTP status, code and message. */
export class ApiError extends Error {
  constructor(status, code, message, retryable) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryable = retryable;
  }
}

export function key() { return sessionStorage.getItem(KEY); }
export function setKey(k) { sessionStorage.setItem(KEY, k); }
export function forget() { sessionStorage.removeItem(KEY); }

/** Calls `method path` with a query object or a JSON body; answers the parsed JSON. */
export async function call(method, path, { query, body } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, String(v));
  }
  const headers = { Accept: "application/json" };
  const k = key();
  if (k) headers.Authorization = "Bearer " + k;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, "network", "the server did not answer: " + e.message, true);
  }
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!res.ok) {
    const d = data || {};
    throw new ApiError(res.status, d.code || "http_" + res.status, d.message || text || res.statusText, !!d.retryable);
  }
  return data;
}

export const get = (path, query) => call("GET", path, { query });
export const post = (path, body) => call("POST", path, { body });

// Where the server is and how to authenticate. Every URL is relative to this page, so the demo
// works behind any path prefix (a reverse proxy serving it at /asr/ reaches /asr/v1/...).

const query = new URLSearchParams(location.search);

/** Optional API key, taken from this page's own `?api_key=` (browsers cannot set headers on a WebSocket). */
export const apiKey = query.get("api_key") || null;

/** A page option from the query string (`?transport=webrtc`, `?language=de`), or `fallback`. */
export function pageOption(name, fallback) {
  return query.get(name) || fallback;
}

/** Absolute http(s) URL of an API path such as "v1/models". */
export function apiUrl(path) {
  return new URL(path, document.baseURI);
}

/** ws:// or wss:// URL of an API path, with the API key as a query parameter. */
export function wsUrl(path) {
  const url = apiUrl(path);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (apiKey) url.searchParams.set("api_key", apiKey);
  return url.href;
}

/** Request headers with `Authorization: Bearer KEY` added when the page has a key. */
export function authHeaders(headers = {}) {
  return apiKey ? { ...headers, Authorization: `Bearer ${apiKey}` } : headers;
}

/** The event a server text message holds; one that is not JSON becomes an `error` event. */
export function parseEvent(data) {
  try {
    return JSON.parse(data);
  } catch {
    return { type: "error", code: "bad_server_message", message: String(data).slice(0, 200) };
  }
}

/** The human-readable message of an error response body (OpenAI's `{error: {message}}` or plain text). */
export function errorMessage(status, bodyText) {
  try {
    const body = JSON.parse(bodyText);
    const message = body?.error?.message ?? body?.message ?? body?.detail;
    if (message) return `${status}: ${message}`;
  } catch {
    // not JSON: fall through to the raw text
  }
  return `${status}: ${(bodyText || "request failed").slice(0, 300)}`;
}

/** GET a JSON API path; throws an Error with the server's message on failure. */
export async function getJson(path) {
  const response = await fetch(apiUrl(path), { headers: authHeaders() });
  const text = await response.text();
  if (!response.ok) throw new Error(errorMessage(response.status, text));
  return JSON.parse(text);
}

/** POST JSON to an API path and return the JSON reply; throws an Error with the server's message. */
export async function postJson(path, body) {
  const response = await fetch(apiUrl(path), {
    method: "POST",
    headers: authHeaders({ "Content-Type": "application/json" }),
    body: JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(errorMessage(response.status, text));
  return JSON.parse(text);
}

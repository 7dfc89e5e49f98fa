// The demo page: live transcription from the microphone (WebSocket PCM or WebRTC) and file
// transcription. Server events follow docs/protocol.md; `window.streamerState` mirrors what the
// page shows so that browser tests can read it.

import { getJson, pageOption } from "./api.js";
import { clockTime, setupFilePanel } from "./file-panel.js";
import { WebRtcTransport } from "./webrtc-transport.js";
import { WebSocketTransport } from "./ws-transport.js";

const MAX_EVENTS = 200;
const TRANSPORTS = { websocket: WebSocketTransport, webrtc: WebRtcTransport };
// Why a socket closed, by close code (docs/protocol.md, "Close codes").
const CLOSE_REASONS = {
  1001: "the server is shutting down",
  1006: "the connection was lost",
  1008: "not authorised (add ?api_key=… to this page's address)",
  1009: "a message was too large",
  1011: "internal server error",
  1013: "the server is full, try again later",
};

const $ = (id) => document.getElementById(id);
const ui = {
  start: $("start"),
  stop: $("stop"),
  transport: $("transport"),
  languageInput: $("language-input"),
  task: $("task"),
  status: $("status"),
  level: $("level"),
  model: $("model"),
  language: $("language"),
  latency: $("latency"),
  partial: $("partial"),
  finals: $("finals"),
  errors: $("errors"),
};

/** What the page shows, for tests: final texts, the current partial, events (newest last). */
const state = { finals: [], partial: "", connected: false, events: [] };
window.streamerState = state;

let transport = null;
let session = null; // per-session bookkeeping, reset on every start
let modelId = null; // from GET v1/models, then from `ready`

function newSession() {
  return {
    stoppedAt: new Map(), // utterance_id -> performance.now() at speech_stopped
    finalised: new Set(), // utterance ids with a final: later partials for them are stale
    partialUtterance: null, // utterance_id of the partial on screen
    latencies: [],
    configuredLanguage: null,
    closedReason: null, // from the `closed` event
  };
}

function setStatus(text) {
  ui.status.textContent = text;
}

function showError(text) {
  const item = document.createElement("li");
  item.textContent = text;
  ui.errors.append(item);
  ui.errors.hidden = false;
}

function setRunning(running) {
  ui.start.disabled = running;
  ui.stop.disabled = !running;
  ui.transport.disabled = ui.languageInput.disabled = ui.task.disabled = running;
}

function showPartial(stable, unstable) {
  ui.partial.querySelector(".stable").textContent = stable;
  ui.partial.querySelector(".unstable").textContent = unstable;
  ui.partial.hidden = stable === "" && unstable === "";
}

function addFinal(event, latencyMs) {
  const line = document.createElement("p");
  line.className = "final";
  line.dataset.utterance = String(event.utterance_id ?? "");
  const at = document.createElement("span");
  at.className = "at";
  at.textContent = clockTime(event.start ?? 0);
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = event.text;
  line.append(at, " ", text);
  const parts = [];
  if (latencyMs != null) parts.push(`${Math.round(latencyMs)} ms`);
  if (event.latency_ms != null) parts.push(`server ${Math.round(event.latency_ms)} ms`);
  if (parts.length) {
    const latency = document.createElement("span");
    latency.className = "latency";
    latency.textContent = parts.join(" · ");
    line.append(" ", latency);
  }
  ui.finals.append(line);
  line.scrollIntoView({ block: "nearest" });
}

function showLatency(latencyMs, serverMs) {
  if (latencyMs != null) session.latencies.push(latencyMs);
  const parts = [];
  if (latencyMs != null) parts.push(`last ${Math.round(latencyMs)} ms after speech stopped`);
  if (serverMs != null) parts.push(`server ${Math.round(serverMs)} ms`);
  const n = session.latencies.length;
  if (n > 1) parts.push(`mean ${Math.round(session.latencies.reduce((a, b) => a + b, 0) / n)} ms over ${n}`);
  ui.latency.textContent = parts.join(" · ") || "–";
}

// When the speech_stopped of this final's utterance arrived (performance.now()), or null: an
// utterance cut at its maximum length has none.
function takeStopTime(event) {
  const at = session.stoppedAt.get(event.utterance_id) ?? null;
  session.stoppedAt.delete(event.utterance_id);
  return at;
}

function onEvent(event) {
  state.events.push(event);
  if (state.events.length > MAX_EVENTS) state.events.splice(0, state.events.length - MAX_EVENTS);
  switch (event.type) {
    case "ready":
      state.connected = true;
      if (event.model) modelId = ui.model.textContent = event.model;
      session.configuredLanguage = event.language ?? null;
      ui.language.textContent = event.language ?? "auto-detect";
      setStatus("Listening");
      break;
    case "speech_started":
      setStatus("Hearing speech…");
      break;
    case "speech_stopped":
      session.stoppedAt.set(event.utterance_id, performance.now());
      setStatus("Listening");
      break;
    case "partial":
      if (session.finalised.has(event.utterance_id)) break;
      session.partialUtterance = event.utterance_id;
      state.partial = event.text ?? "";
      if (event.stable != null || event.unstable != null) showPartial(event.stable ?? "", event.unstable ?? "");
      else showPartial("", state.partial);
      break;
    case "final": {
      session.finalised.add(event.utterance_id);
      const stoppedAt = takeStopTime(event);
      const latencyMs = stoppedAt == null ? null : performance.now() - stoppedAt;
      // The next utterance's partial may already be on screen; it stays.
      if (session.partialUtterance === event.utterance_id || session.partialUtterance == null) {
        state.partial = "";
        showPartial("", "");
      }
      if (event.text && event.text.trim()) {
        state.finals.push(event.text);
        addFinal(event, latencyMs);
      }
      showLatency(latencyMs, event.latency_ms);
      if (!session.configuredLanguage && event.language) ui.language.textContent = `${event.language} (detected)`;
      break;
    }
    case "error":
      showError(`${event.code ?? "error"}: ${event.message ?? ""}`);
      break;
    case "closed":
      session.closedReason = event.reason ?? "unknown";
      break;
  }
}

function onEnd({ code, reason }) {
  transport = null;
  state.connected = false;
  setRunning(false);
  ui.level.value = 0;
  if (CLOSE_REASONS[code]) showError(`Connection closed: ${CLOSE_REASONS[code]}${reason ? ` (${reason})` : ""}.`);
  setStatus(session.closedReason ? `Stopped (${session.closedReason})` : "Stopped");
}

function startFields() {
  const language = ui.languageInput.value.trim().toLowerCase();
  return {
    language: language === "" || language === "auto" ? null : language,
    task: ui.task.value,
    partials: true,
    partial_interval_ms: 500,
  };
}

async function start() {
  if (transport) return;
  ui.errors.replaceChildren();
  ui.errors.hidden = true;
  session = newSession();
  state.partial = "";
  showPartial("", "");
  setRunning(true);
  setStatus("Connecting…");
  const Transport = TRANSPORTS[ui.transport.value];
  transport = new Transport({ onEvent, onEnd, onLevel: (peak) => (ui.level.value = peak) });
  try {
    await transport.start(startFields());
  } catch (error) {
    transport = null;
    setRunning(false);
    setStatus("Stopped");
    showError(error.message);
  }
}

function stop() {
  if (!transport) return;
  setStatus("Finishing…");
  ui.stop.disabled = true;
  transport.stop();
}

async function showModel() {
  try {
    const models = await getJson("v1/models");
    const id = models.data?.[0]?.id;
    if (id && !state.connected) modelId = ui.model.textContent = id;
  } catch {
    if (!modelId) ui.model.textContent = "unknown (GET v1/models failed)";
  }
}

function showConfiguredLanguage() {
  const language = startFields().language;
  ui.language.textContent = language ?? "auto-detect";
}

function main() {
  ui.transport.value = TRANSPORTS[pageOption("transport", "")] ? pageOption("transport") : "websocket";
  ui.languageInput.value = pageOption("language", "auto");
  ui.languageInput.addEventListener("change", showConfiguredLanguage);
  showConfiguredLanguage();
  ui.start.addEventListener("click", start);
  ui.stop.addEventListener("click", stop);
  setRunning(false);
  setStatus("Idle");
  showModel();
  // "whisper-1" is the name OpenAI clients send; the server answers with the model it serves.
  setupFilePanel(() => ({ model: modelId ?? "whisper-1", language: startFields().language, task: ui.task.value }));
}

main();

// Live transcription over the native WebSocket protocol (docs/protocol.md, `/v1/stream`):
// microphone -> AudioWorklet (16 kHz Int16 frames) -> binary WebSocket messages; events come back
// as JSON text messages.

import { parseEvent, wsUrl } from "./api.js";
import { Capture } from "./mic.js";

const STOP_TIMEOUT_MS = 15000; // how long to wait for `closed` after sending stop
const MAX_QUEUED_FRAMES = 64; // ~2 s of 32-ms frames kept while the socket connects

/**
 * One live session. Handlers: onEvent(serverEvent), onEnd({code, reason}) exactly once,
 * onLevel(peak 0..1).
 */
export class WebSocketTransport {
  #handlers;
  #capture = null;
  #socket = null;
  #queue = [];
  #stopTimer = null;
  #ended = false;

  constructor(handlers) {
    this.#handlers = handlers;
  }

  /** Open the microphone and the socket, then send `start` with `fields` (language, task, ...). */
  async start(fields) {
    const capture = (this.#capture = new Capture()); // before any await (user activation)
    try {
      const source = await capture.open(this.#handlers.onLevel);
      await capture.context.audioWorklet.addModule(new URL("pcm-worklet.js", import.meta.url));
      const writer = new AudioWorkletNode(capture.context, "pcm16k-writer", {
        numberOfOutputs: 1,
        outputChannelCount: [1],
      });
      writer.port.onmessage = (event) => this.#sendAudio(event.data);
      // Connected to the speakers only so the graph pulls it; it outputs silence.
      source.connect(writer).connect(capture.context.destination);
      await capture.context.resume();
    } catch (error) {
      this.#ended = true; // the caller reports the error; no onEnd for a start that failed
      this.#release();
      throw error;
    }
    this.#connect(fields);
  }

  /** Stop the microphone and ask the server to finalise; onEnd follows once it has closed. */
  stop() {
    this.#stopCapture();
    const socket = this.#socket;
    if (socket?.readyState !== WebSocket.OPEN) {
      this.abort();
      return;
    }
    socket.send(JSON.stringify({ type: "stop" }));
    this.#stopTimer = setTimeout(() => socket.close(1000, "no closed event"), STOP_TIMEOUT_MS);
  }

  /** End at once, without waiting for finals. */
  abort() {
    if (this.#socket && this.#socket.readyState !== WebSocket.CLOSED) this.#socket.close();
    else this.#end(1000, "aborted");
  }

  #connect(fields) {
    const socket = new WebSocket(wsUrl("v1/stream"));
    socket.binaryType = "arraybuffer";
    socket.onopen = () => {
      const start = { type: "start", sample_rate: 16000, encoding: "pcm_s16le", channels: 1, ...fields };
      socket.send(JSON.stringify(start));
      for (const frame of this.#queue) socket.send(frame);
      this.#queue = [];
    };
    socket.onmessage = (event) => {
      if (typeof event.data !== "string") return; // the server sends no binary messages
      this.#handlers.onEvent(parseEvent(event.data));
    };
    socket.onclose = (event) => this.#end(event.code, event.reason);
    this.#socket = socket;
  }

  #sendAudio(frame) {
    const socket = this.#socket;
    if (socket?.readyState === WebSocket.OPEN) socket.send(frame);
    else if ((!socket || socket.readyState === WebSocket.CONNECTING) && this.#queue.length < MAX_QUEUED_FRAMES) {
      this.#queue.push(frame);
    }
  }

  #stopCapture() {
    this.#capture?.close();
  }

  #release() {
    clearTimeout(this.#stopTimer);
    this.#stopCapture();
    this.#queue = [];
  }

  #end(code, reason) {
    if (this.#ended) return;
    this.#ended = true;
    this.#release();
    this.#handlers.onEnd({ code, reason });
  }
}

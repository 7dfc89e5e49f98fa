// Live transcription over WebRTC (docs/protocol.md, "WebRTC"): the microphone track goes to the
// server as Opus over RTP; events come back on the data channel `events` as the same JSON as on
// `/v1/stream`. Signalling is one HTTP POST of the complete offer (no trickle ICE).

import { getJson, parseEvent, postJson } from "./api.js";
import { Capture } from "./mic.js";

const ICE_GATHERING_TIMEOUT_MS = 5000; // a slow STUN/TURN server must not block the start
const STOP_TIMEOUT_MS = 15000; // how long to wait for `closed` after sending stop
// RTP and the data channel are separate transports: after the track stops, give packets still
// in flight time to arrive before `stop` tells the server the audio has ended.
const STOP_DRAIN_MS = 200;

/** Optional ICE servers from `GET v1/webrtc/config`; none on failure (loopback needs none). */
async function iceServers() {
  try {
    const config = await getJson("v1/webrtc/config");
    return Array.isArray(config?.iceServers) ? config.iceServers : [];
  } catch {
    return [];
  }
}

function iceGatheringComplete(peer) {
  return new Promise((resolve) => {
    if (peer.iceGatheringState === "complete") return resolve();
    const finish = () => {
      clearTimeout(timer);
      peer.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const check = () => peer.iceGatheringState === "complete" && finish();
    const timer = setTimeout(finish, ICE_GATHERING_TIMEOUT_MS);
    peer.addEventListener("icegatheringstatechange", check);
  });
}

/**
 * One live session. Handlers: onEvent(serverEvent), onEnd({code, reason}) exactly once,
 * onLevel(peak 0..1). Codes follow WebSocket close codes so the page reports both alike.
 */
export class WebRtcTransport {
  #handlers;
  #capture = null;
  #peer = null;
  #channel = null;
  #stopTimer = null;
  #ended = false;

  constructor(handlers) {
    this.#handlers = handlers;
  }

  /** Open the microphone, negotiate with the server; `fields` are the start message's fields. */
  async start(fields) {
    // The context is for the level meter only; made before any await (user activation).
    const capture = (this.#capture = new Capture());
    try {
      await capture.open(this.#handlers.onLevel);
      const { stream } = capture;
      const peer = new RTCPeerConnection({ iceServers: await iceServers() });
      this.#peer = peer;
      for (const track of stream.getAudioTracks()) peer.addTrack(track, stream);
      // Created before the offer so that the offer carries the data channel (SCTP) section.
      this.#channel = peer.createDataChannel("events", { ordered: true });
      this.#channel.onmessage = (event) => this.#onMessage(event.data);
      this.#channel.onclose = () => this.#end(1000, "data channel closed");
      peer.onconnectionstatechange = () => {
        if (peer.connectionState === "failed") this.#end(1006, "WebRTC connection failed");
      };
      await peer.setLocalDescription(await peer.createOffer());
      await iceGatheringComplete(peer);
      const offer = peer.localDescription;
      const answer = await postJson("v1/webrtc/offer", { sdp: offer.sdp, type: offer.type, start: fields });
      await peer.setRemoteDescription({ sdp: answer.sdp, type: answer.type });
    } catch (error) {
      this.#ended = true; // the caller reports the error; no onEnd for a start that failed
      this.#release();
      throw error;
    }
  }

  /** Stop the microphone and ask the server to finalise; onEnd follows `closed`. */
  stop() {
    this.#stopCapture();
    const channel = this.#channel;
    if (channel?.readyState !== "open") {
      this.abort();
      return;
    }
    setTimeout(() => channel.readyState === "open" && channel.send(JSON.stringify({ type: "stop" })), STOP_DRAIN_MS);
    this.#stopTimer = setTimeout(() => this.#end(1000, "no closed event"), STOP_TIMEOUT_MS);
  }

  /** End at once, without waiting for finals. */
  abort() {
    this.#end(1000, "aborted");
  }

  #onMessage(data) {
    const message = parseEvent(data);
    this.#handlers.onEvent(message);
    if (message.type === "closed") this.#end(1000, message.reason ?? "closed");
  }

  #stopCapture() {
    this.#capture?.close();
  }

  #release() {
    clearTimeout(this.#stopTimer);
    this.#stopCapture();
    if (this.#channel) this.#channel.onclose = null;
    this.#channel?.close();
    this.#peer?.close();
  }

  #end(code, reason) {
    if (this.#ended) return;
    this.#ended = true;
    this.#release();
    this.#handlers.onEnd({ code, reason });
  }
}

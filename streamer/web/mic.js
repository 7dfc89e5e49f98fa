// The microphone: permission, the capture constraints both transports share, and a level meter.

const CONSTRAINTS = { audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true } };
const LEVEL_INTERVAL_MS = 100;

/** Ask for the microphone; throws an Error whose message a person can act on. */
export async function openMicrophone() {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new Error("The microphone needs a secure page: open it over https or on localhost.");
  }
  try {
    return await navigator.mediaDevices.getUserMedia(CONSTRAINTS);
  } catch (error) {
    if (error.name === "NotAllowedError") throw new Error("Microphone permission was denied.");
    if (error.name === "NotFoundError") throw new Error("No microphone was found.");
    throw new Error(`Cannot open the microphone: ${error.message || error.name}`);
  }
}

/** Release the microphone (the browser's recording indicator goes off). */
export function closeMicrophone(stream) {
  for (const track of stream?.getTracks() ?? []) track.stop();
}

/**
 * One session's capture: an AudioContext, the microphone and its level meter. Construct it in the
 * click handler, before any await, so that the click's user activation lets the context run.
 */
export class Capture {
  #stopLevel = null;

  constructor() {
    this.context = new AudioContext();
    this.stream = null;
  }

  /** Open the microphone; its source node, whose level goes to `onLevel`. */
  async open(onLevel) {
    this.stream = await openMicrophone();
    const source = this.context.createMediaStreamSource(this.stream);
    this.#stopLevel = watchLevel(this.context, source, onLevel);
    return source;
  }

  /** Release the microphone and the context (again: nothing). */
  close() {
    this.#stopLevel?.();
    this.#stopLevel = null;
    closeMicrophone(this.stream);
    if (this.context.state !== "closed") this.context.close();
  }
}

/**
 * Report the peak level (0..1) of `source` every 100 ms to `onLevel`; returns a function that stops.
 * An AnalyserNode, not the PCM worklet, so that both transports share it.
 */
export function watchLevel(context, source, onLevel) {
  const analyser = context.createAnalyser();
  analyser.fftSize = 2048;
  source.connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  const timer = setInterval(() => {
    analyser.getFloatTimeDomainData(samples);
    let peak = 0;
    for (const s of samples) peak = Math.max(peak, Math.abs(s));
    onLevel(peak);
  }, LEVEL_INTERVAL_MS);
  return () => {
    clearInterval(timer);
    source.disconnect(analyser);
    onLevel(0);
  };
}

// AudioWorklet processor: microphone audio at the context's rate (often 44.1 or 48 kHz)
// -> 16 kHz mono, Int16 little-endian frames posted to the main thread.
//
// Resampler quality choice: a windowed-sinc (band-limited) interpolator with the Kaiser window,
// not plain linear interpolation. Linear interpolation has no real low-pass, so 8-24 kHz content
// (fricatives, keyboard clicks, fan noise) would alias into the 0-8 kHz band Whisper listens to.
// Here the cutoff is 0.9 x 8 kHz = 7.2 kHz, the kernel spans 24 sinc zero crossings on each side
// and the window's beta gives about -85 dB stop band: flat to about 6.4 kHz, fully attenuated
// by about 8 kHz. At 48 kHz that is ~160 taps per output sample, about 2.6 M multiply-adds a
// second: far below what an audio thread can afford. The kernel is tabulated (TABLE_STEPS points
// per input sample, linearly interpolated) so no trigonometry runs per sample, and each output is
// divided by the sum of its taps so DC gain is exactly 1.
//
// State across blocks: unconsumed input (the kernel's history and look-ahead) and the fractional
// read position carry over from one 128-sample render quantum to the next, so the output is the
// same as resampling the whole stream at once. The stream starts with a kernel's width of zeros,
// so output sample n is aligned with input time n / 16000 s (no added offset to timestamps).

const OUT_RATE = 16000;
// 512 samples = 32 ms at 16 kHz: silero-vad's window, and within the 20-40 ms frames the
// server expects (fewer, larger WebSocket messages without adding noticeable latency).
const FRAME_SAMPLES = 512;
const ROLLOFF = 0.9; // cutoff as a fraction of the lower Nyquist frequency
const ZERO_CROSSINGS = 24; // kernel half-width, in zero crossings of the cutoff sinc
const KAISER_BETA = 8.6; // ~ -85 dB side lobes
const TABLE_STEPS = 128; // kernel table points per input sample

// Modified Bessel function of the first kind, order 0 (power series; converges fast for x < 20).
function besselI0(x) {
  let sum = 1;
  let term = 1;
  const q = (x * x) / 4;
  for (let k = 1; k < 50 && term > sum * 1e-12; k++) {
    term *= q / (k * k);
    sum += term;
  }
  return sum;
}

// Returns {table, halfWidth}: the kernel h(t) for t in input samples, sampled from -halfWidth to
// +halfWidth every 1 / TABLE_STEPS.
function makeKernel(inRate, outRate) {
  const cutoff = (ROLLOFF * Math.min(inRate, outRate)) / 2 / inRate; // cycles per input sample
  const halfWidth = ZERO_CROSSINGS / (2 * cutoff);
  const size = Math.ceil(2 * halfWidth * TABLE_STEPS) + 2;
  const table = new Float64Array(size);
  const i0Beta = besselI0(KAISER_BETA);
  for (let j = 0; j < size; j++) {
    const t = j / TABLE_STEPS - halfWidth;
    const x = t / halfWidth;
    if (Math.abs(x) > 1) continue;
    const arg = 2 * Math.PI * cutoff * t;
    const sinc = t === 0 ? 1 : Math.sin(arg) / arg;
    const window = besselI0(KAISER_BETA * Math.sqrt(1 - x * x)) / i0Beta;
    table[j] = 2 * cutoff * sinc * window;
  }
  return { table, halfWidth };
}

class Pcm16kWriter extends AudioWorkletProcessor {
  constructor() {
    super();
    // `sampleRate` is the AudioContext's rate, a global of the worklet scope.
    this.step = sampleRate / OUT_RATE; // input samples per output sample
    this.bypass = sampleRate === OUT_RATE;
    const { table, halfWidth } = makeKernel(sampleRate, OUT_RATE);
    this.table = table;
    this.halfWidth = halfWidth;
    const history = Math.ceil(halfWidth);
    this.buffer = new Float32Array(history + 4096);
    this.length = history; // zeros: the stream's "past"
    this.position = history; // read position of the next output sample, in buffer samples
    this.frame = new DataView(new ArrayBuffer(FRAME_SAMPLES * 2));
    this.frameFill = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (channels.length === 0) return true; // source not connected yet
    const n = channels[0].length;
    if (this.bypass) {
      for (let i = 0; i < n; i++) this.write(mix(channels, i));
      return true;
    }
    this.reserve(n);
    for (let i = 0; i < n; i++) this.buffer[this.length + i] = mix(channels, i);
    this.length += n;
    this.resample();
    return true;
  }

  reserve(n) {
    if (this.length + n <= this.buffer.length) return;
    const grown = new Float32Array(Math.max(2 * this.buffer.length, this.length + n));
    grown.set(this.buffer.subarray(0, this.length));
    this.buffer = grown;
  }

  resample() {
    const w = this.halfWidth;
    const last = this.length - 1;
    while (this.position + w <= last) {
      this.write(this.interpolate(this.position));
      this.position += this.step;
    }
    // Keep only what the next outputs still need: the kernel's left half before `position`.
    const drop = Math.floor(this.position - w);
    if (drop > 0) {
      this.buffer.copyWithin(0, drop, this.length);
      this.length -= drop;
      this.position -= drop;
    }
  }

  interpolate(p) {
    const w = this.halfWidth;
    const table = this.table;
    const first = Math.ceil(p - w);
    const last = Math.floor(p + w);
    let acc = 0;
    let weights = 0;
    for (let i = first; i <= last; i++) {
      const t = (i - p + w) * TABLE_STEPS;
      const k = t | 0;
      const h = table[k] + (t - k) * (table[k + 1] - table[k]);
      acc += this.buffer[i] * h;
      weights += h;
    }
    return acc / weights;
  }

  write(sample) {
    const clipped = sample > 1 ? 1 : sample < -1 ? -1 : sample;
    this.frame.setInt16(2 * this.frameFill, Math.round(clipped * 32767), true);
    this.frameFill += 1;
    if (this.frameFill === FRAME_SAMPLES) {
      const bytes = this.frame.buffer;
      this.port.postMessage(bytes, [bytes]);
      this.frame = new DataView(new ArrayBuffer(FRAME_SAMPLES * 2));
      this.frameFill = 0;
    }
  }
}

// Average of all channels at index i (the microphone may deliver stereo despite channelCount: 1).
function mix(channels, i) {
  if (channels.length === 1) return channels[0][i];
  let sum = 0;
  for (const channel of channels) sum += channel[i];
  return sum / channels.length;
}

registerProcessor("pcm16k-writer", Pcm16kWriter);

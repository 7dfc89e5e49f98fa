// The official openai Node SDK's two realtime clients against a streamer over TLS (tests/test_sdk_tls.py).
//   node --experimental-websocket realtime_clients.mjs BASE_URL API_KEY PCM24K_FILE
// BASE_URL is https://host:port/v1; NODE_EXTRA_CA_CERTS must name the server's certificate.
// Prints one JSON line: {"ws": {...}, "websocket": {...}}, per client the transcript and the
// session as session.created sent it.
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { OpenAIRealtimeWebSocket } from 'openai/realtime/websocket';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';

const [baseURL, apiKey, pcmPath] = process.argv.slice(2);
const pcm = readFileSync(pcmPath);
const CHUNK = 24000 * 2; // 1 s of 24-kHz PCM16

async function transcribe(rt) {
  const seen = { created: null, updated: null };
  const done = new Promise((resolve, reject) => {
    rt.on('session.created', (e) => { seen.created = e.session; });
    rt.on('session.updated', (e) => { seen.updated = e.session; });
    rt.on('conversation.item.input_audio_transcription.completed', (e) => resolve(e.transcript));
    rt.on('error', (e) => reject(new Error(JSON.stringify(e.error ?? e.message ?? e))));
  });
  const open = new Promise((resolve, reject) => {
    const socket = rt.socket;
    if (typeof socket.on === 'function') { socket.on('open', resolve); socket.on('error', reject); }
    else { socket.addEventListener('open', resolve); socket.addEventListener('error', () => reject(new Error('websocket error'))); }
  });
  await open;
  rt.send({ type: 'session.update', session: { type: 'transcription', audio: { input: {
    format: { type: 'audio/pcm', rate: 24000 }, transcription: { model: 'whisper-1', language: 'en' },
    turn_detection: null } } } });
  for (let i = 0; i < pcm.length; i += CHUNK) {
    rt.send({ type: 'input_audio_buffer.append', audio: pcm.subarray(i, i + CHUNK).toString('base64') });
  }
  rt.send({ type: 'input_audio_buffer.commit' });
  const transcript = await Promise.race([done, new Promise((_, reject) =>
    setTimeout(() => reject(new Error('no transcript within 120 s')), 120000))]);
  rt.close();
  return { transcript, created: seen.created, updated: seen.updated, subprotocol: rt.socket.protocol ?? null };
}

const client = new OpenAI({ apiKey, baseURL });
const out = {};
out.ws = await transcribe(new OpenAIRealtimeWS({ model: 'whisper-1' }, client));
out.websocket = await transcribe(new OpenAIRealtimeWebSocket({ model: 'whisper-1' }, client));
console.log(JSON.stringify(out));
process.exit(0);

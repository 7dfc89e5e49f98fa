"""The official SDKs' realtime clients over TLS, as they are documented (issue #13, item 9).

The Python SDK's realtime client uses `wss://` unless `websocket_base_url` is set, and the Node
SDK always does, so the server serves TLS (`SSL_CERTFILE`/`SSL_KEYFILE`) with a certificate made
here for 127.0.0.1. The Node SDK's browser-style `OpenAIRealtimeWebSocket` offers the
subprotocols `realtime` and `openai-insecure-api-key.KEY`: the server selects `realtime` and
takes the key from the other. The Node test runs where `node` and `tests/node/node_modules` are
(`make test` installs them) and is skipped with a message elsewhere.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import jiwer
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from openai import AsyncOpenAI
from openai.types.realtime import SessionCreatedEvent, SessionUpdatedEvent
from whisper_normalizer.english import EnglishTextNormalizer

from streamer.audio.decode import decode_audio
from streamer.config import load_settings
from streamer.server.app import create_app, running
from test_realtime import pcm24k

KEY = "sk-tls-test"
NODE_DIR = Path(__file__).resolve().parent / "node"
normalize = EnglishTextNormalizer()


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (its own CA); (cert, key) PEM paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "streamer test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls_server(engine, tmp_path_factory):
    """(https base URL, certificate path) of a TLS server with an API key."""
    cert, key = make_certificate(tmp_path_factory.mktemp("tls"))
    settings = load_settings({}, server={"api_key": KEY, "ssl_certfile": str(cert), "ssl_keyfile": str(key)})
    with running(create_app(settings, engine)) as base:
        assert base.startswith("https://")
        yield base, cert


PROMPT = "Please enter a new extension, followed by pound."


@pytest.fixture(scope="module")
def prompt24k(audio_dir) -> bytes:
    """A 3-s recording of `PROMPT` as 24-kHz PCM16 (a short one: three decodes on a CPU)."""
    return pcm24k(decode_audio(str(audio_dir / "en" / "asterisk" / "agent-newlocation.ogg")))


def test_python_sdk_realtime_over_tls(tls_server, prompt24k):
    base, cert = tls_server
    context = ssl.create_default_context(cafile=str(cert))

    async def run():
        async with AsyncOpenAI(api_key=KEY, base_url=base + "/v1", http_client=httpx.AsyncClient(verify=context)) \
                as client:  # closed: an idle keep-alive connection would hold the server's shutdown
            return await transcribe(client)

    async def transcribe(client):
        assert [m.id for m in (await client.models.list()).data] == ["tiny.en", "whisper-1"]  # HTTPS too
        async with client.realtime.connect(model="whisper-1", extra_query={"intent": "transcription"},
                                           websocket_connection_options={"ssl": context}) as connection:
            created = (await connection.recv()).to_dict()
            SessionCreatedEvent.model_validate(created)
            audio_input = created["session"]["audio"]["input"]
            assert "noise_reduction" not in audio_input and "language" not in audio_input["transcription"]
            await connection.session.update(session={"type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None,
                "transcription": {"model": "whisper-1", "language": "en"}}}})
            updated = (await connection.recv()).to_dict()
            SessionUpdatedEvent.model_validate(updated)
            assert updated["session"]["audio"]["input"]["transcription"]["language"] == "en"
            for i in range(0, len(prompt24k), 48000):
                await connection.input_audio_buffer.append(audio=base64.b64encode(prompt24k[i:i + 48000]).decode())
            await connection.input_audio_buffer.commit()
            async for event in connection:
                assert event.type != "error", event
                if event.type == "conversation.item.input_audio_transcription.completed":
                    return event.transcript
        return None

    transcript = asyncio.run(asyncio.wait_for(run(), 180))
    assert jiwer.wer(normalize(PROMPT), normalize(transcript)) < 0.2, transcript


def test_node_sdk_realtime_clients_over_tls(tls_server, prompt24k, tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (Debian: apt-get install nodejs npm); `make test` runs this test with it")
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        pytest.skip(f"the openai npm package is not installed: npm install --prefix {NODE_DIR} (`make test` does)")
    base, cert = tls_server
    pcm = tmp_path / "prompt24k.pcm"
    pcm.write_bytes(prompt24k)
    env = {**os.environ, "NODE_EXTRA_CA_CERTS": str(cert)}
    done = subprocess.run([node, "--experimental-websocket", "--no-warnings", str(NODE_DIR / "realtime_clients.mjs"),
                           base + "/v1", KEY, str(pcm)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["websocket"]["subprotocol"] == "realtime"  # the browser-style client's handshake
    for name in ("ws", "websocket"):
        result = results[name]
        assert jiwer.wer(normalize(PROMPT), normalize(result["transcript"])) < 0.2, (name, result["transcript"])
        audio_input = result["created"]["audio"]["input"]
        assert "noise_reduction" not in audio_input and "language" not in audio_input["transcription"], audio_input

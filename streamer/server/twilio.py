"""Twilio Media Streams: `WS /v1/twilio` takes Twilio's messages (docs/protocol.md, section 7),
and `WS /v1/twilio/events` hands the transcripts to the pipeline that subscribes to the call.

Twilio's socket carries only Twilio's own messages (on a bidirectional stream, what goes back to
Twilio is audio to play), so transcripts leave on a second socket: a subscriber names the call by
`streamSid` or `callSid` and gets `/v1/stream`-style events, each tagged with `channel` (0 for the
`inbound` track, the caller; 1 for `outbound`) and `track`. Each track has its own VAD, utterances
and finals (`ChannelStreams`, multichannel). A subscriber may connect before the stream starts;
it first gets every event of the call so far.

Twilio's messages and the subscribers' are `protocols/twilio.py`'s `TwilioProtocol`; here are the
transports: `TwilioStream` (Twilio's socket: hands each message to the protocol and carries out
its answer), the subscriber endpoint, and `TwilioHub` (in `ServerState.twilio`), which joins
streams and subscribers.

With several gateway workers the kernel may give the subscriber to another worker than Twilio's
socket. The worker holding a call writes its `streamSid` and `callSid` down in the run directory
(`Peers.claim`); a subscriber that lands elsewhere is relayed to that worker (`server/relay.py`),
at once when the call has started, else as soon as it does (a waiting subscriber looks every
`OWNER_POLL_S`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from dataclasses import dataclass, field
from urllib.parse import quote

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from streamer.config import model_id
from streamer.protocols.outputs import Close, Send
from streamer.protocols.twilio import RATE, TRACKS, Media, Output, Start, Stop, TwilioProtocol
from streamer.server.auth import authorized, presented_key
from streamer.server.bridge import Bridge, StreamEvent
from streamer.server.channels import ChannelStreams
from streamer.server.relay import Peers, pipe, relayed
from streamer.server.socket_stream import Outbox, SocketStream, to_protocol
from streamer.server.state import ServerState
from streamer.streaming.session import Session

log = logging.getLogger("streamer.server")

FEED_KEEP_S = 60.0
"""A finished call's events stay this long for subscribers that connect late."""
OWNER_POLL_S = 0.25
"""How often a subscriber waiting for its call looks whether another gateway worker has it: the
first events reach it this much later at most (it gets the call's history on joining)."""
OWNER_KIND = "twilio"
"""The kind of name `Peers` keeps for a call."""


@dataclass
class Feed:
    """The events of one call for its subscribers."""

    history: list[dict] = field(default_factory=list)
    subscribers: set[Outbox] = field(default_factory=set)
    done: bool = False

    def publish(self, message: dict) -> None:
        self.history.append(message)
        for outbox in self.subscribers:
            outbox.send(message)

    def end(self) -> None:
        self.done = True
        for outbox in self.subscribers:
            outbox.close(1000)
        self.subscribers.clear()


class TwilioHub:
    """Feeds by `streamSid` and `callSid` (a subscriber may know either); with `peers`, the
    calls of this worker are named where the other workers look (`Peers.owner`)."""

    def __init__(self, peers: Peers | None = None) -> None:
        self.feeds: dict[str, Feed] = {}
        self.peers = peers

    def feed(self, key: str) -> Feed:
        return self.feeds.setdefault(key, Feed())

    def join(self, keys: list[str]) -> Feed:
        """One feed under all `keys`, taking over the subscribers that waited under any of them."""
        feed = Feed()
        for key in keys:
            waiting = self.feeds.get(key)
            if waiting is not None and not waiting.done:
                feed.subscribers |= waiting.subscribers
            self.feeds[key] = feed
            if self.peers is not None:
                self.peers.claim(OWNER_KIND, key)
        return feed

    def forget(self, keys: list[str], feed: Feed) -> None:
        for key in keys:
            if self.feeds.get(key) is feed:
                del self.feeds[key]
                if self.peers is not None:
                    self.peers.release(OWNER_KIND, key)

    def owner(self, key: str) -> int | None:
        """The other worker that holds the call `key`, if one does."""
        if self.peers is None:
            return None
        owner = self.peers.owner(OWNER_KIND, key)
        return owner if owner is not None and self.peers.reachable(owner) else None


def hub(state: ServerState) -> TwilioHub:
    if "hub" not in state.twilio:
        state.twilio["hub"] = TwilioHub(Peers.of(state.settings.server))
    return state.twilio["hub"]


class TwilioStream(SocketStream):
    """One Twilio Media Stream."""

    transport = "twilio"

    def __init__(self, ws: WebSocket, state: ServerState):
        super().__init__(ws, state, secrets.token_hex(8))
        self._protocol = TwilioProtocol(state.settings.server.max_message_bytes)
        self._channels: ChannelStreams | None = None
        self._feed: Feed | None = None
        self._keys: list[str] = []

    def _authorized(self) -> bool:
        return True  # Twilio sends no headers of ours: the key comes as a <Parameter> in `start`

    def _refuse(self, kind: str, message: str, close_code: int, retry_after_s: float | None = None) -> None:
        self._outbox.close(close_code)

    def _publish(self, message: dict) -> None:
        """A message for the call's subscribers (none before the call's `start`)."""
        if message.get("type") == "error":
            self.state.metrics.errors.labels(message["code"]).inc()
        if self._feed is not None:
            self._feed.publish(message)

    async def _serve(self) -> None:
        self._receiver = asyncio.ensure_future(self._receive_loop())
        await asyncio.wait([self._receiver])
        reason = "shutdown" if self._receiver.cancelled() else self._receiver.result()
        if self._channels is not None:
            # The call's audio is complete even when Twilio just closed the socket: finish it.
            await self._channels.finish(self._finish_within(reason))
        if reason == "disconnect":
            self._outbox.abandon()
        self._carry_out(self._protocol.close(reason))
        if self._feed is not None:
            self._feed.end()
            feed, keys = self._feed, self._keys
            asyncio.get_running_loop().call_later(FEED_KEEP_S, hub(self.state).forget, keys, feed)

    async def _receive_loop(self) -> str:
        """Hand Twilio's messages to the protocol until the stream ends; returns why: stop,
        error, idle_timeout, no_audio or disconnect."""
        while True:
            message = await self._next_message()
            if isinstance(message, str):
                return message
            end = self._carry_out(to_protocol(self._protocol, message))
            if end is not None:
                return end

    def _carry_out(self, outputs: list[Output]) -> str | None:
        """Do what the protocol answered; returns why the stream ends (`stop`, or `error`), else None."""
        for out in outputs:
            if isinstance(out, Send):
                self._publish(out.message)
            elif isinstance(out, Close):
                self._outbox.close(out.code)  # after an `abandon` (Twilio hung up), nothing is sent
                return "error"
            elif isinstance(out, Media):
                self.audio_seen = True
                if out.audio:
                    self._channels.push_channel(out.channel, out.audio)
            elif isinstance(out, Start):
                if not self._on_start(out):
                    return "error"
                self._carry_out(self._protocol.started(model_id(self.state.engine.model_name)))
            elif isinstance(out, Stop):
                return "stop"
        return None

    def _on_start(self, start: Start) -> bool:
        """The key check (Twilio's `<Parameter name="api_key">`, or the connection's own), the
        call's feed and its tracks' bridges; False when refused."""
        key = self.state.settings.server.api_key
        given = start.custom_parameters.get("api_key")
        if key and not authorized(self.ws.scope, key) and not (
                isinstance(given, str) and hmac.compare_digest(given.encode(), key.encode())):
            log.warning("twilio %s: refused (no or wrong api_key parameter)", start.stream_sid)
            return False
        self._keys = [k for k in (start.stream_sid, start.call_sid) if k]
        self._feed = hub(self.state).join(self._keys)
        streaming = self.state.settings.streaming
        language = streaming.language if self.state.engine.tokenizer.multilingual else "en"

        def make_bridge(channel: int | None) -> Bridge:
            def emit(event: StreamEvent) -> None:
                self._carry_out(self._protocol.on_event(event, channel))

            return self.state.bridge(Session(streaming, self.state.vad), emit, session_id=self.session_id,
                                     language=language, task=streaming.task)

        self._channels = ChannelStreams(rate=RATE, channels=len(TRACKS), encoding="mulaw", multichannel=True,
                                        make_bridge=make_bridge)
        return True


async def twilio_endpoint(ws: WebSocket) -> None:
    await TwilioStream(ws, ws.app.state.streamer).run()


async def events_endpoint(ws: WebSocket) -> None:
    """`WS /v1/twilio/events?streamSid=MZ...` (or `?callSid=CA...`): one call's transcript events."""
    state: ServerState = ws.app.state.streamer
    await ws.accept()
    outbox = Outbox(ws)
    name = "streamSid" if ws.query_params.get("streamSid") else "callSid"
    key = ws.query_params.get(name)
    if not authorized(ws.scope, state.settings.server.api_key):
        outbox.send({"type": "error", "code": "unauthorized", "message": "missing or wrong API key"})
        outbox.close(1008)
    elif not key:
        outbox.send({"type": "error", "code": "bad_field", "message": "name the call: ?streamSid=... or ?callSid=...",
                     "field": "streamSid"})
        outbox.close(1008)
    else:
        outbox.send({"type": "subscribed", "key": key})
        owner = await _follow(ws, state, key, outbox)
        if owner is not None:
            upstream = await hub(state).peers.connect(owner, f"/v1/twilio/events?{name}={quote(key)}",
                                                      presented_key(ws.scope))
            if upstream is not None:
                outbox.abandon()
                await outbox.flushed(state.settings.server.finish_timeout_s)
                await pipe(ws, upstream, drop_first="subscribed",
                           send_timeout_s=state.settings.server.send_timeout_s)
                return
            outbox.send({"type": "error", "code": "internal",
                         "message": f"gateway worker {owner}, which holds the call, does not answer"})
            outbox.send({"type": "closed", "reason": "error"})
            outbox.close(1011)
    await outbox.wait(state.settings.server.finish_timeout_s)


async def _follow(ws: WebSocket, state: ServerState, key: str, outbox: Outbox) -> int | None:
    """Serve a subscriber from this worker's feed of `key` until the client goes or the call
    ends (the feed closes the outbox); or return the worker to relay it to, when another holds
    the call (a relayed subscriber is served here, whatever the names say)."""
    calls = hub(state)
    follow_peers = calls.peers is not None and not relayed(ws)
    if follow_peers and (owner := calls.owner(key)) is not None:
        return owner
    feed = calls.feed(key)
    for message in feed.history:
        outbox.send(message)
    if feed.done:
        outbox.close(1000)
        return None
    feed.subscribers.add(outbox)
    loop = asyncio.get_running_loop()
    idle_s = state.settings.server.idle_timeout_s
    give_up = loop.time() + idle_s
    receiving = asyncio.ensure_future(ws.receive())
    try:
        while True:  # a subscriber only listens: its messages only keep it from idling out
            current = calls.feeds.get(key)
            here = current is not None and bool(current.history)
            wait = give_up - loop.time()
            if not here and follow_peers:
                wait = min(wait, OWNER_POLL_S)
            done, _ = await asyncio.wait([receiving], timeout=max(0.0, wait))
            if done:
                try:
                    message = receiving.result()
                except RuntimeError:  # the feed closed the socket
                    return None
                if message["type"] == "websocket.disconnect":
                    return None
                receiving = asyncio.ensure_future(ws.receive())
                give_up = loop.time() + idle_s
                continue
            if not here and follow_peers and (owner := calls.owner(key)) is not None:
                return owner
            if loop.time() >= give_up:
                if here:  # the call is on
                    give_up = loop.time() + idle_s
                    continue
                outbox.send({"type": "closed", "reason": "idle_timeout"})  # no such call came
                outbox.close(1000)
                return None
    finally:
        receiving.cancel()
        current = calls.feeds.get(key)
        for f in (feed, current):
            if f is not None:
                f.subscribers.discard(outbox)
        if not feed.history and not feed.done and calls.feeds.get(key) is feed and not feed.subscribers:
            del calls.feeds[key]


routes = [
    WebSocketRoute("/v1/twilio", twilio_endpoint),
    WebSocketRoute("/v1/twilio/events", events_endpoint),
]

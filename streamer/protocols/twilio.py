"""Twilio Media Streams (docs/protocol.md, section 7) with no I/O.

`TwilioProtocol` is one `WS /v1/twilio` connection. Twilio's messages in (`receive_text`,
`receive_bytes`); out come commands for the transport (`Start`, `Media`, `Stop`), messages for
the call's subscribers on `/v1/twilio/events` (`Send`: Twilio's own socket carries only audio
back, so nothing of ours goes to it) and the end of Twilio's socket (`Close`). The transport
checks the key of a `Start`, joins the call's feed and reports back with `started(model)`; the
bridges' events come back through `on_event(event, channel)`; at the end, `close(reason)`.

Subscribers get `/v1/stream`-style events, each tagged with `channel` (0 for the `inbound`
track, the caller; 1 for `outbound`) and `track`, and Twilio's `dtmf` and `mark` with `t`, the
call time they came at.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Union

from streamer.protocols.native import event_dict
from streamer.protocols.outputs import Close, Send
from streamer.streaming.live import Finalized, StreamEvent

TRACKS = {"inbound": 0, "outbound": 1}
"""Twilio track -> channel. `dtmf` names tracks `inbound_track`/`outbound_track`."""
RATE = 8000
"""Twilio streams μ-law at 8 kHz, one byte per sample, one channel per track."""
MEDIA_FORMAT = ("audio/x-mulaw", RATE, 1)
"""The only `mediaFormat` (encoding, sampleRate, channels) Twilio sends."""


class TwilioError(Exception):
    """A Twilio message this server cannot use: `code` as on the subscriber socket; a `fatal`
    one ends the stream."""

    def __init__(self, code: str, message: str, fatal: bool = False):
        super().__init__(message)
        self.code, self.message, self.fatal = code, message, fatal

    def event(self) -> dict:
        return {"type": "error", "code": self.code, "message": self.message}


# --- what the protocol tells the transport --------------------------------------------------------

@dataclass(frozen=True)
class Start:
    """Twilio's `start`: check the key in `custom_parameters`, join the call's feed, build the
    tracks' bridges, then call `started` (or end the stream)."""

    stream_sid: str
    call_sid: str | None
    account_sid: str | None
    tracks: list[str]
    custom_parameters: dict
    media_format: dict


@dataclass(frozen=True)
class Media:
    """μ-law audio of one track (`channel`); may be empty."""

    channel: int
    track: str
    audio: bytes


@dataclass(frozen=True)
class Stop:
    """The call ended: finish the tracks' finals, then `close("stop")`."""


Output = Union[Send, Close, Start, Media, Stop]


class TwilioProtocol:
    """One Twilio Media Stream's protocol state."""

    def __init__(self, max_message_bytes: int | None = None) -> None:
        self.max_message_bytes = max_message_bytes
        self.call: Start | None = None
        """The call's `start`, once it came."""
        self.ended = False
        """A fatal error closed Twilio's socket: nothing more is taken."""
        self._samples = [0] * len(TRACKS)
        """μ-law samples taken per track (one byte each)."""

    @property
    def time(self) -> float:
        """Call time: seconds of audio on the longest track so far."""
        return max(self._samples) / RATE

    # --- Twilio's messages ------------------------------------------------------------------------

    def receive_bytes(self, data: bytes) -> list[Output]:
        if self.ended:
            return []
        return [Send(TwilioError("bad_message", "Twilio sends JSON text messages under the size limit").event())]

    def receive_text(self, text: str) -> list[Output]:
        if self.ended:
            return []
        limit = self.max_message_bytes
        if limit is not None and len(text.encode()) > limit:
            return self.receive_bytes(b"")
        try:
            return self._receive(text)
        except TwilioError as e:
            if not e.fatal:
                return [Send(e.event())]
            self.ended = True
            return [Send(e.event()), Close(1008)]

    def _receive(self, text: str) -> list[Output]:
        try:
            msg = json.loads(text)
        except ValueError:
            raise TwilioError("bad_json", "a Twilio message must be JSON") from None
        if not isinstance(msg, dict) or not isinstance(msg.get("event"), str):
            raise TwilioError("unknown_event", "a Twilio message needs a string `event`")
        kind = msg["event"]
        if kind == "connected":
            return []
        if kind == "start":
            return [self._start(msg)]
        if self.call is None:
            raise TwilioError("not_started", f"`{kind}` before `start`")
        if kind == "media":
            return [self._media(msg.get("media"))]
        if kind == "dtmf":
            dtmf = msg.get("dtmf") if isinstance(msg.get("dtmf"), dict) else {}
            return [Send({"type": "dtmf", "digit": dtmf.get("digit"), "track": dtmf.get("track"),
                          "t": round(self.time, 3)})]
        if kind == "mark":
            mark = msg.get("mark") if isinstance(msg.get("mark"), dict) else {}
            return [Send({"type": "mark", "name": mark.get("name"), "t": round(self.time, 3)})]
        if kind == "stop":
            return [Stop()]
        raise TwilioError("unknown_event", f"unknown Twilio event {kind!r}")

    def _start(self, msg: dict) -> Start:
        if self.call is not None:
            raise TwilioError("already_started", "a second `start`")
        start = msg.get("start")
        if not isinstance(start, dict):
            raise TwilioError("bad_start", "`start` must be an object", fatal=True)
        sid = start.get("streamSid") or msg.get("streamSid")
        if not isinstance(sid, str) or not sid:
            raise TwilioError("bad_start", "`start.streamSid` is missing", fatal=True)
        tracks = start.get("tracks") or ["inbound"]
        if not isinstance(tracks, list) or not tracks or any(t not in TRACKS for t in tracks):
            raise TwilioError("bad_start", f"`start.tracks` must list inbound and/or outbound, not {tracks!r}",
                              fatal=True)
        fmt = start.get("mediaFormat") or {}
        given = (fmt.get("encoding", MEDIA_FORMAT[0]), fmt.get("sampleRate", RATE), fmt.get("channels", 1))
        if given != MEDIA_FORMAT:
            raise TwilioError("bad_start", "mediaFormat must be audio/x-mulaw, 8000 Hz, 1 channel, not "
                                           f"{', '.join(map(str, given))}", fatal=True)
        params = start.get("customParameters") if isinstance(start.get("customParameters"), dict) else {}
        self.call = Start(sid, start.get("callSid"), start.get("accountSid"), list(tracks), params, fmt)
        return self.call

    def _media(self, media) -> Media:
        if not isinstance(media, dict) or not isinstance(media.get("payload"), str):
            raise TwilioError("bad_media", "`media.payload` must be base64 μ-law")
        track = media.get("track", "inbound")
        if track not in TRACKS:
            raise TwilioError("bad_media", f"unknown track {track!r} (inbound, outbound)")
        try:
            audio = base64.b64decode(media["payload"], validate=True)
        except (binascii.Error, ValueError):
            raise TwilioError("bad_media", "`media.payload` is not valid base64") from None
        self._samples[TRACKS[track]] += len(audio)
        return Media(TRACKS[track], track, audio)

    # --- what the transport reports ---------------------------------------------------------------

    def started(self, model: str) -> list[Output]:
        """The `start` was accepted: the subscribers' `start` (the key is not passed on)."""
        start = self.call
        params = {k: v for k, v in start.custom_parameters.items() if k != "api_key"}
        return [Send({"type": "start", "streamSid": start.stream_sid, "callSid": start.call_sid,
                      "tracks": start.tracks, "customParameters": params, "model": model})]

    def on_event(self, event: StreamEvent, channel: int) -> list[Output]:
        """A bridge event of a track -> the subscribers' message, tagged with the channel and track."""
        if isinstance(event, Finalized) and event.error is not None:
            return [Send({"type": "error", "code": "internal", "message": event.error, "channel": channel})]
        message = event_dict(event)
        if message is None:
            return []
        track = next(t for t, c in TRACKS.items() if c == channel)
        return [Send({**message, "channel": channel, "track": track})]

    def close(self, reason: str) -> list[Output]:
        """The stream ended (`reason`: stop, disconnect, shutdown, idle_timeout, no_audio, error):
        the subscribers' `closed` (a hang-up is a `stop`) and the close code for Twilio's socket."""
        said = "stop" if reason in ("stop", "disconnect") else reason
        out: list[Output] = [Send({"type": "closed", "reason": said})]
        if not self.ended:
            self.ended = True
            out.append(Close({"shutdown": 1001, "error": 1008}.get(reason, 1000)))
        return out

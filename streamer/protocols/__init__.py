"""Wire protocols as state machines with no I/O (python-websockets' `Protocol`): client messages
in, messages for the client and commands for the transport out; the events of a stream's bridges
in, messages out. The transports in `streamer/server/` (WebSocket, WebRTC) own the sockets, the
tasks, the engine and the bridges, and carry out what a protocol answers.

- `outputs.py`: `Send` (a message for the client) and `Close` (the end), which every protocol answers.
- `validation.py`: every client value of every protocol, checked one way.
- `start.py`: the native `start` message (`StartOptions`), shared by `/v1/stream` and WebRTC's offer.
- `native.py`: `NativeProtocol` (`/v1/stream`), `DataChannelProtocol` (WebRTC's `events`
  channel), `SessionLog` (event ids and replay for a resume), `session_message`.
- `realtime_session.py`: a Realtime session's configuration (`session.update` in both shapes).
- `realtime.py`: `RealtimeProtocol` (`/v1/realtime`): items, their ordering and segmentations.
- `deepgram.py`: `ListenProtocol` (`WS /v1/listen`), its query parameters, the pre-recorded response.
- `twilio.py`: `TwilioProtocol` (`WS /v1/twilio`): Twilio's messages, the call's subscribers' messages.

Imports: `server -> protocols -> streaming`; nothing here imports `server`.
"""

"""A transcript in the response formats of OpenAI's audio endpoints: json, text, srt, vtt, verbose_json."""

from __future__ import annotations

from streamer.longform.transcript import Transcript
from streamer.model.tokenizer import LANGUAGES

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
MEDIA_TYPES = {"json": "application/json", "verbose_json": "application/json",
               "text": "text/plain; charset=utf-8", "srt": "application/x-subrip; charset=utf-8",
               "vtt": "text/vtt; charset=utf-8"}


def to_json(transcript: Transcript) -> dict:
    if transcript.channel_texts is not None:
        return {"text": transcript.text,
                "channels": [{"channel": c, "text": text} for c, text in enumerate(transcript.channel_texts)]}
    return {"text": transcript.text}


def to_text(transcript: Transcript) -> str:
    return transcript.text + "\n"


def to_verbose_json(transcript: Transcript, *, segments: bool = True, words: bool = False) -> dict:
    """OpenAI's verbose shape: `language` is the full lower-case name ("english"), times in seconds."""
    body: dict = {
        "task": transcript.task,
        "language": LANGUAGES.get(transcript.language or "", transcript.language or ""),
        "duration": transcript.duration,
        "text": transcript.text,
    }
    if segments:
        body["segments"] = [
            {"id": s.id, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text, "tokens": s.tokens,
             "temperature": s.temperature, "avg_logprob": s.avg_logprob, "compression_ratio": s.compression_ratio,
             "no_speech_prob": s.no_speech_prob, **_channel(s)}
            for s in transcript.segments]
    if words:
        body["words"] = [{"word": w.word.strip(), "start": w.start, "end": w.end, **_channel(s)}
                         for s in transcript.segments for w in (s.words or [])]
    if transcript.channel_texts is not None:
        body["channels"] = [{"channel": c, "text": text} for c, text in enumerate(transcript.channel_texts)]
    return body


def _channel(segment) -> dict:
    return {} if segment.channel is None else {"channel": segment.channel}


def to_srt(transcript: Transcript) -> str:
    """SubRip: numbered cues from 1, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, a blank line after each."""
    # "-->" inside a cue's text would read as a timing line to a subtitle parser.
    cues = [f"{i}\n{_clock(start, ',')} --> {_clock(end, ',')}\n"
            f"{'' if speaker is None else f'[{speaker}] '}{text.replace('-->', '->')}\n"
            for i, (start, end, text, speaker) in enumerate(_cues(transcript), start=1)]
    return "\n".join(cues)


def to_vtt(transcript: Transcript) -> str:
    """WebVTT: the `WEBVTT` header, then `HH:MM:SS.mmm --> HH:MM:SS.mmm` cues. Cue text is markup
    there, so &, < and > are escaped (as streamer/web/subtitles.js does); the voice span is ours."""
    cues = [f"{_clock(start, '.')} --> {_clock(end, '.')}\n{'' if speaker is None else f'<v {speaker}>'}"
            f"{text.replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;')}\n"
            for start, end, text, speaker in _cues(transcript)]
    return "\n".join(["WEBVTT\n", *cues])


def render(transcript: Transcript, response_format: str, *, segments: bool = True, words: bool = False) -> str | dict:
    """The body for `response_format`: a dict for the JSON formats, text for the others."""
    if response_format == "json":
        return to_json(transcript)
    if response_format == "verbose_json":
        return to_verbose_json(transcript, segments=segments, words=words)
    if response_format == "text":
        return to_text(transcript)
    if response_format == "srt":
        return to_srt(transcript)
    if response_format == "vtt":
        return to_vtt(transcript)
    raise ValueError(f"response_format must be one of {', '.join(FORMATS)}, not {response_format!r}")


def _cues(transcript: Transcript) -> list[tuple[float, float, str, str | None]]:
    """(start, end, text, speaker): the speaker of a multichannel transcript is `Channel N`
    (SRT: a `[Channel N] ` prefix; WebVTT: a `<v Channel N>` voice span)."""
    # One line of text per cue: a blank line inside a cue would end it early in both formats.
    return [(s.start, s.end, " ".join(s.text.split()), None if s.channel is None else f"Channel {s.channel}")
            for s in transcript.segments if s.text.strip()]


def _clock(seconds: float, decimal: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"

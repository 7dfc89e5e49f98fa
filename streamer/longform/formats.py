"""A transcript in the response formats of OpenAI's audio endpoints: json, text, srt, vtt, verbose_json."""

from __future__ import annotations

from streamer.longform.transcript import Transcript
from streamer.model.tokenizer import LANGUAGES

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
MEDIA_TYPES = {"json": "application/json", "verbose_json": "application/json",
               "text": "text/plain; charset=utf-8", "srt": "application/x-subrip; charset=utf-8",
               "vtt": "text/vtt; charset=utf-8"}


def to_json(transcript: Transcript) -> dict:
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
             "no_speech_prob": s.no_speech_prob}
            for s in transcript.segments]
    if words:
        body["words"] = [{"word": w.word.strip(), "start": w.start, "end": w.end} for w in transcript.words]
    return body


def to_srt(transcript: Transcript) -> str:
    """SubRip: numbered cues from 1, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, a blank line after each."""
    cues = [f"{i}\n{_clock(start, ',')} --> {_clock(end, ',')}\n{text}\n"
            for i, (start, end, text) in enumerate(_cues(transcript), start=1)]
    return "\n".join(cues)


def to_vtt(transcript: Transcript) -> str:
    """WebVTT: the `WEBVTT` header, then `HH:MM:SS.mmm --> HH:MM:SS.mmm` cues."""
    cues = [f"{_clock(start, '.')} --> {_clock(end, '.')}\n{text}\n" for start, end, text in _cues(transcript)]
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


def _cues(transcript: Transcript) -> list[tuple[float, float, str]]:
    # "-->" inside a cue's text would read as a timing line to a subtitle parser.
    return [(s.start, s.end, s.text.strip().replace("-->", "->")) for s in transcript.segments if s.text.strip()]


def _clock(seconds: float, decimal: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"

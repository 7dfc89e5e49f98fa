"""The decoded upload audio a gateway worker holds at once, bounded in seconds.

`MAX_UPLOAD_MB` bounds an upload's compressed bytes and `MAX_AUDIO_S` its length, but not how
many long uploads a gateway holds together: each 4-hour upload keeps 0.92 GB of float32 samples
for the whole of its transcription (minutes), about 2 GB at its peak (docs/notes/mem32.md).
`UploadBudget.reserve(seconds)` takes an upload's share once its duration is known (after the
decode: the decoder pool's size already bounds the decodes in flight) and refuses one that does not
fit; the `Hold` it returns is released when the upload lets its samples go, whatever happens.
No I/O: the endpoints turn a refusal into their 429 or 413.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

DEFAULT_UPLOADS = 3
"""`UPLOAD_AUDIO_BUDGET_S` unset: three uploads of `MAX_AUDIO_S` at once (4 h each: 2.8 GB of float32
held, 6 GB at worst for a moment); more wait for a retry."""
RETRY_AFTER_S = 10
"""Retry-After of a refusal: the budget cannot know when the uploads it holds end (a 4-h upload takes
minutes to transcribe, an 11-s one a second); the SDKs retry (twice by default) after this long."""


def budget_seconds(budget_s: float | None, max_audio_s: float) -> float:
    """The budget a gateway worker applies: the setting, else `DEFAULT_UPLOADS` x `max_audio_s`."""
    return budget_s if budget_s is not None else DEFAULT_UPLOADS * max_audio_s


@dataclass(frozen=True)
class Refusal:
    """Why an upload's audio does not fit now."""

    message: str
    retry: bool
    """True: it fits once others end (429, Retry-After); False: it never fits (413)."""


class Hold:
    """One upload's reservation; `release()` gives it back (once; later calls do nothing)."""

    def __init__(self, budget: UploadBudget, seconds: float):
        self.seconds = seconds
        self._budget: UploadBudget | None = budget

    def release(self) -> None:
        if self._budget is not None:
            self._budget._give_back(self.seconds)
            self._budget = None


class UploadBudget:
    """Seconds of decoded upload audio held by this gateway worker's requests (event loop only)."""

    def __init__(self, limit_s: float, on_change: Callable[[float], None] | None = None):
        """`limit_s`: the most held at once; `on_change(held_s)` after every change (a gauge)."""
        self.limit_s = limit_s
        self.held_s = 0.0
        self.holds = 0
        self._on_change = on_change

    def reserve(self, seconds: float) -> Hold | Refusal:
        """A hold on `seconds` of audio (channels count apiece: each is held as samples), or why not.
        An upload alone always fits unless it is over the whole budget."""
        if seconds > self.limit_s:
            return Refusal(f"the recording is {seconds:.0f} s of audio (all channels), more than the "
                           f"{self.limit_s:g} s this server holds at once", retry=False)
        if self.held_s + seconds > self.limit_s:
            return Refusal(f"the server holds {self.held_s:.0f} s of other uploads' audio and this one's "
                           f"{seconds:.0f} s would pass its {self.limit_s:g} s limit; try again shortly", retry=True)
        self.held_s += seconds
        self.holds += 1
        self._changed()
        return Hold(self, seconds)

    def _give_back(self, seconds: float) -> None:
        self.holds -= 1
        self.held_s = self.held_s - seconds if self.holds else 0.0  # no float residue once all are back
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.held_s)

"""Which part of a partial hypothesis will not change: local agreement between successive ones.

Each partial re-transcribes the utterance from its start, so the text near the end is the least
settled (a word cut in half, a phrase not yet heard). A word prefix on which the last two
hypotheses agree is taken as stable (LocalAgreement-2 of Macháček et al., "Turning Whisper into
Real-Time Transcription System", 2023).

Policy: the stable text of an utterance only grows. Once words are stable they are kept as
first seen, even if a later hypothesis revises them; such a hypothesis extends nothing until
hypotheses agree with the stable words again, and its words past as many units as are
stable are shown as the unstable tail. The final transcript replaces all of it.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# Scripts written without spaces: each character is a unit, so agreement can grow inside a
# sentence. Han, Hiragana, Katakana (Hangul is written with spaces).
_CHAR_SCRIPTS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_UNIT = re.compile(rf"\s*(?:[{_CHAR_SCRIPTS}]|[^\s{_CHAR_SCRIPTS}]+)")


def split_units(text: str) -> list[str]:
    """Words (or characters of scripts without spaces), each with its leading whitespace,
    so that `"".join(split_units(t)) == t` up to trailing whitespace."""
    return _UNIT.findall(text)


def unit_key(unit: str) -> str:
    """Comparison form: case and punctuation do not count ("Hello," equals "hello")."""
    folded = unit.strip().casefold()
    key = "".join(ch for ch in folded if unicodedata.category(ch)[0] not in "PS")
    return key or folded


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Stabilized:
    """One hypothesis split into its stable prefix and unstable tail: `text == stable + unstable`."""

    text: str
    stable: str
    unstable: str


class LocalAgreement:
    """Stable prefix of the successive hypotheses of one utterance; new one per utterance."""

    def __init__(self) -> None:
        self._stable: list[str] = []
        """Stable units, as first seen (with leading whitespace)."""
        self._stable_keys: list[str] = []
        self._previous: list[str] | None = None
        """Keys of the previous hypothesis."""

    def update(self, text: str) -> Stabilized:
        """Take the next hypothesis (the utterance so far, transcribed again)."""
        units = split_units(text)
        keys = [unit_key(u) for u in units]
        n = len(self._stable)
        if self._previous is not None and keys[:n] == self._stable_keys:
            agreed = _common_prefix(self._previous, keys)
            if agreed > n:
                self._stable += units[n:agreed]
                self._stable_keys += keys[n:agreed]
        self._previous = keys
        stable = "".join(self._stable).lstrip()
        # The space between the parts starts `unstable`: `stable` then only ever gains
        # characters at its end, so a client can append what is new.
        tail = "".join(units[len(self._stable) :]).rstrip()
        unstable = tail if stable else tail.lstrip()
        return Stabilized(text=stable + unstable, stable=stable, unstable=unstable)

"""What every protocol answers besides its own commands: a message for the client, and the end
of the connection."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Send:
    """A message for the client."""

    message: dict


@dataclass(frozen=True)
class Close:
    """Close the connection with `code` once what was sent has left; read nothing more."""

    code: int

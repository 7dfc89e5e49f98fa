"""Why a window did not come back with a result; shared by the in-process engine and the client
of engine core processes (no torch here)."""


class EngineClosed(RuntimeError):
    """The engine is shutting down and takes no new work."""


class Cancelled(Exception):
    """The request was cancelled, replaced by a newer partial, or preempted by a final."""


class EngineUnavailable(RuntimeError):
    """The engine core holding the window stopped or restarted (the window is lost), or no core
    is up to take new work. Retrying later may succeed: the supervisor restarts cores."""

"""Podium's error tree.

Every error Podium raises on purpose derives from :class:`PodiumError`. The ``retriable``
flag tells callers (consumer loops, gRPC handlers, the CLI) whether trying the same thing
again may succeed: a broker that is briefly unreachable is retriable, a malformed protobuf
is not and goes to the dead-letter topic instead.
"""

from __future__ import annotations


class PodiumError(Exception):
    """Base of all Podium errors."""

    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class ConfigError(PodiumError):
    """A setting is missing or invalid. The message names the setting."""


class DecodeError(PodiumError):
    """Bytes could not be turned into the expected message (never retriable)."""


class SpecError(PodiumError):
    """A task or pool spec is invalid. ``field`` names the offending field or subtask."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class BusError(PodiumError):
    """The event bus failed to publish, fetch or commit."""

    retriable = True


class ProcessingError(PodiumError):
    """A handler failed on a well-formed message."""


class ArtifactError(PodiumError):
    """A weight or model file is missing, corrupt or fails its sha256 check."""


class AdmissionError(PodiumError):
    """A request was refused because a capacity limit is reached; ``limit`` names the setting.

    Retriable: the same request may be admitted once sessions in flight have finished
    (gRPC maps it to RESOURCE_EXHAUSTED).
    """

    retriable = True

    def __init__(self, message: str, *, limit: str = "") -> None:
        super().__init__(message)
        self.limit = limit


class RolloutConflict(PodiumError):
    """A rollout command that does not apply to the rollout's current state (e.g. advancing
    while IDLE, resuming what is not paused). Not retriable: the same command fails again on
    the same state. ``state`` names the stage it met, ``command`` what was asked (gRPC maps it
    to FAILED_PRECONDITION)."""

    def __init__(self, message: str, *, state: str = "", command: str = "") -> None:
        super().__init__(message)
        self.state = state
        self.command = command


class CorpusError(PodiumError):
    """A document could not be read or decoded; ``path`` names the file (not retriable: the
    same bytes fail again)."""

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class IndexUnavailable(PodiumError):
    """A search index cannot be reached or opened: a dead Chroma server (``url`` names it) or
    a missing / incomplete index directory. Retriable: a server may come back."""

    retriable = True

    def __init__(self, message: str, *, url: str = "", retriable: bool | None = None) -> None:
        super().__init__(message, retriable=retriable)
        self.url = url


class PluginError(PodiumError):
    """A sub-agent plug-in cannot be found, loaded or built (an unknown entry-point name, an
    import that fails, a factory refusing its options); ``plugin`` names it. Not retriable:
    the same name and options fail again."""

    def __init__(self, message: str, *, plugin: str = "") -> None:
        super().__init__(message)
        self.plugin = plugin


class QuestionFileError(PodiumError):
    """A question file (JSONL) is malformed: the message names ``file:line`` and the field, so
    a bad line is fixed, never silently skipped. Not retriable: the same bytes fail again."""

    def __init__(self, message: str, *, path: str = "", line: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class WorkerError(PodiumError):
    """A worker process failed (:mod:`podium.procpool`: the search plug-ins' workers, the
    orchestrator's spec parsers): it died mid-call (killed, out of memory; retriable: a
    replacement serves the next call), failed to start, or raised an error its caller does not
    expect (not retriable: the same input fails again). The message names the pool, the
    process id and what happened."""

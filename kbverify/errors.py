"""Errors that end a command. Candidate failures are never errors: they are verdicts."""


class KbverifyError(Exception):
    """Base class; `exit_code` is what the CLI returns."""

    exit_code = 1


class InputError(KbverifyError):
    """Bad input from the user: a missing file, a task without `Model`, an unknown protocol."""

    exit_code = 2


class InfrastructureError(KbverifyError):
    """The machine failed us (no GPU, a worker that cannot start); never counted against a kernel."""

    exit_code = 3

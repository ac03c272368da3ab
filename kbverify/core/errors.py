"""Errors that end a command. Candidate failures are never errors: they are verdicts.

KbverifyError (exit 1)
├── InputError (exit 2): bad input, one line on stderr
│   └── TaskError: a task that cannot run by itself
└── InfrastructureError (exit 3): the machine failed us
"""


class KbverifyError(Exception):
    """Base class; `exit_code` is what the CLI returns."""

    exit_code = 1


class InputError(KbverifyError):
    """Bad input from the user: a missing file, a task without `Model`, an unknown protocol."""

    exit_code = 2


class TaskError(InputError):
    """A task that cannot run by itself (it raises at import, in get_inputs, in Model): bad input, and no verdict
    on any kernel checked against it (`kbverify.harness.task_probe`)."""


class InfrastructureError(KbverifyError):
    """The machine failed us (no GPU, a worker that cannot start); never counted against a kernel."""

    exit_code = 3

"""`python3 -m kbverify` and the `kbverify` command.

The worker server (torch's import, seconds on a GPU host) starts before the command line's own imports and
parsing, so those overlap with it instead of preceding it.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    timing = _server_timing(sys.argv[1:])
    if timing is not None:
        from kbverify.harness.sandbox import start_early

        start_early(timing=timing)
    from kbverify.cli.app import main as cli_main

    cli_main()


def _server_timing(args: list[str]) -> bool | None:
    """Whether the command's workers will run the interleaved timing (what the server preloads, see
    sandbox.TIMING_PRELOAD); None: start no server here. Only `check` starts it this early (its cost is seconds,
    the CLI's own import a tenth of that); `rescore`, `demo` and `audit` start it once their input is validated,
    and so does `check` wherever this cannot tell its input is sound (help, no --task or a missing one, a protocol
    the command line will reject with its own message)."""
    if not args or "--help" in args or "-h" in args or args[0] != "check":
        return None
    task = _option_value(args, "--task")
    if task is None or not os.path.isfile(task):
        return None
    protocol = _option_value(args, "--protocol") or "verified"  # check's default
    from kbverify.core.protocols import parse_protocols

    try:
        return any(p.timing == "interleaved" for p in parse_protocols(protocol))
    except Exception:  # noqa: BLE001 - any protocol the command line rejects, it rejects with its own message
        return None


def _option_value(args: list[str], option: str) -> str | None:
    value = None
    for index, arg in enumerate(args):
        if arg == option and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(option + "="):
            value = arg.partition("=")[2]
    return value


if __name__ == "__main__":
    main()

"""`python3 -m kbverify` and the `kbverify` command.

The worker server (torch's import, seconds on a GPU host) starts before the command line's own imports and
parsing, so those overlap with it instead of preceding it.
"""

from __future__ import annotations

import sys


def main() -> None:
    timing = _server_timing(sys.argv[1:])
    if timing is not None:
        from kbverify.sandbox import start_early

        start_early(timing=timing)
    from kbverify.cli import main as cli_main

    cli_main()


def _server_timing(args: list[str]) -> bool | None:
    """Whether the command's workers will run the interleaved timing (what the server preloads, see
    sandbox.TIMING_PRELOAD); None: start no server here (help, an unknown command, a protocol the command
    line will reject with its own message)."""
    if not args or "--help" in args or "-h" in args:
        return None
    command = args[0]
    if command in ("rescore", "demo"):
        return True
    if command == "audit":
        return False  # audit workers never time that way
    if command != "check" or not any(arg == "--task" or arg.startswith("--task=") for arg in args):
        return None  # check without its task stops at parsing
    protocol = "verified"  # check's default
    for index, arg in enumerate(args):
        if arg == "--protocol" and index + 1 < len(args):
            protocol = args[index + 1]
        elif arg.startswith("--protocol="):
            protocol = arg.partition("=")[2]
    from kbverify.protocols import parse_protocols

    try:
        return any(p.timing == "interleaved" for p in parse_protocols(protocol))
    except Exception:  # noqa: BLE001 - any protocol the command line rejects, it rejects with its own message
        return None


if __name__ == "__main__":
    main()

"""A worker's log file, bounded on the parent's side: its first bytes kept, the rest cut past a cap, and its tail
read back for a verdict's evidence (kbverify.harness.sandbox)."""

from __future__ import annotations

import os
from pathlib import Path

OUTPUT_HEAD_BYTES = 16 * 1024
OUTPUT_CAP_BYTES = 4 * 1024 * 1024  # the log file is truncated past this; only head and tail are kept


def bound_log(path: Path, head: bytes, dropped: int) -> tuple[bytes, int]:
    """Keep the first OUTPUT_HEAD_BYTES forever and let the file grow to the cap, then cut it (O_APPEND)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return head, dropped
    if len(head) < OUTPUT_HEAD_BYTES and size > len(head):
        with open(path, "rb") as handle:
            head = handle.read(OUTPUT_HEAD_BYTES)
    if size > OUTPUT_CAP_BYTES:
        os.truncate(path, 0)
        dropped += size
    return head, dropped


def read_tail(path: Path, head: bytes, limit: int = OUTPUT_HEAD_BYTES) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            tail = handle.read()
    except FileNotFoundError:
        return ""
    if tail == head[-len(tail):] and len(tail) <= len(head):
        return ""
    return tail.decode(errors="replace")

"""The bound on what a judge reads of a candidate's hand-over file, and the reading itself (no torch needed)."""

from __future__ import annotations

import os
import stat

# What a judge reads of a candidate's hand-over is bounded by what the reference's outputs can be: every element
# the reference returns, twice over (a candidate output of another shape is read, so that it is judged a shape
# mismatch), at 8 bytes (float64) or the reference's own element size where wider, plus the container's own bytes:
# a fixed part, and torch.save's record of each tensor (~200 bytes: its storage's entry, its header), with room.
# A larger file (a sparse one costs its writer nothing) is the candidate's failure, and is never read.
HANDOVER_ELEMENT_FACTOR = 2
HANDOVER_CONTAINER_BYTES = 16 << 20
HANDOVER_TENSOR_BYTES = 1024


def handover_limit(reference: list) -> int:
    tensors = [t for t in reference if hasattr(t, "element_size")]
    return HANDOVER_CONTAINER_BYTES + HANDOVER_ELEMENT_FACTOR * sum(
        t.numel() * max(t.element_size(), 8) + HANDOVER_TENSOR_BYTES for t in tensors)


def read_regular(path: str, limit_bytes: int) -> bytes:
    """A hand-over file's bytes, read only if it is a plain file of at most `limit_bytes`: the folder is the
    candidate's to write, and a link or a FIFO planted there must not make the judge read elsewhere or wait for
    ever, nor a huge file exhaust its memory (it may still grow while read: no more than the limit is read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise ValueError("the hand-over is not a plain file")
        if status.st_size > limit_bytes:
            raise ValueError(too_large(status.st_size, limit_bytes))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit_bytes + 1)
        if len(data) > limit_bytes:
            raise ValueError(too_large(len(data), limit_bytes))
        return data
    finally:
        os.close(fd)


def too_large(size: int, limit_bytes: int) -> str:
    return (f"the hand-over holds {size} bytes, more than the reference's outputs allow ({limit_bytes} bytes): "
            "refused unread")

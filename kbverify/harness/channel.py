"""The parent–child contract: which jobs run submission code, the messages a worker sends, and their framing.

A worker's messages travel over a pipe the job inherits from its supervisor, and from the supervisor over a
socket only the parent holds: never over a file another process could name. The job frames each message as a
4-byte length and a JSON object; the supervisor (which runs no submission code) checks the frame, tags it, and
adds what only it can know: how the job was confined, and how it ended.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct

# Jobs that execute submission code (its import, construction or forward): always confined, and what they say
# about the machine is believed only once a process without submission code confirms it.
SUBMISSION_JOBS = frozenset({"candidate", "timing", "build", "kernelbench_eval", "kernelbench_candidate_timing"})

# Messages, by their "kind" key.
PHASE = "phase"  # job → parent: {"phase": NAME}; what the job is doing (crash attribution)
RESULT = "result"  # job → parent: {"result": {...}}; counts only if the job then exits 0
SANDBOX = "sandbox"  # supervisor → parent: {"isolation": "isolated" | "degraded", "reason": ..., "job_pid": PID}
EXIT = "exit"  # supervisor → parent: {"code": N | None, "signal": N | None}; the job's end as waitpid saw it
COMMAND = "command"  # parent → job: a request of the job's protocol (e.g. a timing round)
REPLY = "reply"  # job → parent: the answer to a command

# The candidate → judge hand-over folder: markers the parent writes there when either process is gone. A run's
# markers take names drawn by the parent (marker_names): each process learns only the name of the other's marker,
# so the candidate cannot plant the one the judge reads (the defaults serve a caller that gives none).
CANDIDATE_ENDED = "candidate.ended"
JUDGE_ENDED = "judge.ended"


def marker_names() -> dict:
    import secrets

    return {"candidate_ended": f"c-{secrets.token_hex(8)}.ended", "judge_ended": f"j-{secrets.token_hex(8)}.ended"}


def handover_stem(set_id: str) -> str:
    return set_id.replace("/", "__").replace(":", "_")


def handover_strays(handover: str, set_ids: list[str], markers: dict) -> list[str]:
    """What the hand-over folder holds beyond the files the two processes exchange for the planned sets and the
    parent's markers: only the candidate's process could have put it there (planted markers, decoys, folders)."""
    expected = {handover_stem(s) + suffix for s in set_ids for suffix in (".pt", ".none", ".pt.tmp")}
    expected.update(markers.values())
    try:
        return sorted(name for name in os.listdir(handover) if name not in expected or
                      not os.path.isfile(os.path.join(handover, name)) or
                      os.path.islink(os.path.join(handover, name)))
    except OSError as error:
        return [f"(unreadable: {error.strerror})"]

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
_HEADER = struct.Struct(">I")
HEADER_BYTES = _HEADER.size


def runs_submission(job: str, payload: dict) -> bool:
    return job in SUBMISSION_JOBS and bool(payload.get("submission_source"))


def encode(message: dict) -> bytes:
    return frame(json.dumps(message, default=_json_default).encode())


def frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body)) + body


def write_message(fd: int, message: dict) -> None:
    data = memoryview(encode(message))
    while data:
        written = os.write(fd, data)
        data = data[written:]


def read_frame(fd: int) -> bytes | None:
    """One frame's body, or None at the end of the stream (or a frame cut short, or one over the limit)."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (length,) = _HEADER.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        return None
    return _read_exactly(fd, length)


def _read_exactly(fd: int, count: int) -> bytes | None:
    chunks, left = [], count
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def decode(body: bytes) -> dict | None:
    """A message from a job, or None: anything but a JSON object with a known kind is dropped."""
    try:
        message = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(message, dict) or message.get("kind") not in (PHASE, RESULT, REPLY):
        return None
    return message


def _json_default(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def write_marker(path: str) -> None:
    """The hand-over folder is the candidate's to write: a name it planted as a link must not lead this process
    (which may run as root) to truncate what the link points to."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError):
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError as error:
        logging.getLogger(__name__).warning("could not mark %s: %s", path, error)

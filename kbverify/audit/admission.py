"""Memory admission for audit copies sharing one device: a reservation ledger in the copies' shared folder.

Each copy reserves a task's estimated need (`kbverify.audit.footprint`) before starting it and releases it when the
task ends. A task is admitted when the live reservations plus its need fit the budget; a task whose need alone
exceeds the budget (or is unknown) is admitted only when nothing else is in flight. The ledger is one JSON file
rewritten under an exclusive `fcntl.flock`, so copies never read it half-written or lose each other's updates;
a reservation whose owner process is gone (a killed copy) no longer counts.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

LEDGER_FILE = "memory-ledger.json"
LOCK_FILE = "memory-ledger.lock"


@dataclass(frozen=True)
class Reservation:
    key: str  # Task.key
    pid: int  # the copy holding it; a dead pid's reservation is ignored
    need_bytes: int


@dataclass(frozen=True)
class MemoryLedger:
    """Reservations of the copies sharing `folder` against `budget_bytes` of device memory."""

    folder: Path
    budget_bytes: int
    pid: int = 0  # the owner written into this copy's reservations; 0 means os.getpid() at the time

    def __post_init__(self):
        if self.budget_bytes <= 0:
            raise ValueError("the memory budget must be positive")

    def try_reserve(self, key: str, need_bytes: int | None) -> bool:
        """Reserve `need_bytes` for `key` if it fits now; None (unknown) counts as the whole budget."""
        need = self.budget_bytes if need_bytes is None else need_bytes
        with self._locked() as reservations:
            live = [r for r in reservations.values() if r.key != key and _alive(r.pid)]
            held = sum(r.need_bytes for r in live)
            fits = not live if need >= self.budget_bytes else held + need <= self.budget_bytes
            if fits:
                reservations.clear()
                reservations.update({r.key: r for r in live})
                reservations[key] = Reservation(key, self.pid or os.getpid(), need)
            return fits

    def release(self, key: str) -> None:
        with self._locked() as reservations:
            reservations.pop(key, None)

    def in_flight(self) -> list[Reservation]:
        """Live reservations, for logs and tests."""
        with self._locked() as reservations:
            return [r for r in reservations.values() if _alive(r.pid)]

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Reservation]]:
        """The reservations, read and written back under the lock (written only if the caller changed them)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                reservations = _read(self.folder / LEDGER_FILE)
                before = dict(reservations)
                yield reservations
                if reservations != before:
                    _write(self.folder / LEDGER_FILE, reservations)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: Path) -> dict[str, Reservation]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {key: Reservation(key, int(entry["pid"]), int(entry["need_bytes"])) for key, entry in data.items()}


def _write(path: Path, reservations: dict[str, Reservation]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({r.key: {"pid": r.pid, "need_bytes": r.need_bytes}
                                     for r in reservations.values()}))
    temporary.replace(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A copy that died but is not yet reaped (its launcher waits on the copies one by one) still has a pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]

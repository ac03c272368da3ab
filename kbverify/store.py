"""Results store: SQLite (stdlib, WAL). One row per finished unit of work, written in one transaction, so a
killed run resumes where it stopped and never loses or duplicates a verdict (SPEC §7)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from kbverify.errors import InputError
from kbverify.provenance import compat_key
from kbverify.records import Verdict

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, started REAL NOT NULL, compat_key TEXT NOT NULL, provenance TEXT NOT NULL,
    arguments TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS verdicts (
    unit_key TEXT PRIMARY KEY, run_id TEXT NOT NULL, task TEXT NOT NULL, submission TEXT NOT NULL,
    protocol TEXT NOT NULL, status TEXT NOT NULL, record TEXT NOT NULL, written REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS audit (
    task_key TEXT PRIMARY KEY, record TEXT NOT NULL, written REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS cache (
    key TEXT PRIMARY KEY, value TEXT NOT NULL, written REAL NOT NULL
);
"""


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.exists() and self.path.is_dir():
            raise InputError(f"{self.path}: a store is a file, this is a folder")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as error:
            raise InputError(f"{self.path}: not a kbverify store ({error})") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- runs --------------------------------------------------------------------------------------------
    def begin_run(self, run_id: str, provenance: dict, arguments: dict, *, allow_mixed: bool = False) -> None:
        key = compat_key(provenance)
        others = {row[0] for row in self._db.execute("SELECT DISTINCT compat_key FROM runs")}
        if others and key not in others and not allow_mixed:
            raise InputError(f"{self.path}: holds results from another machine/software ({sorted(others)[0]}); "
                             f"this one is {key}. Use a new store or pass --allow-mixed to mark the mix")
        self._db.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?)",
                         (run_id, time.time(), key, json.dumps(provenance), json.dumps(arguments)))

    def runs(self) -> list[dict]:
        rows = self._db.execute("SELECT run_id, started, compat_key, provenance, arguments FROM runs ORDER BY started")
        return [{"run_id": r[0], "started": r[1], "compat_key": r[2], "provenance": json.loads(r[3]),
                 "arguments": json.loads(r[4])} for r in rows]

    def units_without_verdict(self) -> list[dict]:
        """The units some run planned that have no verdict (an infrastructure error, or a cut run), as the run
        recorded them (`kbverify.rescore.planned_unit`)."""
        planned: dict[str, dict] = {}
        for run in self.runs():
            planned.update(run["arguments"].get("planned_units") or {})
        stored = {row[0] for row in self._db.execute("SELECT unit_key FROM verdicts")}
        return [unit for key, unit in planned.items() if key not in stored]

    def annotate_runs(self, note: dict) -> None:
        """Add `note` to every run's arguments (what was done to the verdicts after the runs wrote them)."""
        for run in self.runs():
            notes = [*run["arguments"].get("notes", []), note]
            self._db.execute("UPDATE runs SET arguments = ? WHERE run_id = ?",
                             (json.dumps({**run["arguments"], "notes": notes}), run["run_id"]))

    # -- verdicts ----------------------------------------------------------------------------------------
    def has(self, unit_key: str) -> bool:
        return self._db.execute("SELECT 1 FROM verdicts WHERE unit_key = ?", (unit_key,)).fetchone() is not None

    def put(self, unit_key: str, run_id: str, verdict: Verdict) -> bool:
        """Write one verdict atomically; returns False (and writes nothing) if the unit is already there."""
        record = json.dumps(verdict.to_dict())
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (unit_key, run_id, verdict.task, verdict.submission, verdict.protocol, verdict.status.value, record,
             time.time()))
        return cursor.rowcount == 1

    def replace(self, unit_key: str, verdict: Verdict) -> None:
        self._db.execute("UPDATE verdicts SET status = ?, record = ? WHERE unit_key = ?",
                         (verdict.status.value, json.dumps(verdict.to_dict()), unit_key))

    def verdicts(self) -> list[tuple[str, Verdict]]:
        rows = self._db.execute("SELECT unit_key, record FROM verdicts ORDER BY written")
        return [(key, Verdict.from_dict(json.loads(record))) for key, record in rows]

    def count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]

    def export_jsonl(self, path: str | Path) -> int:
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        count = 0
        with open(tmp, "w") as handle:
            for _, verdict in self.verdicts():
                handle.write(json.dumps(verdict.to_dict()) + "\n")
                count += 1
        tmp.replace(path)
        return count

    # -- small persistent cache (A/A noise margins per task and machine) ---------------------------------
    def cache_get(self, key: str):
        row = self._db.execute("SELECT value FROM cache WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def cache_put(self, key: str, value) -> None:
        self._db.execute("INSERT OR REPLACE INTO cache VALUES (?, ?, ?)", (key, json.dumps(value), time.time()))

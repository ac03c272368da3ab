"""Results store: SQLite (stdlib, WAL). One row per finished unit of work, written in one transaction, so a
killed run resumes where it stopped and never loses or duplicates a verdict (SPEC §7).

A store holds one verdict per task, sample, protocol name and label set (`kbverify.core.labels`): that is how `score`
and `report` read it. A run whose plan would add a second one (another kernel for the same sample, another version
of the task, a protocol file that reuses a name) is refused before it starts (`StoreConflict`), and so is another
machine's run unless the mix is asked for. A record that does not read back is an InputError naming the store, never a traceback.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from kbverify.core.errors import InputError
from kbverify.core.labels import key as labels_key
from kbverify.core.records import Verdict, task_label
from kbverify.harness.provenance import compat_key

_OURS = {"runs", "verdicts", "audit", "cache"}
_EXAMPLES = 3

# The store's format, in SQLite's `PRAGMA user_version`, so a reader can tell a store it cannot read from a damaged
# one. Each version, and what a reader of it must accept:
#   0  no version set: the tables below, verdict records without `format_version` (records.RECORD_VERSION);
#      read as version 1, and left unversioned, since a reader changes nothing in a store;
#   1  the same tables; verdict records carry `format_version`.
# A store of a newer version than this is refused: its tables or records may mean something this code misreads.
STORE_VERSION = 1


class StoreConflict(InputError):
    """The run would put a second verdict for one task, sample and protocol into the store."""

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
    def __init__(self, path: str | Path, *, existing: bool = False):
        """`existing`: a store to read (score, report, rejudge): it must be there and already hold our tables;
        an empty file or database is refused rather than given our schema, since reading writes nothing."""
        self.path = Path(path)
        if self.path.exists() and self.path.is_dir():
            raise InputError(f"{self.path}: a store is a file, this is a folder")
        if existing and not self.path.is_file():
            raise InputError(f"{self.path}: no such store")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
            tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if existing and not tables:
                self._db.close()
                raise InputError(f"{self.path}: not a kbverify store (an empty "
                                 f"{'file' if self.path.stat().st_size == 0 else 'SQLite database'}); give the "
                                 f"store a rescore wrote")
            if tables and not tables & _OURS:
                # Someone else's database: adding our tables to it would be a half-written result of our own.
                self._db.close()
                raise InputError(f"{self.path}: not a kbverify store (an SQLite database with tables "
                                 f"{', '.join(sorted(tables)[:_EXAMPLES])})")
            self._check_version()
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            if not tables:
                self._db.execute(f"PRAGMA user_version = {STORE_VERSION}")
        except sqlite3.DatabaseError as error:
            raise InputError(f"{self.path}: not a kbverify store ({error})") from None

    def _check_version(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > STORE_VERSION:
            self._db.close()
            raise InputError(f"{self.path}: a store of format version {version}, newer than this kbverify reads "
                             f"(up to {STORE_VERSION}); read it with the kbverify that wrote it, or a newer one")

    @property
    def version(self) -> int:
        """The store's format version (0: written before stores carried one)."""
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- runs --------------------------------------------------------------------------------------------
    def begin_run(self, run_id: str, provenance: dict, arguments: dict, *, allow_mixed: bool = False) -> None:
        """Record a run; refused (nothing written) when it is another machine's and `allow_mixed` is not set, or
        when its `planned_units` conflict with what the store holds (`refuse_conflicts`)."""
        key = compat_key(provenance)
        others = {row[0] for row in self._db.execute("SELECT DISTINCT compat_key FROM runs")}
        if others and key not in others and not allow_mixed:
            raise InputError(f"{self.path}: holds results from another machine/software ({sorted(others)[0]}); "
                             f"this one is {key}. Use a new store or pass --allow-mixed to mark the mix")
        self.refuse_conflicts(arguments.get("planned_units") or {})
        self._db.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?)",
                         (run_id, time.time(), key, json.dumps(provenance), json.dumps(arguments)))

    def refuse_conflicts(self, planned: dict[str, dict]) -> None:
        """Raise StoreConflict when a planned unit (`kbverify.rescore.rescore.planned_unit`, by unit key) is for the same
        task, sample and protocol as a unit the store holds or another run planned, under another key."""
        held = self._identities()
        clashes = [(unit, held[identity]) for unit_key, unit in planned.items()
                   if (identity := _identity(unit["protocol"], unit["task"], unit["sample"],
                                             unit.get("labels"))) in held
                   and held[identity][0] != unit_key]
        if not clashes:
            return
        unit, (_, run) = clashes[0]
        origin = f"run {run['run_id']} of {run['arguments'].get('source', '?')}" if run else "an earlier run"
        raise StoreConflict(
            f"{self.path}: {len(clashes)} of this run's {len(planned)} units are already there in another version "
            f"(e.g. {unit['task']} sample {unit['sample']} under {unit['protocol']}, from {origin}): another "
            f"kernel, task file or protocol setting. Re-score into a new store, or repeat that run's source and "
            f"protocols to resume it")

    def _identities(self) -> dict[tuple, tuple[str, dict | None]]:
        """(protocol, task, sample) → (unit key, the run that holds it) for every verdict and planned unit."""
        held: dict[tuple, tuple[str, dict | None]] = {}
        runs = self.runs()
        for run in runs:
            for unit_key, unit in (run["arguments"].get("planned_units") or {}).items():
                identity = _identity(unit["protocol"], unit["task"], unit["sample"], unit.get("labels"))
                held.setdefault(identity, (unit_key, run))
        by_id = {run["run_id"]: run for run in runs}
        for unit_key, run_id, verdict in self._verdict_rows():
            identity = _identity(verdict.protocol, task_label(verdict.task_name, verdict.level), verdict.sample,
                                 verdict.labels)
            held.setdefault(identity, (unit_key, by_id.get(run_id)))
        return held

    def runs(self) -> list[dict]:
        rows = self._db.execute("SELECT run_id, started, compat_key, provenance, arguments FROM runs ORDER BY started")
        runs = []
        for row in rows:
            try:
                runs.append({"run_id": row[0], "started": row[1], "compat_key": row[2],
                             "provenance": json.loads(row[3]), "arguments": _object(json.loads(row[4]))})
            except (TypeError, ValueError) as error:
                raise self._corrupted(f"the record of run {row[0]}", error) from None
        return runs

    def units_without_verdict(self) -> list[dict]:
        """The units some run planned that have no verdict (an infrastructure error, or a cut run), as the run
        recorded them (`kbverify.rescore.rescore.planned_unit`)."""
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
        return [(key, verdict) for key, _, verdict in self._verdict_rows()]

    def _verdict_rows(self) -> list[tuple[str, str, Verdict]]:
        rows = self._db.execute("SELECT unit_key, run_id, record FROM verdicts ORDER BY written")
        read = []
        for key, run_id, record in rows:
            try:
                read.append((key, run_id, Verdict.from_dict(_object(json.loads(record)))))
            except (TypeError, ValueError, KeyError, AttributeError) as error:
                raise self._corrupted(f"the verdict of unit {str(key)[:12]}", error) from None
        return read

    def _corrupted(self, what: str, error: Exception) -> InputError:
        return InputError(f"{self.path}: {what} does not read back ({type(error).__name__}: {error}); the store is "
                          f"damaged: restore it from a copy, or re-score into a new store")

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


def _identity(protocol: str, task: str, sample, labels: dict | None) -> tuple:
    """Labels are part of it: two models' verdicts for one task and sample are two verdicts."""
    return protocol, task, sample, labels_key(labels or {})


def _object(value) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    return value

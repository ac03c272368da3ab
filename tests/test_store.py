"""The store writes each verdict once, atomically, and refuses to mix machines silently."""

import json

import pytest

from kbverify.core.errors import InputError
from kbverify.core.records import SetResult, Verdict
from kbverify.core.status import Status
from kbverify.results.store import Store

MACHINE = {"gpu_model": "H200", "driver": "580", "cuda": "13.0", "torch": "2.11"}


def _verdict(name="t", status=Status.PASSED, speedup=1.5):
    return Verdict(task=f"level1/{name}@abc", task_name=name, level=1, problem_id=1, submission="s.py",
                   submission_sha256="f" * 64, protocol="verified", protocol_sha256="0" * 64, status=status,
                   speedup=speedup, speedup_ci=(1.4, 1.6), warnings=("pytorch_only",),
                   sets=(SetResult("original/x1/default/s0", "original", "x1", "default", 7, True, Status.PASSED,
                                   errors={"comparison": {"outputs": []}}),))


def test_a_unit_is_written_once_and_reads_back_equal(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.begin_run("r1", MACHINE, {})
        assert store.put("u1", "r1", _verdict())
        assert not store.put("u1", "r1", _verdict(status=Status.INCORRECT)), "a finished unit is never overwritten"
        assert store.has("u1") and not store.has("u2")
        [(key, verdict)] = store.verdicts()
    assert key == "u1" and verdict == _verdict()


def test_a_reopened_store_resumes_with_what_was_written(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.begin_run("r1", MACHINE, {})
        store.put("u1", "r1", _verdict("a"))
    with Store(path) as store:
        store.begin_run("r2", MACHINE, {})
        assert store.has("u1")
        store.put("u2", "r2", _verdict("b"))
        assert store.count() == 2


def test_another_machine_is_refused_unless_the_mix_is_asked_for(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.begin_run("r1", MACHINE, {})
    other = {**MACHINE, "gpu_model": "H100"}
    with Store(path) as store:
        with pytest.raises(InputError, match="another machine"):
            store.begin_run("r2", other, {})
        store.begin_run("r2", other, {}, allow_mixed=True)
        assert {r["compat_key"] for r in store.runs()} == {
            "gpu_model=H200|driver=580|cuda=13.0|torch=2.11", "gpu_model=H100|driver=580|cuda=13.0|torch=2.11"}


def test_export_jsonl_has_one_line_per_verdict(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.begin_run("r1", MACHINE, {})
        for index in range(3):
            store.put(f"u{index}", "r1", _verdict(str(index)))
        assert store.export_jsonl(tmp_path / "out.jsonl") == 3
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert [json.loads(line)["task_name"] for line in lines] == ["0", "1", "2"]


def test_a_file_that_is_not_a_store_is_a_clear_error(tmp_path):
    bogus = tmp_path / "notes.sqlite"
    bogus.write_text("hello, this is not sqlite" * 100)
    with pytest.raises(InputError, match="not a kbverify store"):
        Store(bogus)


# --- one verdict per task, sample and protocol (issue 21) -------------------------------------------------------------

def _planned(task="level1/t", sample=0, protocol="verified"):
    return {"name": f"{task} [{protocol}]", "task": task, "level": 1, "sample": sample, "protocol": protocol}


def test_a_run_with_another_version_of_a_stored_unit_is_refused_and_nothing_is_written(tmp_path):
    """A second rescore of other kernels (or another task file, or a protocol file reusing a name) into a store once
    left `score` and `report` failing with "the same sample id appears more than once"."""
    from kbverify.results.store import StoreConflict

    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.begin_run("r1", MACHINE, {"source": "first.jsonl", "planned_units": {"u1": _planned()}})
        store.put("u1", "r1", _verdict())
    with Store(path) as store:
        with pytest.raises(StoreConflict, match=r"1 of this run's 2 units .* level1/t sample 0 under verified, "
                                                r"from run r1 of first\.jsonl.*new store"):
            store.begin_run("r2", MACHINE, {"source": "second.jsonl",
                                            "planned_units": {"u1-v2": _planned(), "u2": _planned(sample=1)}})
        assert [run["run_id"] for run in store.runs()] == ["r1"] and store.count() == 1
        # the same units resume; other samples, tasks or protocols are other units
        store.begin_run("r3", MACHINE, {"planned_units": {"u1": _planned(), "u2": _planned(sample=1),
                                                          "u3": _planned(protocol="original"),
                                                          "u4": _planned(task="level1/other")}})
        assert [run["run_id"] for run in store.runs()] == ["r1", "r3"]


def test_a_unit_another_run_planned_but_never_finished_counts_as_held(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.begin_run("r1", MACHINE, {"source": "cut.jsonl", "planned_units": {"u1": _planned()}})
        with pytest.raises(InputError, match="already there in another version"):
            store.refuse_conflicts({"u1-v2": _planned()})


def test_a_verdict_without_a_plan_is_held_under_the_name_the_score_tables_give_it(tmp_path):
    """Stores written before runs kept their plan: the verdict's own task label, sample and protocol decide."""
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.begin_run("r1", MACHINE, {})
        store.put("u1", "r1", _verdict("7_Gelu"))
        with pytest.raises(InputError, match="level1/7_Gelu sample 0"):
            store.refuse_conflicts({"u9": _planned(task="level1/7_Gelu")})
        store.refuse_conflicts({"u1": _planned(task="level1/7_Gelu")})


@pytest.mark.parametrize("record", ['{"status": "passed"', '[1, 2]', '{"status": "splendid"}', '{"task": 1}'])
def test_a_damaged_verdict_record_is_a_clear_error(tmp_path, record):
    import sqlite3

    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.begin_run("r1", MACHINE, {})
        store.put("u1", "r1", _verdict())
    with sqlite3.connect(path) as db:
        db.execute("UPDATE verdicts SET record = ?", (record,))
    with Store(path) as store:
        with pytest.raises(InputError, match=r"s\.sqlite: the verdict of unit u1 does not read back .* damaged"):
            store.verdicts()


def test_a_damaged_run_record_is_a_clear_error(tmp_path):
    import sqlite3

    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.begin_run("r1", MACHINE, {})
    with sqlite3.connect(path) as db:
        db.execute("UPDATE runs SET arguments = 'not json'")
    with Store(path) as store:
        with pytest.raises(InputError, match="the record of run r1 does not read back"):
            store.runs()


def test_another_programs_database_is_refused_and_left_untouched(tmp_path):
    import sqlite3

    path = tmp_path / "photos.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE photos (id INTEGER)")
    with pytest.raises(InputError, match="not a kbverify store .* photos"):
        Store(path)
    with sqlite3.connect(path) as db:
        assert [row[0] for row in db.execute("SELECT name FROM sqlite_master")] == ["photos"]


def test_a_new_store_carries_its_format_version_and_its_records_theirs(tmp_path):
    import sqlite3

    from kbverify.core.records import RECORD_VERSION
    from kbverify.results.store import STORE_VERSION

    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.put("u1", "r1", _verdict())
        assert store.version == STORE_VERSION
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == STORE_VERSION
        record = json.loads(db.execute("SELECT record FROM verdicts").fetchone()[0])
    assert record["format_version"] == RECORD_VERSION


def test_a_store_and_records_from_before_versions_read_as_they_always_did(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    with Store(path) as store:
        store.put("u1", "r1", _verdict())
    with sqlite3.connect(path) as db:  # what a store written before versions looks like
        record = json.loads(db.execute("SELECT record FROM verdicts").fetchone()[0])
        del record["format_version"]
        db.execute("UPDATE verdicts SET record = ?", (json.dumps(record),))
        db.execute("PRAGMA user_version = 0")
    with Store(path, existing=True) as store:
        [(_, verdict)] = store.verdicts()
        assert verdict == _verdict() and store.version == 0
    with Store(path) as store:  # opening it to add to it leaves its version alone
        assert store.version == 0


def test_a_store_or_a_record_of_a_newer_format_is_refused_in_one_line(tmp_path):
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    from kbverify.results.store import STORE_VERSION

    path = tmp_path / "new.sqlite"
    with Store(path) as store:
        store.put("u1", "r1", _verdict())
    with sqlite3.connect(path) as db:
        record = json.loads(db.execute("SELECT record FROM verdicts").fetchone()[0])
        db.execute("UPDATE verdicts SET record = ?", (json.dumps({**record, "format_version": 99}),))
    with Store(path, existing=True) as store, pytest.raises(InputError, match="format_version 99"):
        store.verdicts()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {STORE_VERSION + 1}")
    with pytest.raises(InputError, match=f"format version {STORE_VERSION + 1}, newer than this kbverify reads"):
        Store(path, existing=True)
    repo = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-m", "kbverify", "rejudge", str(path)], cwd=repo, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    assert run.stderr.startswith(f"kbverify: {path}: a store of format version {STORE_VERSION + 1}")

"""The store writes each verdict once, atomically, and refuses to mix machines silently."""

import json

import pytest

from kbverify.errors import InputError
from kbverify.records import SetResult, Verdict
from kbverify.status import Status
from kbverify.store import Store

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

"""`kbverify compare`: two stores (repeatability) and two audit reports (what changed), through the command line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from kbverify.core.records import Verdict
from kbverify.core.status import Status
from kbverify.results.store import Store

REPO = Path(__file__).resolve().parent.parent


def kbverify(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kbverify", "compare", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _verdict(submission: str, speedup: float | None, speed_class: str = "faster",
             status: Status = Status.PASSED) -> Verdict:
    ci = (speedup * math.exp(-0.01), speedup * math.exp(0.01)) if speedup else None
    return Verdict(task=f"level1/{submission}@0", task_name=submission, level=1, problem_id=1, submission=submission,
                   submission_sha256="0", protocol="verified", protocol_sha256="0", status=status, speedup=speedup,
                   speedup_ci=ci, speed_class=speed_class if speedup else None)


def _store(path: Path, verdicts: list[Verdict]) -> Path:
    with Store(path) as store:
        for verdict in verdicts:
            store.put(f"unit-{verdict.submission}", "run-1", verdict)
    return path


def _audit(path: Path, tasks: list[dict]) -> Path:
    path.write_text(json.dumps({"tasks": tasks}))
    return path


def _task(key, degenerate_under=(), flags=(), error=None):
    return {"key": key, "degenerate": bool(degenerate_under), "degenerate_under": list(degenerate_under),
            "flags": list(flags), "error": error}


def test_two_stores_give_each_kernels_change_the_status_changes_and_a_summary(tmp_path):
    a = _store(tmp_path / "a.sqlite", [_verdict("small", 2.0), _verdict("large", 2.0), _verdict("y", 3.0)])
    b = _store(tmp_path / "b.sqlite", [_verdict("small", 2.02), _verdict("large", 2.2),
                                       _verdict("y", None, status=Status.INCORRECT)])
    run = kbverify(a, b)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("| submission | speedup A | speedup B | change |")
    assert "| large | 2.000 | 2.200 | +10.00% | False | faster | faster |" in lines
    assert "| small | 2.000 | 2.020 | +1.00% | True | faster | faster |" in lines
    assert "status changed: y: passed -> incorrect" in lines
    assert lines[-1] == ("2 kernels: median |change| 5.50%; within the combined 95% CIs: 50%; "
                         "faster<->slower crossings: 0")


def test_two_stores_with_no_kernel_timed_in_both_exit_1(tmp_path):
    a = _store(tmp_path / "a.sqlite", [_verdict("x", 2.0)])
    b = _store(tmp_path / "b.sqlite", [_verdict("x", 2.0)])
    run = kbverify(a, b, "--protocol", "original")
    assert run.returncode == 1 and run.stdout.splitlines()[-1] == "no kernel is correct and timed in both runs"


def test_two_audits_list_changed_verdicts_flags_and_errors_and_fail_on_a_verdict(tmp_path):
    old = _audit(tmp_path / "old.json", [_task("a@1", ["original"], ["near_zero:original"]),
                                         _task("b@2", flags=["mostly_zero"]), _task("c@3", error="out of memory"),
                                         _task("d@4")])
    gained = ["mostly_zero", "trivially_passable:ones:original"]
    new = _audit(tmp_path / "new.json", [_task("a@1", ["original"], ["near_zero:original"]),
                                         _task("b@2", ["original"], gained),
                                         _task("c@3", flags=["dead_input"]), _task("d@4")])
    run = kbverify(old, new)
    assert run.returncode == 1, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "b@2: degenerate [] -> ['original']; +trivially_passable:ones:original"
    assert lines[1].startswith("c@3: error gone")
    assert lines[-1] == "3 tasks with evidence in both; 1 verdicts changed, 2 tasks listed"
    same = kbverify(old, old)
    assert same.returncode == 0 and same.stdout.splitlines() == ["3 tasks with evidence in both; 0 verdicts changed, "
                                                                  "0 tasks listed"]


def _assert_input_error(run: subprocess.CompletedProcess, *words: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert len(run.stderr.splitlines()) == 1 and run.stderr.startswith("kbverify: ")
    for word in words:
        assert word in run.stderr


def test_a_store_and_an_audit_or_a_missing_or_foreign_file_are_refused_in_one_line(tmp_path):
    store = _store(tmp_path / "a.sqlite", [_verdict("x", 2.0)])
    audit = _audit(tmp_path / "old.json", [_task("a@1")])
    _assert_input_error(kbverify(store, audit), "is a store", "is an audit report")
    _assert_input_error(kbverify(store, tmp_path / "missing.sqlite"), "missing.sqlite", "no such file")
    (tmp_path / "notes.json").write_text('{"rows": []}')
    _assert_input_error(kbverify(audit, tmp_path / "notes.json"), "neither a store nor an audit report")

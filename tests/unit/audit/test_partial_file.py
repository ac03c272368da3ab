"""A finished audit leaves no `OUT.partial.jsonl` (a file of that name reads as a run cut short): its lines are
folded into `OUT.raw.jsonl`, which a rerun resumes from as it did from the partial file. No worker process."""

from __future__ import annotations

import json
from pathlib import Path

from kbverify.audit.partial import finish_partial, raw_path
from kbverify.audit.records import AuditSettings, AuditThresholds
from kbverify.audit.run import _plan


def _lines(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _plan_of(prefix: Path, *, resume: bool = True, run: bool = True):
    return _plan(["original"], "cpu", prefix, AuditSettings(), AuditThresholds(), resume=resume, run=run)


def test_a_finished_audits_lines_move_to_the_raw_file_and_a_rerun_resumes_from_them(tmp_path):
    prefix = tmp_path / "run"
    fingerprint = _plan_of(prefix).fingerprint
    partial = Path(f"{prefix}.partial.jsonl")
    _lines(partial, [{"key": "a", "raw": {"x": 1}, "settings_sha256": fingerprint},
                     {"key": "b", "raw": None, "error": "out of memory", "settings_sha256": fingerprint}])
    raw = finish_partial(partial, fingerprint)
    assert raw == raw_path(partial) == tmp_path / "run.raw.jsonl"
    assert not partial.exists()
    assert [json.loads(line)["key"] for line in raw.read_text().splitlines()] == ["a", "b"]
    assert set(_plan_of(prefix).done) == {"a"}  # the error is audited again
    assert set(_plan_of(prefix, run=False).failed) == {"b"}  # --report-only shows it


def test_a_later_line_of_a_task_beats_the_raw_files_and_a_fresh_run_forgets_both(tmp_path):
    prefix = tmp_path / "run"
    fingerprint = _plan_of(prefix).fingerprint
    partial = Path(f"{prefix}.partial.jsonl")
    _lines(raw_path(partial), [{"key": "a", "raw": {"x": 1}, "settings_sha256": fingerprint}])
    _lines(partial, [{"key": "a", "raw": {"x": 2}, "settings_sha256": fingerprint}])
    assert _plan_of(prefix).done["a"]["raw"] == {"x": 2}
    finish_partial(partial, fingerprint)
    assert [json.loads(line)["raw"] for line in raw_path(partial).read_text().splitlines()] == [{"x": 2}]
    assert _plan_of(prefix, resume=False).done == {}
    assert not raw_path(partial).exists() and partial.read_text() == ""


def test_nothing_to_fold_leaves_the_raw_file_as_it_was(tmp_path):
    partial = tmp_path / "run.partial.jsonl"
    assert not finish_partial(partial).exists()

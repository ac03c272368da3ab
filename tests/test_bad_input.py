"""Issue 21: no input, however malformed, gets a traceback or a wrong verdict (SPEC §7, §10).

Each case runs the command line in this process (its real entry, `kbverify.cli.app.main`) on one malformed input and
asserts what a script calling kbverify relies on: exit 2, exactly one line on stderr that starts `kbverify: `
and names the problem, nothing on stdout, no traceback, nothing written where the command would have written,
and no worker process started (the sandbox's entry points fail the test if anything reaches them), so each case
takes milliseconds.

Every case here expects exit 2. Inputs that look hostile but are not bad input are left out on purpose, because
another code is right for them: an empty or syntactically broken submission is the submission's failure (a
verdict, exit 1, after a worker ran it); an empty file given to `rescore --store` is a new store to write (it goes
ahead); a protocol list that names one preset twice is taken once; a task that raises at import is the task's
problem, with its own status (kbverify.harness.task_probe).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kbverify.audit import FORMAT as AUDIT_FORMAT
from kbverify.cli import app as cli
from kbverify.core.records import Verdict
from kbverify.core.status import Status
from kbverify.harness import sandbox
from kbverify.results.store import Store

REPO = Path(__file__).resolve().parent.parent
RELU = REPO / "tasks" / "basic" / "level1" / "1_ReLU.py"
RUN = REPO / "examples" / "published_run"
TASKS = REPO / "tasks"

HONEST = ("import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
          "        return x.clamp_min(0)\n")
MACHINE = {"gpu_model": None, "driver": None, "cuda": None, "torch": None}


@dataclass(frozen=True)
class World:
    """Inputs shared by every case, made once; a case writes only under its own `out` folder."""

    root: Path
    files: dict = field(default_factory=dict)

    def __getattr__(self, name: str) -> Path:
        return self.files[name]


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def _verdict(task_name: str, protocol: str, sample: int = 0) -> Verdict:
    return Verdict(task=f"level1/{task_name}@0", task_name=task_name, level=1, problem_id=1, submission="old.py",
                   submission_sha256="0" * 64, protocol=protocol, protocol_sha256="1" * 64, status=Status.PASSED,
                   speedup=1.2, sample=sample)


def _stores(root: Path) -> dict:
    good = root / "good.sqlite"
    with Store(good) as store:
        store.begin_run("r0", MACHINE, {"source": "an earlier run.jsonl"})
        store.put("another-version-of-relu", "r0", _verdict("1_ReLU", "original"))
    corrupted = root / "corrupted.sqlite"
    with Store(corrupted) as store:
        store.begin_run("r0", MACHINE, {"source": "x"})
        store.put("u", "r0", _verdict("1_ReLU", "original"))
    with sqlite3.connect(corrupted) as db:
        db.execute("UPDATE verdicts SET record = '{\"status\": \"splendid\"'")
    foreign = root / "foreign.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE photos (id INTEGER, path TEXT)")
    return {"store": good, "corrupted_store": corrupted, "foreign_db": foreign,
            "text_file_store": _write(root / "notes.sqlite", "plain text, not SQLite\n" * 50)}


def _protocol_files(root: Path) -> dict:
    files = {f"protocol_{name}": _write(root / f"p_{name}.json", json.dumps(body)) for name, body in {
        "atol_text": {"base": "verified", "atol": "abc"}, "atol_negative": {"base": "verified", "atol": -1},
        "unknown_field": {"base": "verified", "speed": "fast"}, "base_list": {"base": ["verified"]},
        "trials_zero": {"base": "kbv", "trials": 0}, "guards_int": {"guards": 1},
        "no_distribution": {"distributions": []}, "named_verified": {"base": "kbv", "name": "verified"},
        "bad_distribution": {"distributions": ["x1", "gaussian"]}}.items()}
    files["protocol_not_json"] = _write(root / "p_not_json.json", "{atol: 1e-3")
    files["protocol_list"] = _write(root / "p_list.json", "[1, 2]")
    files["protocol_binary"] = _write(root / "p_binary.json", b"\xff\xfe\x00garbage")
    return files


def _sources(root: Path) -> dict:
    relu_line = json.dumps({"task": "level1/1_ReLU.py", "code": HONEST})
    files = {
        "jsonl": _write(root / "run" / "run.jsonl", relu_line + "\n"),
        "jsonl_bad_line": _write(root / "bad" / "run.jsonl", relu_line + "\n{not json\n"),
        "jsonl_no_tasks": _write(root / "orphans" / "run.jsonl", relu_line + "\n"),
        "jsonl_twins": _write(root / "twins" / "run.jsonl",
                              relu_line + "\n" + json.dumps({"task": "level1/1_ReLU.py", "code": HONEST,
                                                             "id": "again"}) + "\n"),
        "select_not_json": _write(root / "select.json", "kernels: all"),
        "audit_no_exclusions": _write(root / "audit.json", json.dumps({"format": AUDIT_FORMAT})),
        "scores_bad": _write(root / "scores.jsonl", json.dumps({"task": "a.py", "correct": "yes", "speedup": 1})),
        # issue 35: a code that is not a string, beside a task that is there (so only the type is wrong)
        "jsonl_code_5": _write(root / "run" / "code5.jsonl", json.dumps({"task": "level1/1_ReLU.py", "code": 5})
                               + "\n"),
        "empty_folder": root / "empty",
    }
    for name in ("run", "bad", "twins"):
        _write(root / name / "level1" / "1_ReLU.py", RELU.read_text())
    files["empty_folder"].mkdir()
    return files


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    root = tmp_path_factory.mktemp("inputs")
    files = {
        "submission": _write(root / "relu_clamp.py", HONEST),
        "binary_submission": _write(root / "binary.py", b"\x89PNG\r\n\x1a\n\xff\xff"),
        "not_a_task": _write(root / "level1" / "1_Nothing.py", "import torch\n\nbatch_size = 4\n"),
        "syntax_error_task": _write(root / "level1" / "2_Broken.py", "class Model(:\n"),
        "a_file": _write(root / "a_file.txt", "I am a file\n"),
        "not_a_task_folder": _write(root / "mixed" / "level1" / "1_Nothing.py", "x = 1\n").parent.parent,
    }
    files.update(_stores(root))
    files.update(_protocol_files(root))
    files.update(_sources(root))
    files.update(_hostile(root / "hostile", files["store"]))
    return World(root=root, files=files)


@pytest.fixture(autouse=True)
def no_workers(monkeypatch):
    """Bad input is refused before any worker: reaching the sandbox fails the case."""
    def refuse(*args, **kwargs):
        raise AssertionError("a worker was started before the bad input was refused")

    monkeypatch.setattr(sandbox, "run_children", refuse)
    monkeypatch.setattr(sandbox, "_forkserver", refuse)


def run_cli(monkeypatch, capsys, args: list) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["kbverify", *map(str, args)])
    with pytest.raises(SystemExit) as done:
        cli.main()
    out, err = capsys.readouterr()
    return done.value.code, out, err


# (id, arguments given the inputs `w` and the case's own folder `o`, words the line must hold, paths under `o` that
# must not exist afterwards). Every case expects exit 2.
CASES = [
    # check: files
    ("check-missing-submission", lambda w, o: ["check", o / "missing.py", "--task", RELU], ["missing.py"], []),
    ("check-folder-without-submissions", lambda w, o: ["check", w.empty_folder, "--task", RELU],
     ["no submission files"], []),
    ("check-unreadable-submission", lambda w, o: ["check", w.binary_submission, "--task", RELU], ["cannot read"], []),
    ("check-missing-task", lambda w, o: ["check", w.submission, "--task", o / "gone.py"], ["gone.py"], []),
    ("check-task-without-model", lambda w, o: ["check", w.submission, "--task", w.not_a_task], ["Model"], []),
    ("check-task-syntax-error", lambda w, o: ["check", w.submission, "--task", w.syntax_error_task],
     ["syntax error"], []),
    ("check-without-task", lambda w, o: ["check", w.submission], ["--task"], []),
    ("check-missing-hidden-tests", lambda w, o: ["check", w.submission, "--task", RELU, "--hidden-tests",
                                                 o / "hidden"], ["--hidden-tests"], []),
    # check: protocols
    ("check-unknown-protocol", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol", "original,fastest"],
     ["fastest"], []),
    ("protocol-atol-text", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol", w.protocol_atol_text],
     ["atol", "number"], []),
    ("protocol-atol-negative", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol",
                                             w.protocol_atol_negative], ["atol", "at least 0"], []),
    ("protocol-unknown-field", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol",
                                             w.protocol_unknown_field], ["speed"], []),
    ("protocol-base-list", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol", w.protocol_base_list],
     ["base"], []),
    ("protocol-trials-zero", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol",
                                           w.protocol_trials_zero], ["trials"], []),
    ("protocol-bool-as-int", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol", w.protocol_guards_int],
     ["guards"], []),
    ("protocol-no-distribution", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol",
                                               w.protocol_no_distribution], ["distributions"], []),
    ("protocol-unknown-distribution", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol",
                                                    w.protocol_bad_distribution], ["gaussian"], []),
    ("protocol-not-json", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol", w.protocol_not_json],
     ["not a protocol file"], []),
    ("protocol-not-an-object", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol", w.protocol_list],
     ["JSON object"], []),
    ("protocol-binary", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol", w.protocol_binary],
     ["not a protocol file"], []),
    ("protocol-name-twice", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol",
                                          f"verified,{w.protocol_named_verified}"], ["both named"], []),
    # check: options
    *[(f"check-timeout-{value}", lambda w, o, value=value: ["check", w.submission, "--task", RELU, "--timeout", value],
       ["--timeout"], []) for value in ("0", "-1", "nan", "inf", "0.01", "soon")],
    ("check-device-gpu", lambda w, o: ["check", w.submission, "--task", RELU, "--device", "gpu"], ["gpu"], []),
    ("check-device-cuda-name", lambda w, o: ["check", w.submission, "--task", RELU, "--device", "cuda:first"],
     ["cuda:first"], []),
    ("check-min-speedup-nan", lambda w, o: ["check", w.submission, "--task", RELU, "--min-speedup", "nan"],
     ["--min-speedup"], []),
    ("check-min-speedup-negative", lambda w, o: ["check", w.submission, "--task", RELU, "--min-speedup", "-2"],
     ["--min-speedup"], []),
    ("check-only-no-such-set", lambda w, o: ["check", w.submission, "--task", RELU, "--only", "original/gaussian"],
     ["--only", "original/gaussian", "verified"], []),
    ("check-only-not-in-every-protocol", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol",
                                                       "kbv,verified", "--only", "original/shifted"], ["kbv"], []),
    ("check-only-under-original", lambda w, o: ["check", w.submission, "--task", RELU, "--protocol", "original",
                                                "--only", "original/x1"], ["--only", "isolated"], []),
    ("check-only-blank", lambda w, o: ["check", w.submission, "--task", RELU, "--only", " "], ["--only"], []),
    ("check-secret-blank", lambda w, o: ["check", w.submission, "--task", RELU, "--secret", ""], ["--secret"], []),
    # rescore: the source and its tasks
    ("rescore-missing-source", lambda w, o: ["rescore", o / "nothing.jsonl", "--store", o / "s.sqlite"],
     ["nothing.jsonl"], ["s.sqlite"]),
    ("rescore-unknown-format", lambda w, o: ["rescore", w.jsonl, "--format", "csv", "--store", o / "s.sqlite"],
     ["csv"], ["s.sqlite"]),
    ("rescore-tasks-one-folder-too-high", lambda w, o: ["rescore", RUN, "--tasks", TASKS, "--store", o / "s.sqlite",
                                                        "--report", o / "report", "--device", "cpu"],
     ["0 of the 11 tasks", "basic holds 11"], ["s.sqlite", "report"]),
    ("rescore-tasks-one-folder-too-low", lambda w, o: ["rescore", RUN, "--tasks", TASKS / "basic" / "level1",
                                                       "--store", o / "s.sqlite", "--device", "cpu"],
     ["0 of the 11 tasks"], ["s.sqlite"]),
    ("rescore-tasks-of-another-run", lambda w, o: ["rescore", RUN, "--tasks", TASKS / "gpu", "--store",
                                                   o / "s.sqlite", "--device", "cpu"],
     ["cannot take the inputs"], ["s.sqlite"]),
    ("rescore-run-without-tasks", lambda w, o: ["rescore", RUN, "--store", o / "s.sqlite"], ["--tasks"],
     ["s.sqlite"]),
    ("rescore-tasks-missing", lambda w, o: ["rescore", RUN, "--tasks", o / "tasks", "--store", o / "s.sqlite"],
     ["--tasks"], ["s.sqlite"]),
    ("rescore-jsonl-with-tasks", lambda w, o: ["rescore", w.jsonl, "--tasks", TASKS / "basic", "--store",
                                               o / "s.sqlite", "--device", "cpu"], ["leave --tasks out"],
     ["s.sqlite"]),
    ("rescore-jsonl-tasks-not-there", lambda w, o: ["rescore", w.jsonl_no_tasks, "--store", o / "s.sqlite",
                                                    "--device", "cpu"], ["0 of the 1 tasks"], ["s.sqlite"]),
    ("rescore-jsonl-bad-line", lambda w, o: ["rescore", w.jsonl_bad_line, "--store", o / "s.sqlite", "--device",
                                             "cpu"], ["run.jsonl:2"], ["s.sqlite"]),
    ("rescore-jsonl-same-sample-twice", lambda w, o: ["rescore", w.jsonl_twins, "--store", o / "s.sqlite",
                                                      "--device", "cpu"], ["'again'"], ["s.sqlite"]),
    # rescore: options
    *[(f"rescore-timeout-{value}", lambda w, o, value=value: ["rescore", w.jsonl, "--store", o / "s.sqlite",
                                                              "--timeout", value], ["--timeout"], ["s.sqlite"])
      for value in ("0", "-1", "nan")],
    *[(f"rescore-limit-{value}", lambda w, o, value=value: ["rescore", w.jsonl, "--store", o / "s.sqlite",
                                                            "--limit", value], ["--limit"], ["s.sqlite"])
      for value in ("0", "-1")],
    ("rescore-samples-worst", lambda w, o: ["rescore", w.jsonl, "--store", o / "s.sqlite", "--samples", "worst"],
     ["--samples"], ["s.sqlite"]),
    ("rescore-device-tpu", lambda w, o: ["rescore", w.jsonl, "--store", o / "s.sqlite", "--device", "tpu"],
     ["tpu"], ["s.sqlite"]),
    ("rescore-bad-protocol-file", lambda w, o: ["rescore", w.jsonl, "--store", o / "s.sqlite", "--protocol",
                                                w.protocol_atol_text], ["atol"], ["s.sqlite"]),
    ("rescore-select-missing", lambda w, o: ["rescore", w.jsonl, "--store", o / "s.sqlite", "--select",
                                             o / "subset.json"], ["subset.json"], ["s.sqlite"]),
    ("rescore-select-malformed", lambda w, o: ["rescore", w.jsonl, "--store", o / "s.sqlite", "--select",
                                               w.select_not_json, "--device", "cpu"], ["not a subset file"],
     ["s.sqlite"]),
    ("rescore-exclusions-missing", lambda w, o: ["rescore", w.jsonl, "--store", o / "s.sqlite",
                                                 "--exclude-degenerate", o / "audit.json"], ["audit.json"],
     ["s.sqlite"]),
    ("rescore-exclusions-malformed", lambda w, o: ["rescore", w.jsonl, "--store", o / "s.sqlite",
                                                   "--exclude-degenerate", w.audit_no_exclusions, "--device", "cpu"],
     ["exclusions"], ["s.sqlite"]),
    ("rescore-report-is-a-file", lambda w, o: ["rescore", w.jsonl, "--store", o / "s.sqlite", "--report", w.a_file],
     ["--report", "not a folder"], ["s.sqlite"]),
    # rescore: the store
    ("rescore-store-is-a-folder", lambda w, o: ["rescore", w.jsonl, "--store", w.empty_folder], ["--store"], []),
    ("rescore-store-under-a-file", lambda w, o: ["rescore", w.jsonl, "--store", w.a_file / "s.sqlite"],
     ["is a file"], []),
    ("rescore-store-foreign-db", lambda w, o: ["rescore", w.jsonl, "--store", w.foreign_db, "--device", "cpu"],
     ["not a kbverify store"], []),
    ("rescore-store-corrupted", lambda w, o: ["rescore", w.jsonl, "--store", w.corrupted_store, "--device", "cpu"],
     ["does not read back"], []),
    ("rescore-store-holds-another-version", lambda w, o: ["rescore", w.jsonl, "--store", w.store, "--protocol",
                                                          "original", "--device", "cpu", "--report", o / "report"],
     ["another version", "level1/1_ReLU", "new store"], ["report"]),
    # score
    *[(f"score-p-{name}", lambda w, o, value=value: ["score", w.store, "--p", value], ["--p"], [])
      for name, value in (("negative", "-1"), ("nan", "nan"), ("empty", ","), ("twice", "0,1,0"),
                          ("word", "0,one"), ("inf", "0,inf"))],
    ("score-missing", lambda w, o: ["score", o / "nothing.jsonl"], ["nothing.jsonl"], []),
    ("score-folder", lambda w, o: ["score", w.empty_folder], ["not a file"], []),
    ("score-level-without-baseline", lambda w, o: ["score", w.scores_bad, "--level", "1"], ["--level"], []),
    ("score-baseline-without-level", lambda w, o: ["score", w.scores_bad, "--baseline", w.a_file], ["--level"], []),
    ("score-baseline-missing", lambda w, o: ["score", w.scores_bad, "--baseline", o / "b.json", "--level", "1"],
     ["b.json"], []),
    ("score-level-zero", lambda w, o: ["score", w.scores_bad, "--baseline", w.a_file, "--level", "0"], ["--level"],
     []),
    ("score-samples-worst", lambda w, o: ["score", w.store, "--samples", "worst"], ["--samples"], []),
    ("score-corrupted-store", lambda w, o: ["score", w.corrupted_store], ["does not read back"], []),
    ("score-foreign-db", lambda w, o: ["score", w.foreign_db], ["not a kbverify store"], []),
    ("score-malformed-line", lambda w, o: ["score", w.scores_bad], ["scores.jsonl:1", "correct"], []),
    # report, rejudge
    ("report-out-is-a-file", lambda w, o: ["report", w.store, "--out", w.a_file], ["--out", "not a folder"], []),
    ("report-out-under-a-file", lambda w, o: ["report", w.store, "--out", w.a_file / "report"], ["is a file"], []),
    ("report-missing-store", lambda w, o: ["report", o / "none.sqlite", "--out", o / "report"], ["none.sqlite"],
     ["report"]),
    ("report-corrupted-store", lambda w, o: ["report", w.corrupted_store, "--out", o / "report"],
     ["does not read back"], ["report"]),
    ("report-foreign-db", lambda w, o: ["report", w.foreign_db, "--out", o / "report"], ["not a kbverify store"],
     ["report"]),
    ("report-text-file", lambda w, o: ["report", w.text_file_store, "--out", o / "report"], ["not a kbverify store"],
     ["report"]),
    ("rejudge-into-exists", lambda w, o: ["rejudge", w.store, "--into", w.a_file], ["--into", "exists"], []),
    ("rejudge-two-protocols", lambda w, o: ["rejudge", w.store, "--protocol", "kbv,verified"], ["one protocol"], []),
    ("rejudge-corrupted-store", lambda w, o: ["rejudge", w.corrupted_store, "--into", o / "copy.sqlite"],
     ["does not read back"], ["copy.sqlite"]),
    ("rejudge-missing-store", lambda w, o: ["rejudge", o / "none.sqlite"], ["none.sqlite"], ["none.sqlite"]),
    # demo, audit, hidden
    ("demo-out-is-a-file", lambda w, o: ["demo", "--out", w.a_file], ["--out", "not a folder"], []),
    ("demo-out-under-a-file", lambda w, o: ["demo", "--out", w.a_file / "demo"], ["is a file"], []),
    ("audit-missing-tasks", lambda w, o: ["audit", o / "tasks", "--out", o / "audit"], ["tasks"], ["audit.json"]),
    ("audit-not-a-task", lambda w, o: ["audit", w.not_a_task_folder, "--out", o / "audit"], ["not a task"],
     ["audit.json"]),
    ("audit-out-under-a-file", lambda w, o: ["audit", RELU, "--out", w.a_file / "audit"], ["is a file"], []),
    ("audit-bad-protocol", lambda w, o: ["audit", RELU, "--protocol", w.protocol_trials_zero], ["trials"], []),
    ("hidden-missing-tasks", lambda w, o: ["hidden", "generate", o / "tasks", "--out", o / "hidden"], ["tasks"],
     ["hidden"]),
    ("hidden-out-is-a-file", lambda w, o: ["hidden", "generate", RELU, "--out", w.a_file], ["not a folder"], []),
    ("unknown-command", lambda w, o: ["frobnicate"], ["frobnicate"], []),
    # issue 35: outputs under a folder nothing can be created in (root passes every permission check there)
    ("rescore-report-under-proc", lambda w, o: ["rescore", w.jsonl, "--store", o / "s.sqlite", "--device", "cpu",
                                                "--report", "/proc/kbverify-nothing/report"],
     ["--report", "nothing can be created in /proc"], ["s.sqlite"]),
    ("rescore-store-under-proc", lambda w, o: ["rescore", w.jsonl, "--store", "/proc/kbverify-nothing/s.sqlite"],
     ["--store", "/proc"], []),
    ("report-out-under-proc", lambda w, o: ["report", w.store, "--out", "/proc/kbverify-nothing/report"],
     ["--out", "nothing can be created in /proc"], []),
    ("audit-out-under-proc", lambda w, o: ["audit", RELU, "--out", "/proc/kbverify-nothing/audit"],
     ["--out", "nothing can be created in /proc"], []),
    ("hidden-out-under-proc", lambda w, o: ["hidden", "generate", RELU, "--out", "/proc/kbverify-nothing/hidden"],
     ["--out", "nothing can be created in /proc"], []),
    ("demo-out-under-proc", lambda w, o: ["demo", "--out", "/proc/kbverify-nothing/demo"],
     ["--out", "nothing can be created in /proc"], []),
    ("demo-out-under-sys", lambda w, o: ["demo", "--out", "/sys/kbverify-nothing"], ["--out", "/sys"], []),
    ("check-submission-name-of-300-characters", lambda w, o: ["check", o / ("s" * 300 + ".py"), "--task", RELU],
     ["File name too long"], []),
    ("report-out-name-of-300-characters", lambda w, o: ["report", w.store, "--out", o / ("r" * 300)],
     ["--out", "File name too long"], []),
    ("compare-protocol-bogus", lambda w, o: ["compare", w.store, w.store, "--protocol", "bogus"],
     ["--protocol bogus", "no protocol of that name", "original"], []),
    *[(f"check-secret-{name}", lambda w, o, value=value: _check(w, o, "--secret", value), ["--secret", "16 hex"], [])
      for name, value in (("word", "xyz"), ("15-digits", "cdcd3481e7edb9a"), ("17-digits", "cdcd3481e7edb9a7a"),
                          ("not-hex", "cdcd3481e7edb9ag"), ("prefixed", "0xcdcd3481e7edb9"))],
    ("rescore-jsonl-code-a-number", lambda w, o: ["rescore", w.jsonl_code_5, "--store", o / "s.sqlite", "--device",
                                                  "cpu"], ["code5.jsonl:1", "code must be a string"], ["s.sqlite"]),
    ("score-eval-results-without-baseline", lambda w, o: ["score", RUN / "eval_results.json"],
     ["eval_results.json", "--baseline", "docs/formats.md"], []),
    ("no-arguments", lambda w, o: [], ["usage: kbverify COMMAND", "check"], []),
    ("hidden-without-subcommand", lambda w, o: ["hidden"], ["usage: kbverify COMMAND"], []),
    ("empty-out-is-not-the-current-folder", lambda w, o: ["report", w.store, "--out", ""],
     ["--out", "empty value"], []),
    ("rescore-source-a-fifo", lambda w, o: ["rescore", (os.mkfifo(o / "fifo") or o / "fifo"), "--store",
                                            o / "s.sqlite"], ["neither a regular file nor a folder"], ["s.sqlite"]),
    ("check-task-name-with-a-newline", lambda w, o: ["check", w.submission, "--task", _write(o.parent / "a\nb.py",
                                                                                             "x = 1\n")],
     ["a\\nb.py"], []),
    ("audit-estimate-only-without-footprints", lambda w, o: ["audit", RELU, "--out", o / "audit", "--estimate-only"],
     ["--footprints"], ["audit.json"]),
]


# --- hostile files and option values, over every command (issue 21's fuzz suite) ------------------------------------

def _loop(root: Path, name: str) -> Path:
    """`name` → `name.other` → `name`: a symlink loop, which exists() calls missing and open() calls ELOOP."""
    first, second = root / name, root / f"{name}.other"
    first.symlink_to(second.name)
    second.symlink_to(first.name)
    return first


def _truncated(path: Path, target: Path, size: int) -> Path:
    target.write_bytes(path.read_bytes()[:size])
    return target


def _hostile(root: Path, good_store: Path) -> dict:
    root.mkdir()
    latin1 = "# caf\xe9\n".encode("latin-1")
    relu_line = json.dumps({"task": "level1/1_ReLU.py", "code": HONEST})
    files = {f"loop_{name}": _loop(root, name) for name in ("sub.py", "task.py", "store.sqlite", "run.jsonl",
                                                            "protocol.json", "select.json", "scores.jsonl", "out")}
    files.update({
        "latin1_submission": _write(root / "latin1.py", latin1 + HONEST.encode()),
        "huge_submission": _write(root / "huge.py", b"#" * (1 << 20) + b"\xff\n"),
        "empty_task": _write(root / "level1" / "3_Empty.py", ""),
        "binary_task": _write(root / "level1" / "4_Binary.py", b"\x00\x01\x02\xff\xfe"),
        "latin1_task": _write(root / "level1" / "5_Latin.py", latin1 + RELU.read_bytes()),
        "task_folder_binary": _write(root / "binary_tasks" / "level1" / "1_Bin.py", b"\xff\xfe\x00").parent.parent,
        "empty_protocol": _write(root / "p_empty.json", ""),
        "null_protocol": _write(root / "p_null.json", "null"),
        "huge_protocol": _write(root / "p_huge.json", "[" * 100000),
        "empty_store": _write(root / "empty.sqlite", b""),
        "header_only_store": _truncated(good_store, root / "header.sqlite", 100),
        "half_store": _truncated(good_store, root / "half.sqlite", good_store.stat().st_size // 2),
        "garbage_store": _write(root / "garbage.sqlite", b"SQLite format 3\x00" + b"\xff" * 4000),
        "empty_jsonl": _write(root / "empty" / "run.jsonl", ""),
        "binary_jsonl": _write(root / "binary" / "run.jsonl", b"\x89PNG\r\n\x1a\n\xff\xff\x00"),
        "latin1_jsonl": _write(root / "latin1" / "run.jsonl", b'{"task": "caf\xe9.py", "code": "x"}\n'),
        "huge_line_jsonl": _write(root / "hugeline" / "run.jsonl", '{"task": "' + "a" * (4 << 20) + '"'),
        "truncated_jsonl": _write(root / "truncated" / "run.jsonl", relu_line[:len(relu_line) // 2]),
        "select_empty": _write(root / "select_empty.json", ""),
        "select_binary": _write(root / "select_binary.json", b"\xff\xfe\x00"),
        "scores_empty": _write(root / "scores_empty.jsonl", ""),
        "scores_binary": _write(root / "scores_binary.jsonl", b"\xff\xfe\x00\x01"),
        "baseline_binary": _write(root / "baseline.json", b"\xff\xfe\x00"),
        "eval_results_bad": _write(root / "eval_results.json", "{truncated"),
        "audit_binary": _write(root / "audit_binary.json", b"\xff\x00"),
        "audit_list": _write(root / "audit_list.json", "[]"),
    })
    for name, row in {
        "list": [1, 2], "number": 7, "string": "task", "null": None, "task_number": {"task": 1, "code": "x"},
        "task_empty": {"task": "", "code": "x"}, "task_null": {"task": None, "code": "x"},
        "no_code": {"task": "level1/1_ReLU.py"}, "no_task": {"code": HONEST},
        "code_number": {"task": "level1/1_ReLU.py", "code": 5}, "code_list": {"task": "level1/1_ReLU.py", "code": []},
        "path_number": {"task": "level1/1_ReLU.py", "path": 3}, "id_list": {"task": "level1/1_ReLU.py", "code": "x",
                                                                             "id": []},
        "id_bool": {"task": "level1/1_ReLU.py", "code": "x", "id": True},
        "sample_text": {"task": "level1/1_ReLU.py", "code": "x", "sample": "zero"},
        "sample_float": {"task": "level1/1_ReLU.py", "code": "x", "sample": 0.5},
        "level_text": {"task": "level1/1_ReLU.py", "code": "x", "level": "one"},
        "claimed_text": {"task": "level1/1_ReLU.py", "code": "x", "claimed_speedup": "fast"},
        "ref_code_number": {"task": "level1/1_ReLU.py", "code": "x", "ref_code": 1},
        "label_dict": {"task": "level1/1_ReLU.py", "code": "x", "model": {"name": "gpt"}},
    }.items():
        files[f"jsonl_{name}"] = _write(root / f"jsonl_{name}" / "run.jsonl", json.dumps(row) + "\n")
    for name, body in {"kernels_text": {"kernels": "all"}, "kernels_numbers": {"kernels": [1]},
                       "level_text": {"kernels": [{"level_id": "one", "task_id": 1}]}, "no_kernels": {},
                       "list": [1], "not_in_source": {"kernels": [{"level_id": 9, "task_id": 9}]}}.items():
        files[f"select_{name}"] = _write(root / f"select_{name}.json", json.dumps(body))
    for name, body in {"atol_true": {"atol": True}, "atol_null": {"atol": None}, "rtol_text": {"rtol": "x"},
                       "atol_nan": {"atol": float("nan")}, "trials_float": {"base": "kbv", "trials": 1.5},
                       "trials_true": {"base": "kbv", "trials": True}, "base_number": {"base": 1},
                       "base_unknown": {"base": "fastest"}, "distributions_text": {"distributions": "x1"},
                       "name_number": {"base": "kbv", "name": 3}, "name_empty": {"base": "kbv", "name": ""},
                       "nested": {"base": {"base": "kbv"}}}.items():
        files[f"protocol_{name}"] = _write(root / f"p_{name}.json", json.dumps(body))
    for name, row in {"list": [1], "correct_text": {"task": "a.py", "correct": "yes", "speedup": 1},
                      "speedup_text": {"task": "a.py", "correct": True, "speedup": "fast"},
                      "speedup_negative": {"task": "a.py", "correct": True, "speedup": -1},
                      "no_speedup": {"task": "a.py", "correct": True},
                      "task_number": {"task": 3, "correct": True, "speedup": 1}}.items():
        files[f"scores_{name}"] = _write(root / f"scores_{name}.jsonl", json.dumps(row) + "\n")
    for name, body in {"exclusions_text": {"format": AUDIT_FORMAT, "exclusions": "all"},
                       "wrong_format": {"format": "something-else", "exclusions": []}}.items():
        files[f"audit_{name}"] = _write(root / f"audit_{name}.json", json.dumps(body))
    for name, record in {"list": "[1]", "number": "3", "null": "null", "speedup_text": None,
                         "missing_task": None}.items():
        path = root / f"record_{name}.sqlite"
        path.write_bytes(good_store.read_bytes())
        with sqlite3.connect(path) as db:
            if record is None:
                (stored,) = db.execute("SELECT record FROM verdicts").fetchone()
                body = json.loads(stored)
                body.update({"speedup": "fast"} if name == "speedup_text" else {})
                body.pop("task") if name == "missing_task" else None
                record = json.dumps(body)
            db.execute("UPDATE verdicts SET record = ?", (record,))
        files[f"record_{name}"] = path
    files["tasks_in_loop_folder"] = root / "tasks_loop"
    files["tasks_in_loop_folder"].mkdir()
    _loop(files["tasks_in_loop_folder"], "1_Loop.py")
    return files


def _for_each(prefix: str, names, build, words=lambda name: [], not_written=()) -> list:
    """One case per name: `build(w, o, name)` gives the arguments."""
    return [(f"{prefix}-{name}", lambda w, o, name=name: build(w, o, name), words(name), list(not_written))
            for name in names]


def _check(w, o, *more):
    return ["check", w.submission, "--task", RELU, *more]


def _rescore(w, o, *more):
    return ["rescore", w.jsonl, "--store", o / "s.sqlite", "--device", "cpu", *more]


STORE_FILES = ("loop_store.sqlite", "header_only_store", "half_store", "garbage_store", "record_list", "record_number", "record_null", "record_speedup_text",
               "record_missing_task")
JSONL_ROWS = ("empty_jsonl", "binary_jsonl", "latin1_jsonl", "huge_line_jsonl", "truncated_jsonl", "jsonl_list",
              "jsonl_number", "jsonl_string", "jsonl_null", "jsonl_task_number", "jsonl_task_empty", "jsonl_task_null",
              "jsonl_no_code", "jsonl_no_task", "jsonl_code_number", "jsonl_code_list", "jsonl_path_number",
              "jsonl_id_list", "jsonl_id_bool", "jsonl_sample_text", "jsonl_sample_float", "jsonl_level_text",
              "jsonl_claimed_text", "jsonl_ref_code_number", "jsonl_label_dict")
BAD_PROTOCOLS = ("loop_protocol.json", "empty_protocol", "null_protocol", "huge_protocol", "protocol_atol_true",
                 "protocol_atol_null", "protocol_rtol_text", "protocol_atol_nan", "protocol_trials_float",
                 "protocol_trials_true", "protocol_base_number", "protocol_base_unknown",
                 "protocol_distributions_text", "protocol_name_number", "protocol_name_empty", "protocol_nested")

FUZZ = [
    # check: the submission and the task
    *_for_each("check-submission", ("loop_sub.py", "latin1_submission", "huge_submission"),
               lambda w, o, name: ["check", getattr(w, name), "--task", RELU]),
    *_for_each("check-task", ("loop_task.py", "empty_task", "binary_task", "latin1_task", "a_file"),
               lambda w, o, name: ["check", w.submission, "--task", getattr(w, name)]),
    ("check-task-is-a-folder", lambda w, o: ["check", w.submission, "--task", TASKS], [], []),
    # check, rescore, audit, rejudge: protocol files
    *_for_each("check-protocol", BAD_PROTOCOLS, lambda w, o, name: _check(w, o, "--protocol", getattr(w, name))),
    *_for_each("check-protocol-spec", ("", ",", "VERIFIED", "verified,nothing.json", "original;kbv"),
               lambda w, o, name: _check(w, o, "--protocol", name)),
    *_for_each("audit-protocol", ("empty_protocol", "protocol_atol_true"),
               lambda w, o, name: ["audit", RELU, "--protocol", getattr(w, name)]),
    *_for_each("rejudge-protocol", ("fastest", "empty_protocol", "protocol_base_unknown"),
               lambda w, o, name: ["rejudge", w.store, "--protocol",
                                   w.files.get(name, name), "--into", o / "copy.sqlite"], not_written=["copy.sqlite"]),
    # check: option values
    *_for_each("check-hang-floor", ("-1", "nan", "inf", "soon"), lambda w, o, v: _check(w, o, "--hang-floor", v),
               lambda v: ["--hang-floor"]),
    *_for_each("check-option", ("--timeout", "--min-speedup", "--protocol", "--task", "--only"),
               lambda w, o, option: ["check", w.submission, "--task", RELU, option]),
    *_for_each("check-device", ("", "cuda:-1", "CUDA", "cuda:0:1", "cpu "),
               lambda w, o, v: _check(w, o, "--device", v)),
    ("check-min-speedup-inf", lambda w, o: _check(w, o, "--min-speedup", "inf"), ["--min-speedup"], []),
    ("check-secret-two-words", lambda w, o: _check(w, o, "--secret", "two words"), ["--secret"], []),
    ("check-unknown-option", lambda w, o: _check(w, o, "--fast"), ["--fast"], []),
    ("check-hidden-tests-is-a-file", lambda w, o: _check(w, o, "--hidden-tests", w.a_file), ["--hidden-tests"], []),
    ("check-hidden-tests-loop", lambda w, o: _check(w, o, "--hidden-tests", w.loop_out), ["--hidden-tests"], []),
    # rescore: sources
    *_for_each("rescore-jsonl", JSONL_ROWS, lambda w, o, name: ["rescore", getattr(w, name), "--store",
                                                                 o / "s.sqlite", "--device", "cpu"],
               not_written=["s.sqlite"]),
    ("rescore-source-loop", lambda w, o: ["rescore", w.files["loop_run.jsonl"], "--store", o / "s.sqlite"], [],
     ["s.sqlite"]),
    ("rescore-source-binary-file", lambda w, o: ["rescore", w.binary_submission, "--store", o / "s.sqlite",
                                                 "--device", "cpu"], [], ["s.sqlite"]),
    ("rescore-format-jsonl-of-a-folder", lambda w, o: ["rescore", RUN, "--format", "jsonl", "--store",
                                                       o / "s.sqlite", "--device", "cpu"], [], ["s.sqlite"]),
    ("rescore-format-kernelbench-of-a-file", lambda w, o: ["rescore", w.jsonl, "--format", "kernelbench",
                                                           "--tasks", TASKS / "basic", "--store", o / "s.sqlite",
                                                           "--device", "cpu"], [], ["s.sqlite"]),
    ("rescore-format-cuda-l1-of-generic", lambda w, o: ["rescore", w.jsonl, "--format", "cuda-l1", "--store",
                                                        o / "s.sqlite", "--device", "cpu"], [], ["s.sqlite"]),
    ("rescore-tasks-is-a-file", lambda w, o: ["rescore", RUN, "--tasks", w.a_file, "--store", o / "s.sqlite"],
     ["--tasks"], ["s.sqlite"]),
    ("rescore-tasks-binary", lambda w, o: ["rescore", RUN, "--tasks", w.task_folder_binary, "--store",
                                           o / "s.sqlite", "--device", "cpu"], [], ["s.sqlite"]),
    # rescore: the files its options name
    *_for_each("rescore-select", ("loop_select.json", "select_empty", "select_binary", "select_kernels_text",
                                  "select_kernels_numbers", "select_level_text", "select_no_kernels", "select_list",
                                  "select_not_in_source"),
               lambda w, o, name: _rescore(w, o, "--select", getattr(w, name)), not_written=["s.sqlite"]),
    *_for_each("rescore-exclusions", ("audit_binary", "audit_list", "audit_exclusions_text", "audit_wrong_format"),
               lambda w, o, name: _rescore(w, o, "--exclude-degenerate", getattr(w, name)),
               not_written=["s.sqlite"]),
    *_for_each("rescore-protocol", ("loop_protocol.json", "protocol_atol_nan", "protocol_nested"),
               lambda w, o, name: _rescore(w, o, "--protocol", getattr(w, name)), not_written=["s.sqlite"]),
    *_for_each("rescore-store", STORE_FILES, lambda w, o, name: _rescore(w, o, "--store", getattr(w, name))),
    ("rescore-hidden-tests-missing", lambda w, o: _rescore(w, o, "--hidden-tests", o / "none"), ["--hidden-tests"],
     ["s.sqlite"]),
    # rescore: option values
    *_for_each("rescore-option", ("--timeout abc", "--limit abc", "--limit 1.5", "--format ", "--samples ",
                                  "--clock moon", "--group-by ", "--group-by bad-field!", "--group-by task",
                                  "--group-by correct", "--executor spark", "--ray-address x",
                                  "--executor local --ray-address x", "--timeout inf", "--device cuda:x",
                                  "--report", "--share-gpu 0", "--share-gpu 9", "--share-gpu two", "--share-gpu 1.5"),
               lambda w, o, spec: _rescore(w, o, *spec.split(" ", 1)) if " " in spec else _rescore(w, o, spec),
               not_written=["s.sqlite"]),
    ("rescore-report-loop", lambda w, o: _rescore(w, o, "--report", w.loop_out), ["--report"], ["s.sqlite"]),
    # score
    # an empty file is a store to write (rescore starts one there), not one to read
    *_for_each("read-empty-store", ("score", "report", "rejudge"), lambda w, o, command: [
        command, w.empty_store, *(["--out", o / "report"] if command == "report" else [])],
               lambda command: ["not a kbverify store", "empty file"]),
    *_for_each("score-store", STORE_FILES, lambda w, o, name: ["score", getattr(w, name)]),
    *_for_each("score-jsonl", ("loop_scores.jsonl", "scores_empty", "scores_binary", "scores_list",
                               "scores_correct_text", "scores_speedup_text", "scores_speedup_negative",
                               "scores_no_speedup", "scores_task_number", "binary_submission"),
               lambda w, o, name: ["score", getattr(w, name)]),
    ("score-eval-results-malformed", lambda w, o: ["score", w.eval_results_bad, "--baseline", w.a_file, "--level",
                                                   "1"], [], []),
    ("score-baseline-binary", lambda w, o: ["score", w.eval_results_bad, "--baseline", w.baseline_binary, "--level",
                                            "1"], [], []),
    ("score-baseline-with-group-by", lambda w, o: ["score", w.eval_results_bad, "--baseline", w.a_file, "--level",
                                                   "1", "--group-by", "model"], ["--group-by"], []),
    *_for_each("score-option", ("--p", "--level abc", "--clock moon", "--samples ", "--group-by ",
                                "--exclude-degenerate"),
               lambda w, o, spec: ["score", w.store, *spec.split(" ", 1)]),
    *_for_each("score-exclusions", ("audit_binary", "audit_list", "audit_exclusions_text", "audit_no_exclusions"),
               lambda w, o, name: ["score", w.store, "--exclude-degenerate", getattr(w, name)]),
    # report
    *_for_each("report-store", STORE_FILES, lambda w, o, name: ["report", getattr(w, name), "--out", o / "report"],
               not_written=["report"]),
    ("report-store-is-a-folder", lambda w, o: ["report", w.empty_folder, "--out", o / "report"], [], ["report"]),
    ("report-out-loop", lambda w, o: ["report", w.store, "--out", w.loop_out], ["--out"], []),
    ("report-without-out", lambda w, o: ["report", w.store], ["--out"], []),
    ("report-clock-moon", lambda w, o: ["report", w.store, "--out", o / "report", "--clock", "moon"], ["--clock"],
     ["report"]),
    ("report-group-by-bad", lambda w, o: ["report", w.store, "--out", o / "report", "--group-by", "a b"],
     ["--group-by"], ["report"]),
    # rejudge
    ("rejudge-store-foreign-db", lambda w, o: ["rejudge", w.foreign_db], ["not a kbverify store"], []),
    ("rejudge-store-text-file", lambda w, o: ["rejudge", w.text_file_store], ["not a kbverify store"], []),
    ("score-store-text-file", lambda w, o: ["score", w.text_file_store], ["not a kbverify store"], []),
    ("rescore-store-text-file", lambda w, o: _rescore(w, o, "--store", w.text_file_store), ["not a kbverify store"],
     []),
    *_for_each("rejudge-store", STORE_FILES, lambda w, o, name: ["rejudge", getattr(w, name), "--into",
                                                                  o / "copy.sqlite"], not_written=["copy.sqlite"]),
    ("rejudge-store-is-a-folder", lambda w, o: ["rejudge", w.empty_folder], [], []),
    ("rejudge-into-under-a-file", lambda w, o: ["rejudge", w.store, "--into", w.a_file / "copy.sqlite"], ["--into"],
     []),
    ("rejudge-into-loop", lambda w, o: ["rejudge", w.store, "--into", w.loop_out], ["--into"], []),
    # audit
    *_for_each("audit-tasks", ("loop_task.py", "empty_task", "binary_task", "latin1_task", "task_folder_binary",
                               "tasks_in_loop_folder", "empty_folder", "a_file"),
               lambda w, o, name: ["audit", getattr(w, name), "--out", o / "audit"], not_written=["audit.json"]),
    *_for_each("audit-option", ("--device tpu", "--hidden-tests /nonexistent/hidden", "--out"),
               lambda w, o, spec: ["audit", RELU, *spec.split(" ", 1)]),
    ("audit-out-json-is-a-folder", lambda w, o: ["audit", RELU, "--out", (o / "a.json").mkdir() or o / "a"],
     ["--out"], []),
    # hidden generate
    *_for_each("hidden-tasks", ("loop_task.py", "empty_task", "binary_task", "task_folder_binary",
                                "tasks_in_loop_folder", "empty_folder"),
               lambda w, o, name: ["hidden", "generate", getattr(w, name), "--out", o / "hidden"],
               not_written=["hidden"]),
    ("hidden-out-loop", lambda w, o: ["hidden", "generate", RELU, "--out", w.loop_out], [], []),
    ("hidden-out-under-a-file", lambda w, o: ["hidden", "generate", RELU, "--out", w.a_file / "h"], [], []),
    ("hidden-without-out", lambda w, o: ["hidden", "generate", RELU], ["--out"], []),
    ("hidden-unknown-subcommand", lambda w, o: ["hidden", "delete"], ["delete"], []),
    # demo
    ("demo-out-loop", lambda w, o: ["demo", "--out", w.loop_out], ["--out"], []),
    ("demo-report-is-a-file", lambda w, o: ["demo", "--out", _write(o / "demo" / "report", "x").parent], [], []),
    ("demo-store-is-a-folder", lambda w, o: ["demo", "--out", (o / "demo2" / "store.sqlite").mkdir(parents=True)
                                             or o / "demo2"], [], []),
    ("demo-unknown-option", lambda w, o: ["demo", "--fast"], ["--fast"], []),
]
CASES = CASES + FUZZ


@pytest.mark.parametrize("arguments, words, not_written", [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(world, tmp_path, monkeypatch, capsys, arguments, words, not_written):
    out = tmp_path / "out"
    out.mkdir()
    code, stdout, stderr = run_cli(monkeypatch, capsys, arguments(world, out))
    assert code == 2, (code, stdout[-2000:], stderr[-2000:])
    assert "Traceback" not in stdout + stderr
    assert stdout == ""
    assert len(stderr.splitlines()) == 1 and stderr.startswith("kbverify: "), stderr[-2000:]
    for word in words:
        assert word in stderr, (word, stderr)
    for name in not_written:
        assert not (out / name).exists(), f"{name} was written"


def test_the_store_holding_another_version_was_left_as_it_was(world, monkeypatch, capsys):
    before = world.store.read_bytes()
    code, _, _ = run_cli(monkeypatch, capsys, ["rescore", world.jsonl, "--store", world.store, "--protocol",
                                              "original", "--device", "cpu"])
    assert code == 2
    with Store(world.store) as store:
        assert [key for key, _ in store.verdicts()] == ["another-version-of-relu"] and len(store.runs()) == 1
    assert world.store.read_bytes()[:100] == before[:100]


def test_there_are_enough_cases():
    assert len(CASES) >= 150 and len({case[0] for case in CASES}) == len(CASES)


# --- what a rescore that goes ahead says about its input (no worker: every unit is unverifiable) --------------------

@pytest.fixture
def no_probe(monkeypatch):
    """rescore asks a worker for this machine's versions and starts the worker server; neither is needed here."""
    from kbverify.harness import provenance

    monkeypatch.setattr(provenance, "collect", lambda device: dict(MACHINE, device=device))
    monkeypatch.setattr(sandbox, "start_early", lambda **kwargs: None)


def _run_folder(root: Path, kernels: dict[str, str]) -> Path:
    for name, code in kernels.items():
        _write(root / f"level_1_problem_{name}_sample_0_kernel.py", code)
    return root


def test_a_rescore_lists_the_files_it_could_not_use_and_the_tasks_it_did_not_find(tmp_path, monkeypatch, capsys,
                                                                                    no_probe):
    run = _run_folder(tmp_path / "run", {"1": "None", "2": "None", "99": "None"})
    _write(run / "eval_results.json", "{truncated")
    code, stdout, _ = run_cli(monkeypatch, capsys, ["rescore", run, "--tasks", TASKS / "basic", "--store",
                                                    tmp_path / "s.sqlite", "--protocol", "original", "--device",
                                                    "cpu", "--json"])
    assert code == 0
    summary = json.loads(stdout)
    assert [Path(file["path"]).name for file in summary["skipped_files"]] == ["eval_results.json"]
    assert "not JSON" in summary["skipped_files"][0]["reason"]
    assert summary["tasks_not_found"] == ["level1/99"] and summary["units"] == 3
    text_code, text, _ = run_cli(monkeypatch, capsys, ["rescore", run, "--tasks", TASKS / "basic", "--store",
                                                       tmp_path / "s.sqlite", "--protocol", "original", "--device",
                                                       "cpu"])
    assert text_code == 0 and "not read: " in text
    assert "tasks not found (1, their entries unverifiable): level1/99" in text


def test_a_second_different_rescore_is_refused_and_the_store_still_scores_and_reports(tmp_path, monkeypatch, capsys,
                                                                                      no_probe):
    run = _run_folder(tmp_path / "run", {"1": "None", "2": "None"})
    store = tmp_path / "s.sqlite"
    arguments = ["--tasks", TASKS / "basic", "--store", store, "--protocol", "original", "--device", "cpu"]
    assert run_cli(monkeypatch, capsys, ["rescore", run, *arguments])[0] == 0
    _write(run / "level_1_problem_1_sample_0_kernel.py", HONEST)  # the same sample of the same task, another kernel
    code, stdout, stderr = run_cli(monkeypatch, capsys, ["rescore", run, *arguments])
    assert code == 2 and stdout == "" and len(stderr.splitlines()) == 1
    assert "1 of this run's 2 units are already there in another version" in stderr and "new store" in stderr
    assert run_cli(monkeypatch, capsys, ["score", store, "--json"])[0] == 0
    assert run_cli(monkeypatch, capsys, ["report", store, "--out", tmp_path / "report"])[0] == 0
    # into a store of its own it goes ahead (it would evaluate the new kernel: stop at the first worker, which
    # the command line reports as its own failure, exit 3)
    code, _, stderr = run_cli(monkeypatch, capsys, ["rescore", run, "--tasks", TASKS / "basic", "--store",
                                                    tmp_path / "new.sqlite", "--protocol", "original", "--device",
                                                    "cpu"])
    assert code == 3 and "a worker was started" in stderr


# --- issue 35: what is not bad input is read as it should be; the fuzz stays clean ----------------------------------

BOM_SOURCE = "\ufeff" + HONEST


def test_a_submission_with_a_byte_order_mark_is_read_as_python_reads_it(tmp_path):
    from kbverify.core.submissions import load_submission

    path = _write(tmp_path / "bom.py", BOM_SOURCE.encode("utf-8"))
    submission = load_submission(path)
    assert submission.source == HONEST  # the mark is gone, as `python bom.py` drops it
    compile(submission.source, "bom.py", "exec")
    declared = _write(tmp_path / "latin.py", b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + HONEST.encode())
    assert "caf\u00e9" in load_submission(declared).source


def test_a_task_with_a_byte_order_mark_is_read_as_python_reads_it(tmp_path):
    from kbverify.core.tasks import load_task

    path = _write(tmp_path / "1_ReLU.py", b"\xef\xbb\xbf" + RELU.read_bytes())
    assert load_task(path).source == RELU.read_text()


def test_a_run_folder_and_a_jsonl_read_kernels_with_a_byte_order_mark(tmp_path):
    from kbverify.rescore.importers import read_source

    run = _run_folder(tmp_path / "run", {"1": HONEST})
    _write(run / "level_1_problem_1_sample_0_kernel.py", BOM_SOURCE.encode("utf-8"))
    (entry,) = read_source(run, tasks_dir=TASKS / "basic").entries
    assert entry.unverifiable is None and entry.submission.source == HONEST
    jsonl = tmp_path / "generic" / "run.jsonl"
    _write(tmp_path / "generic" / "level1" / "1_ReLU.py", RELU.read_text())
    _write(tmp_path / "generic" / "kernel.py", BOM_SOURCE.encode("utf-8"))
    _write(jsonl, json.dumps({"task": "level1/1_ReLU.py", "path": "kernel.py"}) + "\n")
    (entry,) = read_source(jsonl).entries
    assert entry.unverifiable is None and entry.submission.source == HONEST


def test_a_secret_of_16_hex_digits_is_taken_in_either_case(world, tmp_path):
    from kbverify.cli import validate

    assert validate.run_secret("CDCD3481E7EDB9A7") == "cdcd3481e7edb9a7"
    assert validate.run_secret("cdcd3481e7edb9a7") == "cdcd3481e7edb9a7"


def test_the_bundled_baseline_scores_the_bundled_eval_results(monkeypatch, capsys):
    code, stdout, stderr = run_cli(monkeypatch, capsys, ["score", RUN / "eval_results.json", "--baseline",
                                                        RUN / "kernelbench_baseline.json", "--level", "1", "--json"])
    assert code == 0, stderr
    assert "kernelbench" in json.loads(stdout)["tables"]
    # a file named baseline_time*.json would give rescore's run folder claims it must refuse (two levels)
    assert not list(RUN.glob("baseline_time*.json"))


def test_progress_names_the_gpus_not_the_threads_sharing_them():
    """One GPU evaluating four units side by side is one GPU, not its 16 evaluating threads."""
    import threading

    from kbverify.core.progress import Progress, where
    from kbverify.harness.device_share import threads_for
    from kbverify.rescore.rescore import Sink

    seen = []
    sink = Sink(None, "run", [], 0, seen.append, threads_for(4), "cuda:0", devices=1)
    sink.lock = threading.Lock()
    sink.evaluation_starts()
    sink.builds(1, 2, 16)
    assert [where(event) for event in seen] == ["1 GPU", "16 CPU cores"]
    assert where(Progress(0, 10, phase="start", device="cuda:0", workers=2 * 4, devices=2)) == "2 GPUs"
    assert where(Progress(1, 10, phase="evaluate", device="cuda:0", workers=8)) == "8 GPUs"  # one unit a GPU


def test_an_internal_error_exits_3_with_a_line_never_1(monkeypatch, capsys):
    from kbverify.cli import validate

    def broken(**kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(validate, "score", broken)
    code, stdout, stderr = run_cli(monkeypatch, capsys, ["score", RUN / "eval_results.json"])
    assert code == 3 and stdout == ""
    assert stderr.splitlines()[-1].startswith("kbverify: internal error (ZeroDivisionError: a bug)")


def test_a_fixed_sample_of_the_fuzz_is_clean():
    """CI's share of scripts/fuzz_cli.py (run all of it before stopping: `python3 scripts/fuzz_cli.py`)."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "fuzz_cli.py"), "--sample", "20", "--seed", "35"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| cases                |    20 |" in done.stdout and "| clean exit 2         |    20 |" in done.stdout

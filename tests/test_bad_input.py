"""Issue 21: no input, however malformed, gets a traceback or a wrong verdict (SPEC §7, §10).

Each case runs the command line in this process (its real entry, `kbverify.cli.main`) on one malformed input and
asserts what a script calling kbverify relies on: exit 2, exactly one line on stderr that starts `kbverify: `
and names the problem, nothing on stdout, no traceback, nothing written where the command would have written,
and no worker process started (the sandbox's entry points fail the test if anything reaches them), so each case
takes milliseconds.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kbverify import cli, sandbox
from kbverify.audit import FORMAT as AUDIT_FORMAT
from kbverify.records import Verdict
from kbverify.status import Status
from kbverify.store import Store

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
]


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
    assert len(CASES) >= 40 and len({case[0] for case in CASES}) == len(CASES)


# --- what a rescore that goes ahead says about its input (no worker: every unit is unverifiable) --------------------

@pytest.fixture
def no_probe(monkeypatch):
    """rescore asks a worker for this machine's versions and starts the worker server; neither is needed here."""
    from kbverify import provenance

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
    # into a store of its own it goes ahead (it would evaluate the new kernel: stop at the first worker)
    with pytest.raises(AssertionError, match="a worker was started"):
        run_cli(monkeypatch, capsys, ["rescore", run, "--tasks", TASKS / "basic", "--store", tmp_path / "new.sqlite",
                                      "--protocol", "original", "--device", "cpu"])

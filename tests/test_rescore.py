"""`rescore` on the CPU: one verdict per unit, resume after SIGKILL, two device workers, faults, unverifiable claims,
and the refusal to mix machines in one store.

Every run re-scores a generic JSONL of four tiny elementwise tasks written to tmp_path, under `original` and a
`verified` with a short timing budget, so a unit takes about a second.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from kbverify.cli import jobs
from kbverify.core.protocols import ORIGINAL, VERIFIED, parse_protocols
from kbverify.core.status import Status
from kbverify.harness.runner import CheckOptions
from kbverify.rescore import rescore as rescore_module
from kbverify.rescore.importers import load_entries
from kbverify.rescore.rescore import plan_units
from kbverify.results.store import Store

REPO = Path(__file__).resolve().parent.parent
WORKER_TIMEOUT_S = 60
# as fast_verified_file: a store made under one is resumed under the other
FAST = {"verified": {"timing_budget_s": 0.2, "as_user_set": False}}
OTHER_MACHINE = {"gpu_model": "NVIDIA H100 80GB HBM3", "driver": "550.54", "cuda": "12.4", "torch": "2.5.1"}

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {expr}


batch_size = 8
dim = 64


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
'''

KERNEL = '''import os

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        {body}
'''

TASKS = {"1_ReLU": "torch.relu(x)", "2_Double": "x * 2.0", "3_Tanh": "torch.tanh(x)", "4_RowSum": "x.sum(dim=1)",
         "5_Neg": "-x"}
HONEST = {"1_ReLU": "return x.clamp_min(0)", "2_Double": "return x + x", "3_Tanh": "return torch.tanh(x)",
          "4_RowSum": "return x.sum(dim=1)"}
# torch.rand is never negative, so the identity passes KernelBench's check; the verified sets include -x.
RELU_IDENTITY = "return x.clone()"


def write_run(root: Path, kernels: dict[str, str | None], *, claims: dict[str, float] | None = None) -> Path:
    """Task files under root/level1 and root/run.jsonl with one entry per task; a None kernel has no code."""
    (root / "level1").mkdir(parents=True, exist_ok=True)
    lines = []
    for name, body in kernels.items():
        (root / "level1" / f"{name}.py").write_text(TASK.format(expr=TASKS[name]))
        row = {"task": f"level1/{name}.py", "id": name.split("_", 1)[1].lower(),
               "code": None if body is None else KERNEL.format(body=body)}
        if claims and name in claims:
            row["claimed_speedup"] = claims[name]
        lines.append(json.dumps(row))
    source = root / "run.jsonl"
    source.write_text("\n".join(lines) + "\n")
    return source


def fast_verified_file(root: Path) -> Path:
    """The CLI's way to shorten timing: a protocol file derived from `verified`, keeping its name (without the set
    run as a user calls the model: an interpreter a check, and no test here is about it)."""
    path = root / "verified_fast.json"
    path.write_text(json.dumps({"base": "verified", "name": "verified", "timing_budget_s": 0.2, "as_user_set": False}))
    return path


def kbverify(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    args = [str(arg) for arg in args]
    if args[0] in ("check", "rescore") and "--timeout" not in args:
        args += ["--timeout", str(WORKER_TIMEOUT_S)]  # a stuck worker becomes a verdict, not a stuck test
    return subprocess.run([sys.executable, "-m", "kbverify", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def stored_rows(path: Path) -> dict[str, tuple]:
    """unit_key → (run_id, record, written), read straight from SQLite."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT unit_key, run_id, record, written FROM verdicts").fetchall()
    keys = [row[0] for row in rows]
    assert len(keys) == len(set(keys)), "a unit was stored twice"
    return {row[0]: row[1:] for row in rows}


def planned_keys(source: Path, protocol_spec: str) -> set[str]:
    return {unit.key for unit in plan_units(load_entries(source), parse_protocols(protocol_spec))}


def _rescore(source: Path, store: Path, **overrides) -> dict:
    arguments = dict(fmt="auto", tasks=None, store_path=store, protocols="original,verified", samples="first",
                     report_dir=None, device="cpu", hidden_dirs=[], timeout_s=float(WORKER_TIMEOUT_S),
                     protocol_overrides=FAST)
    return jobs.run_rescore(source, **{**arguments, **overrides})


def test_a_complete_run_stores_each_unit_once_and_a_second_run_resumes_all(tmp_path):
    kernels = {**HONEST, "1_ReLU": RELU_IDENTITY, "5_Neg": None}
    source = write_run(tmp_path / "run", kernels, claims={"1_ReLU": 1.3, "5_Neg": 3.0})
    store = tmp_path / "store.sqlite"
    first = _rescore(source, store, report_dir=tmp_path / "report")
    assert (first["units"], first["evaluated"], first["resumed"], first["errors"]) == (10, 8, 0, [])

    with Store(store) as opened:
        verdicts = [v for _, v in opened.verdicts()]
    assert Counter((v.submission, v.protocol) for v in verdicts) == {
        (entry, protocol): 1 for entry in ("relu", "double", "tanh", "rowsum", "neg")
        for protocol in ("original", "verified")}
    status = {(v.submission, v.protocol): v.status for v in verdicts}
    assert status["relu", "original"] is Status.PASSED and status["relu", "verified"] is Status.INCORRECT
    for entry in ("double", "tanh", "rowsum"):
        assert status[entry, "original"] is Status.PASSED and status[entry, "verified"] is Status.PASSED
    # No code: stored as unverifiable under each protocol, and still one of the five tasks fast_p divides by.
    unverifiable = [v for v in verdicts if v.submission == "neg"]
    assert {v.status for v in unverifiable} == {Status.UNVERIFIABLE}
    assert all("no code" in v.message and v.claimed_speedup == 3.0 for v in unverifiable)
    tables = first["tables"]
    assert tables["original"]["n_tasks"] == tables["verified"]["n_tasks"] == 5
    assert tables["original"]["rows"][0]["fast_p"] == pytest.approx(4 / 5)
    assert tables["verified"]["rows"][0]["fast_p"] == pytest.approx(3 / 5)

    # The report says what the rescore table says, and names the caught cheat.
    report = json.loads(Path(first["reports"]["json"]).read_text())
    for name, table in tables.items():
        assert [r["fast_p"] for r in report["by_protocol"][name]["fast_p"]] == [r["fast_p"] for r in table["rows"]]
    assert [(c["submission"], c["change"]) for c in report["status_changes"]] == [("relu", "passed → incorrect")]
    assert report["unverifiable"]["n"] == 1

    before = stored_rows(store)
    second = _rescore(source, store)
    assert (second["units"], second["evaluated"], second["resumed"]) == (10, 0, 10)
    assert stored_rows(store) == before
    assert second["tables"] == tables


@pytest.mark.slow
def test_a_killed_rescore_resumes_without_losing_or_duplicating_a_unit(tmp_path):
    source = write_run(tmp_path / "run", HONEST)
    store = tmp_path / "store.sqlite"
    protocols = f"original,{fast_verified_file(tmp_path)}"
    command = [sys.executable, "-m", "kbverify", "rescore", str(source), "--store", str(store), "--protocol",
               protocols, "--device", "cpu", "--timeout", str(WORKER_TIMEOUT_S), "--json"]
    with open(tmp_path / "killed.log", "w") as log:
        # Its own session, so the kill reaches the whole process group (the CLI and its worker server).
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=log, start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            while process.poll() is None and time.monotonic() < deadline and _count(store) < 1:
                time.sleep(0.02)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    assert process.returncode == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-2000:]
    before_kill = stored_rows(store)
    expected = planned_keys(source, protocols)
    assert 1 <= len(before_kill) < len(expected) == 8

    resumed = kbverify("rescore", source, "--store", store, "--protocol", protocols, "--device", "cpu", "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads(resumed.stdout)
    assert summary["resumed"] == len(before_kill) and summary["evaluated"] == 8 - len(before_kill)
    after = stored_rows(store)
    assert set(after) == expected
    assert {key: after[key] for key in before_kill} == before_kill, "a verdict written before the kill changed"
    with Store(store) as opened:
        assert {v.status for _, v in opened.verdicts()} == {Status.PASSED}


def _count(store: Path) -> int:
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=1) as db:
            return db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]
    except sqlite3.Error:  # not created yet
        return 0


@pytest.mark.slow
def test_two_device_workers_share_the_queue_and_write_each_unit_once(tmp_path, monkeypatch):
    source = write_run(tmp_path / "run", HONEST)
    entries = load_entries(source)
    protocols = [ORIGINAL, VERIFIED.with_overrides(timing_budget_s=0.2, as_user_set=False)]
    ran: list[tuple[str, str, str]] = []  # (thread, device, unit key)
    record_lock = threading.Lock()
    # Each worker's first unit waits for the other's: both threads must be taking units at the same time.
    both_started = threading.Barrier(2, timeout=120)
    evaluate = rescore_module.evaluate_unit

    def spying_evaluate(unit, options, store=None, lock=None):
        thread = threading.current_thread().name
        with record_lock:
            first = thread not in {name for name, _, _ in ran}
            ran.append((thread, options.device, unit.key))
        if first:
            both_started.wait()
        return evaluate(unit, options, store, lock)

    monkeypatch.setattr(rescore_module, "evaluate_unit", spying_evaluate)
    progress = []
    with Store(tmp_path / "store.sqlite") as store:
        options = CheckOptions(device="cpu", timeout_s=float(WORKER_TIMEOUT_S))
        summary = rescore_module.rescore(entries, protocols, store, run_id="two-workers", devices=["cpu", "cpu"],
                                         options=options, progress=progress.append)
        stored = {key: verdict for key, verdict in store.verdicts()}
    assert (summary.units, summary.evaluated, summary.errors) == (8, 8, ())
    assert len({thread for thread, _, _ in ran}) == 2 and {device for _, device, _ in ran} == {"cpu"}
    assert Counter(key for _, _, key in ran) == {unit.key: 1 for unit in plan_units(entries, protocols)}
    assert set(stored) == {key for _, _, key in ran}
    # the units planned, the evaluation's start (0 done), then one event per finished unit, each naming where it ran
    assert [(p.phase, p.done) for p in progress[:2]] == [("start", 0), ("evaluate", 0)]
    assert [p.done for p in progress[1:]] == list(range(0, 9)) and all(p.total == 8 for p in progress)
    assert {(p.phase, p.device, p.workers) for p in progress[1:]} == {("evaluate", "cpu", 2)}
    assert {v.status for v in stored.values()} == {Status.PASSED}


@pytest.mark.slow
def test_faults_become_statuses_and_the_run_completes(tmp_path):
    faults = {
        "1_ReLU": "os._exit(3)",  # the process ends, no exception to catch
        "2_Double": "while True:\n            pass",
        "3_Tanh": "return torch.tanh(x",
        "4_RowSum": "return x.sum(dim=1) + 1.0",
    }
    source = write_run(tmp_path / "run", faults)
    store = tmp_path / "store.sqlite"
    result = kbverify("rescore", source, "--store", store, "--protocol", f"original,{fast_verified_file(tmp_path)}",
                      "--device", "cpu", "--timeout", "6", "--report", tmp_path / "report", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert (summary["units"], summary["evaluated"], summary["errors"]) == (8, 8, [])
    with Store(store) as opened:
        status = {(v.submission, v.protocol): v.status.value for _, v in opened.verdicts()}
    expected = {"relu": "crashed", "double": "timeout", "tanh": "compile_error", "rowsum": "incorrect"}
    assert status == {(entry, protocol): value for entry, value in expected.items()
                      for protocol in ("original", "verified")}
    assert all(row["fast_p"] == 0.0 for table in summary["tables"].values() for row in table["rows"])
    assert all((tmp_path / "report" / f"report.{kind}").is_file() for kind in ("json", "md", "html"))


def test_another_machines_store_is_refused_unless_mixing_is_asked_for(tmp_path):
    source = write_run(tmp_path / "run", HONEST)
    store = tmp_path / "store.sqlite"
    with Store(store) as opened:
        opened.begin_run("elsewhere", OTHER_MACHINE, {"source": "run.jsonl"})
    command = ("rescore", source, "--store", store, "--protocol", "original", "--limit", "1", "--device", "cpu",
               "--json")

    refused = kbverify(*command)
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1 and "--allow-mixed" in refused.stderr
    assert "Traceback" not in refused.stderr and _count(store) == 0

    mixed = kbverify(*command, "--allow-mixed")
    assert mixed.returncode == 0, mixed.stderr[-2000:]
    assert json.loads(mixed.stdout)["evaluated"] == 1
    with Store(store) as opened:
        keys = {run["compat_key"] for run in opened.runs()}
    assert len(keys) == 2 and "gpu_model=NVIDIA H100 80GB HBM3|driver=550.54|cuda=12.4|torch=2.5.1" in keys


def test_two_entries_claiming_the_same_sample_of_a_task_are_refused_before_any_work(tmp_path):
    source = write_run(tmp_path / "run", HONEST)
    lines = source.read_text().splitlines()
    twin = json.loads(lines[0]) | {"id": "relu-again"}
    source.write_text("\n".join(lines + [json.dumps(twin)]) + "\n")
    result = kbverify("rescore", source, "--store", tmp_path / "store.sqlite", "--device", "cpu")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "'relu'" in result.stderr and "'relu-again'" in result.stderr
    assert _count(tmp_path / "store.sqlite") == 0


def test_units_left_without_a_verdict_make_the_run_incomplete_and_exit_3(tmp_path, monkeypatch):
    """An infrastructure error is not a verdict: the tables then cover fewer tasks than the run, which must be
    said (text, JSON, report title) and must not exit 0; the next run retries those units and completes."""
    from typer.testing import CliRunner

    from kbverify.cli import app as cli
    from kbverify.core.errors import InfrastructureError

    source = write_run(tmp_path / "run", {"1_ReLU": HONEST["1_ReLU"], "2_Double": HONEST["2_Double"]})
    store = tmp_path / "store.sqlite"
    evaluate = rescore_module.evaluate_unit

    def failing_for_double(unit, options, store=None, lock=None):
        if unit.entry.entry_id == "double":
            raise InfrastructureError("the worker could not start")
        return evaluate(unit, options, store, lock)

    monkeypatch.setattr(rescore_module, "evaluate_unit", failing_for_double)
    first = _rescore(source, store, report_dir=tmp_path / "report")
    assert first["complete"] is False and len(first["missing_units"]) == 2
    assert all("double" in key for key in first["missing_units"])
    assert first["text"].startswith("INCOMPLETE: 2 of 4 units") and first["text"].rstrip().endswith("retry them.")
    assert first["tables"]["original"]["n_tasks"] == 1
    assert first["tables"]["original"]["rows"][0]["fast_p"] == pytest.approx(1.0)
    bound = first["tables_counting_missing_as_failed"]
    assert bound["original"]["n_tasks"] == bound["verified"]["n_tasks"] == 2
    assert bound["original"]["rows"][0]["fast_p"] == pytest.approx(0.5)
    assert "a lower bound" in first["text"]
    assert "INCOMPLETE" in json.loads(Path(first["reports"]["json"]).read_text())["title"]

    protocol_file = fast_verified_file(tmp_path)
    arguments = [str(source), "--store", str(store), "--protocol", f"original,{protocol_file}", "--device", "cpu",
                 "--timeout", str(WORKER_TIMEOUT_S)]
    failed = CliRunner().invoke(cli.app, ["rescore", *arguments, "--json"])
    assert failed.exit_code == 3, failed.output[-2000:]
    assert json.loads(failed.stdout)["missing_units"] == first["missing_units"]  # progress went to stderr
    # the store remembers the plan: scoring or reporting it later says the same
    scored = CliRunner().invoke(cli.app, ["score", str(store), "--json"])
    assert scored.exit_code == 3 and sorted(json.loads(scored.output)["missing_units"]) == sorted(
        first["missing_units"])
    assert json.loads(scored.output)["tables_counting_missing_as_failed"] == bound
    reported = CliRunner().invoke(cli.app, ["report", str(store), "--out", str(tmp_path / "later")])
    assert reported.exit_code == 3 and reported.output.startswith("INCOMPLETE: 2 of 4 units")

    monkeypatch.setattr(rescore_module, "evaluate_unit", evaluate)
    retried = CliRunner().invoke(cli.app, ["rescore", *arguments])
    assert retried.exit_code == 0, retried.output[-2000:]
    assert "INCOMPLETE" not in retried.output and "2 evaluated now" in retried.output
    assert CliRunner().invoke(cli.app, ["score", str(store)]).exit_code == 0
    assert CliRunner().invoke(cli.app, ["report", str(store), "--out", str(tmp_path / "final")]).exit_code == 0

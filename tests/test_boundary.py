"""The process boundary: the parent side never imports torch or the modules that run submission code, and the
parent–child contract lives in one module both sides import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PARENT_SIDE = ["kbverify", "kbverify.cli", "kbverify.jobs", "kbverify.runner", "kbverify.rescore", "kbverify.sandbox",
               "kbverify.supervisor", "kbverify.confine", "kbverify.channel", "kbverify.timing_control",
               "kbverify.report", "kbverify.score", "kbverify.store", "kbverify.validate", "kbverify.rejudge",
               "kbverify.importers", "kbverify.present", "kbverify.progress", "kbverify.stats",
               "kbverify.leaderboard", "kbverify.labels", "kbverify.ray_executor", "kbverify.counting",
               "kbverify.summary", "kbverify.report_tables", "kbverify.report_html", "kbverify.correctness",
               "kbverify.allowances"]
CHILD_SIDE = {"torch", "kbverify.child.worker", "kbverify.child.evaluate", "kbverify.child.timing", "kbverify.child.kernelbench_v01",
              "kbverify.child.audit_worker", "kbverify.child.footprint_worker", "kbverify.child.guards", "kbverify.child.handover",
              "kbverify.child.extensions", "kbverify.child.output_handover", "kbverify.child.timing_sides",
              "kbverify.child.timing_rounds", "kbverify.child.timing_record"}


def _imported_after(modules: list[str]) -> set[str]:
    code = (f"import importlib, json, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_the_parent_side_imports_neither_torch_nor_the_child_side():
    loaded = _imported_after(PARENT_SIDE)
    assert not loaded & CHILD_SIDE, sorted(loaded & CHILD_SIDE)


def test_importing_kbverify_starts_nothing_and_loads_nothing_heavy():
    loaded = _imported_after(["kbverify"])
    assert not {"torch", "numpy", "multiprocessing.forkserver"} & loaded


def test_the_jobs_that_run_submission_code_are_named_in_the_contract():
    from kbverify import channel

    source = (REPO / "kbverify" / "child" / "worker.py").read_text()
    for job in channel.SUBMISSION_JOBS:
        assert f'"{job}":' in source, f"{job} is not a job the worker runs"
    assert channel.runs_submission("candidate", {"submission_source": "x = 1"})
    assert not channel.runs_submission("judge", {"submission_source": ""})

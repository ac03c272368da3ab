"""The process boundary: the parent side never imports torch or the modules that run submission code, and the
parent–child contract lives in one module both sides import."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PARENT_SIDE = ["kbverify", "kbverify.cli", "kbverify.jobs", "kbverify.runner", "kbverify.rescore", "kbverify.sandbox",
               "kbverify.supervisor", "kbverify.confine", "kbverify.channel", "kbverify.timing_control",
               "kbverify.report", "kbverify.score", "kbverify.store", "kbverify.validate", "kbverify.judge.rejudge",
               "kbverify.importers", "kbverify.present", "kbverify.progress", "kbverify.stats",
               "kbverify.leaderboard", "kbverify.labels", "kbverify.ray_executor", "kbverify.counting",
               "kbverify.summary", "kbverify.report_tables", "kbverify.report_html", "kbverify.judge",
               "kbverify.input_plan", "kbverify.audit", "kbverify.audit.command", "kbverify.audit.copies",
               "kbverify.audit.memory", "kbverify.correctness", "kbverify.allowances"]
CHILD_SIDE = {"torch", "kbverify.child.worker", "kbverify.child.evaluate", "kbverify.child.timing", "kbverify.child.kernelbench_v01",
              "kbverify.child.audit_worker", "kbverify.child.audit_family", "kbverify.child.audit_nulls",
              "kbverify.child.audit_dead", "kbverify.child.audit_tensors", "kbverify.child.footprint_worker",
              "kbverify.child.guards", "kbverify.child.handover", "kbverify.child.extensions",
              "kbverify.child.output_handover", "kbverify.child.timing_sides", "kbverify.child.timing_rounds",
              "kbverify.child.timing_record"}


def _imported_after(modules: list[str]) -> set[str]:
    code = (f"import importlib, json, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_the_parent_side_imports_neither_torch_nor_the_child_side():
    loaded = _imported_after(PARENT_SIDE)
    assert not loaded & CHILD_SIDE, sorted(loaded & CHILD_SIDE)


def test_the_judge_imports_neither_torch_nor_the_child_side_nor_what_starts_processes():
    """Every status is decided from raw records: the judge must load on a machine with nothing to run."""
    loaded = _imported_after(["kbverify.judge"])
    child_side = {name for name in loaded if name == "torch" or name.startswith(("torch.", "kbverify.child"))}
    assert not child_side, sorted(child_side)
    spawning = {"kbverify.sandbox", "kbverify.supervisor", "kbverify.runner", "subprocess", "multiprocessing"}
    assert not loaded & spawning, sorted(loaded & spawning)


def _code_shape():
    spec = importlib.util.spec_from_file_location("code_shape", REPO / "scripts" / "code_shape.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_has_no_import_cycles():
    """Imports at any depth of a module count, as in scripts/code_shape.py, which this reuses."""
    import ast

    shape = _code_shape()
    found = shape.modules()
    graph = {name: shape.imports_of(name, ast.parse(path.read_text()), set(found)) for name, path in found.items()}
    assert shape.cycles(graph) == []


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

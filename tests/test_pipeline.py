"""The rescore pipeline on the CPU, with deterministic fakes for the build and the evaluation: evaluation starts
before the last build ends, a unit is evaluated only once its own build has finished, every unit once, and builds
share the cores, one build per free core."""

from __future__ import annotations

import threading
import time

import pytest

from kbverify.core.protocols import ORIGINAL, VERIFIED
from kbverify.core.status import Status
from kbverify.harness.runner import CheckOptions
from kbverify.rescore import rescore as rescore_module
from kbverify.rescore.importers import load_entries
from kbverify.rescore.rescore import BuildPlan, LocalExecutor, build_plan, plan_units
from kbverify.results.store import Store
from tests.test_rescore import TASK, write_run

NATIVE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = "// {name}"


class ModelNew(nn.Module):
    def forward(self, x):
        return {expr}
'''


def write_native_run(root):
    """Three native submissions (never really built: the build is faked) and one plain one."""
    source = write_run(root, {"1_ReLU": "return x.clamp_min(0)", "2_Double": "return x + x",
                              "3_Tanh": "return torch.tanh(x)", "4_RowSum": "return x.sum(dim=1)"})
    lines = source.read_text().splitlines()
    import json

    rows = [json.loads(line) for line in lines]
    for row, expr in zip(rows[:3], ("x.clamp_min(0)", "x + x", "torch.tanh(x)")):
        row["code"] = NATIVE.format(name=row["id"], expr=expr)
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return source


def test_the_build_plan_runs_a_build_per_free_core():
    """A build keeps about one core busy (its two units overlap only briefly: kbverify.rescore.builds), so the free cores
    each get a build; a MAX_JOBS above two counts as that many halves of a core per build."""
    for cores in range(1, 65):
        for evaluators in (0, 1, 2, 8):
            for max_jobs in (None, 1, 4, 16):
                plan = build_plan(cores, evaluators, max_jobs)
                free = max(1, cores - evaluators)
                assert plan.parallel_builds >= 1 and 1 <= plan.max_jobs <= free
                assert plan.parallel_builds * max(1, plan.max_jobs // 2) <= free
    assert build_plan(16, 4) == BuildPlan(parallel_builds=12, max_jobs=2)  # --share-gpu 4 on 16 cores: 6 before
    assert build_plan(16, 1) == BuildPlan(parallel_builds=15, max_jobs=2)
    assert build_plan(2, 0) == BuildPlan(parallel_builds=2, max_jobs=2)  # `kbverify build` on this 2-core machine
    assert build_plan(2, 1) == BuildPlan(parallel_builds=1, max_jobs=1)


def test_evaluation_starts_before_the_last_build_ends(tmp_path, monkeypatch):
    entries = load_entries(write_native_run(tmp_path / "run"))
    protocols = [ORIGINAL, VERIFIED.with_overrides(timing_budget_s=0.2, as_user_set=False)]
    events: list[tuple[str, str]] = []
    record = threading.Lock()
    evaluating = threading.Event()
    native = [entry for entry in entries if rescore_module.needs_build(entry)]
    assert len(native) == 3

    def fake_build(entry, options):
        assert options.max_jobs == 1  # the plan's MAX_JOBS reaches the build
        if entry is native[-1]:
            # The last build ends only once a built submission's unit is being evaluated: phases in sequence
            # (every build first) would stall here.
            assert evaluating.wait(30), "no built unit was evaluated while a build was still running"
        with record:
            events.append(("built", entry.entry_id))
        return {"ok": True}

    def fake_evaluate(unit, options, store=None, lock=None):
        with record:
            events.append(("evaluate", unit.entry.entry_id))
        if unit.entry in native:  # a built submission's unit, not only the one that needed no build
            evaluating.set()
        return rescore_module.unverifiable_verdict(unit.entry, unit.protocol)

    monkeypatch.setattr(rescore_module, "build_submission", fake_build)
    monkeypatch.setattr(rescore_module, "evaluate_unit", fake_evaluate)
    progress = []
    with Store(tmp_path / "store.sqlite") as store:
        executor = LocalExecutor(["cpu"], CheckOptions(device="cpu"), BuildPlan(parallel_builds=1, max_jobs=1))
        summary = rescore_module.rescore(entries, protocols, store, run_id="pipeline", devices=["cpu"],
                                         options=CheckOptions(device="cpu"), progress=progress.append,
                                         executor=executor)
        stored = dict(store.verdicts())
    assert (summary.units, summary.evaluated, summary.errors) == (8, 8, ())
    assert set(stored) == {unit.key for unit in plan_units(entries, protocols)}
    last_build = max(index for index, (kind, _) in enumerate(events) if kind == "built")
    first_evaluation = min(index for index, (kind, _) in enumerate(events) if kind == "evaluate")
    assert first_evaluation < last_build
    for entry in native:  # a native unit waits for its own build
        built_at = events.index(("built", entry.entry_id))
        assert all(index > built_at for index, event in enumerate(events) if event == ("evaluate", entry.entry_id))
    assert sorted(e for kind, e in events if kind == "evaluate") == sorted(
        entry.entry_id for entry in entries for _ in protocols)
    phases = [p.phase for p in progress]
    assert phases[0] == "start" and "build" in phases and phases.index("evaluate") < len(phases) - 1
    assert [p.done for p in progress if p.phase == "build"] == [0, 1, 2, 3]


def test_a_failing_evaluation_bug_stops_the_pipeline_and_is_raised(tmp_path, monkeypatch):
    entries = load_entries(write_native_run(tmp_path / "run"))
    monkeypatch.setattr(rescore_module, "build_submission", lambda entry, options: {"ok": True})

    def broken(unit, options, store=None, lock=None):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(rescore_module, "evaluate_unit", broken)
    with Store(tmp_path / "store.sqlite") as store, pytest.raises(RuntimeError, match="a bug of ours"):
        rescore_module.rescore(entries, [ORIGINAL], store, run_id="broken", devices=["cpu"],
                               options=CheckOptions(device="cpu"),
                               executor=LocalExecutor(["cpu"], CheckOptions(), BuildPlan(1, 1)))

"""The executor interface of `rescore`: a fake executor (everywhere) and Ray's (a local cluster with simulated GPUs,
skipped where ray is not installed). Verdicts stream into the driver's store and a cut run resumes exactly; a node
that is another machine evaluates nothing; `--executor ray` without ray is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbverify.core.protocols import ORIGINAL
from kbverify.core.status import Status
from kbverify.harness.provenance import compat_key
from kbverify.harness.runner import CheckOptions
from kbverify.rescore import rescore as rescore_module
from kbverify.rescore.importers import load_entries
from kbverify.rescore.rescore import Sink, plan_units, unverifiable_verdict
from kbverify.results.store import Store
from tests.test_rescore import HONEST, write_run

REPO = Path(__file__).resolve().parent.parent
NODE = {"kbverify": "test", "gpu_model": "simulated", "torch": "x"}


class Cut(Exception):
    pass


class FakeExecutor:
    """Gives each unit a verdict made on the spot; `cut_after` stops the run there (a killed driver)."""

    workers = 2

    def __init__(self, cut_after: int | None = None, foreign: set[str] = frozenset()):
        self.cut_after, self.foreign, self.seen = cut_after, foreign, []

    def provenance(self, device):
        return NODE

    def run(self, units, sink):
        assert sink.compat_key == compat_key(NODE)
        for index, unit in enumerate(units):
            if self.cut_after is not None and index == self.cut_after:
                raise Cut()
            self.seen.append(unit.key)
            if unit.entry.entry_id in self.foreign:
                sink.error(unit, "this node is another machine/software")
                continue
            verdict = unverifiable_verdict(unit.entry, unit.protocol)
            sink.verdict(unit, verdict, 0.01, "node-a:cuda:0")


def test_a_fake_executor_streams_into_the_store_and_a_cut_run_resumes_exactly(tmp_path):
    entries = load_entries(write_run(tmp_path / "run", HONEST))
    keys = {unit.key for unit in plan_units(entries, [ORIGINAL])}
    options = CheckOptions(device="cpu")
    with Store(tmp_path / "store.sqlite") as store:
        with pytest.raises(Cut):
            rescore_module.rescore(entries, [ORIGINAL], store, run_id="r1", devices=["cpu"], options=options,
                                   executor=FakeExecutor(cut_after=2))
        first = dict(store.verdicts())
        assert len(first) == 2
        again = FakeExecutor(foreign={"tanh"})
        summary = rescore_module.rescore(entries, [ORIGINAL], store, run_id="r2", devices=["cpu"], options=options,
                                         executor=again)
        assert set(again.seen) == keys - set(first)  # only what the cut run left
        assert summary.evaluated == 1 and summary.resumed == 2 and len(summary.errors) == 1
        assert "tanh" in summary.errors[0] and "another machine" in summary.errors[0]
        stored = dict(store.verdicts())
        assert {k: v for k, v in stored.items() if k in first} == first and len(stored) == 3
        assert store.units_without_verdict()[0]["name"].startswith("tanh")


def test_executor_ray_without_ray_installed_is_one_line_and_exit_2(tmp_path):
    source = write_run(tmp_path / "run", HONEST)
    code = ("import sys; sys.modules['ray'] = None; sys.argv = ['kbverify'] + sys.argv[1:]; "
            "from kbverify.__main__ import main; main()")
    done = subprocess.run([sys.executable, "-c", code, "rescore", str(source), "--store", str(tmp_path / "s.sqlite"),
                           "--executor", "ray", "--device", "cpu"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "kbverify: --executor ray needs Ray, which is not installed: pip install 'kbverify[ray]' (or pip install ray)"]
    assert not (tmp_path / "s.sqlite").exists()
    bad = subprocess.run([sys.executable, "-m", "kbverify", "rescore", str(source), "--executor", "dask"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--executor 'dask': use local or ray" in bad.stderr


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'kbverify[ray]')")
    # Two simulated GPUs on this machine: each unit asks for one, so two run at once.
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield ray
    ray.shutdown()


def test_ray_runs_units_as_one_gpu_tasks_into_the_drivers_store_and_resumes(tmp_path, ray_cluster):
    from kbverify.rescore.ray_executor import RayExecutor

    entries = load_entries(write_run(tmp_path / "run", {k: HONEST[k] for k in ("1_ReLU", "2_Double")}))
    options = CheckOptions(device="cpu", timeout_s=120.0)
    started = time.monotonic()
    with Store(tmp_path / "store.sqlite") as store:
        executor = RayExecutor(options)
        assert executor.workers == 2
        summary = rescore_module.rescore(entries, [ORIGINAL], store, run_id="ray1", devices=["cpu"],
                                         options=options, executor=executor)
        stored = dict(store.verdicts())
        assert (summary.evaluated, summary.errors) == (2, ())
        assert {v.status for v in stored.values()} == {Status.PASSED}
        assert sorted(len(p.gpu_ids) for p in executor.placements) == [1, 1]  # one simulated GPU per unit
        again = RayExecutor(options)
        resumed = rescore_module.rescore(entries, [ORIGINAL], store, run_id="ray2", devices=["cpu"],
                                         options=options, executor=again)
        assert (resumed.evaluated, resumed.resumed) == (0, 2) and again.placements == []
        assert dict(store.verdicts()) == stored

        # A node whose machine or software is not the run's evaluates nothing.
        units = plan_units(entries, [ORIGINAL])
        sink = Sink(store, "ray3", units, 0, None, 2, "cpu", compat_key="gpu_model=H100|another")
        RayExecutor(options).run(units, sink)
        assert sink.done == 0 and len(sink.errors) == 2 and all("another machine" in e for e in sink.errors)
    print(f"ray test: {time.monotonic() - started:.1f} s")

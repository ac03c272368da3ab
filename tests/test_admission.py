"""Memory admission for the sharded audit: the meta-device estimate and its fallbacks, the reservation ledger,
and copies of `kbverify audit --gpus` that never run two heavy tasks at once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kbverify.audit.admission import MemoryLedger
from kbverify.audit.footprint import (
    AUDIT_MEMORY_FACTOR,
    Footprint,
    audit_need_bytes,
    estimate_footprints,
)
from kbverify.core.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
HEADER = "import torch\nimport torch.nn as nn\n\n\n"


def _task(forward: str, inputs: str, *, init: str = "pass") -> str:
    return (HEADER + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"        {init}\n\n    def forward(self, x):\n        {forward}\n\n\n"
            f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return []\n")


def _write(root: Path, relative: str, source: str):
    path = root / f"{relative}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return load_task(path)


# ---- the estimate --------------------------------------------------------------------------------------------

def test_estimate_counts_inputs_parameters_and_outputs_times_the_factor(tmp_path):
    linear = _write(tmp_path, "level1/1_Linear", _task("return self.fc(x)", "[torch.rand(16, 64)]",
                                                       init="self.fc = nn.Linear(64, 32)"))
    pair = _write(tmp_path, "level1/2_Pair", _task("return x * 2, x.sum(dim=1, dtype=torch.float64)",
                                                   "[torch.rand(8, 100)]"))
    # __init__ needs real values (as the Swin tasks'): built again with only the parameters on meta
    real_init = _write(tmp_path, "level3/3_RealInit", _task(
        "return self.fc(x) * self.scale", "[torch.rand(4, 10)]",
        init="self.scale = float(torch.linspace(0, 1, 3)[1].item()); self.fc = nn.Linear(10, 6, bias=False)"))
    footprints = estimate_footprints([linear, pair, real_init], batches=2).by_key

    fp = footprints[linear.key]
    assert (fp.status, fp.input_bytes, fp.parameter_bytes, fp.output_bytes) == (
        "full", 16 * 64 * 4, (64 * 32 + 32) * 4, 16 * 32 * 4)
    assert audit_need_bytes(fp) == int((16 * 64 + 64 * 32 + 32 + 16 * 32) * 4 * AUDIT_MEMORY_FACTOR)
    pair_fp = footprints[pair.key]
    assert (pair_fp.status, pair_fp.output_bytes) == ("full", 8 * 100 * 4 + 8 * 8)  # both outputs, float64 too
    assert audit_need_bytes(pair_fp, factor=2.0) == 2 * (8 * 100 * 4 * 2 + 8 * 8)
    real = footprints[real_init.key]
    assert (real.status, real.parameter_bytes, real.output_bytes) == ("full", 6 * 10 * 4, 4 * 6 * 4)


def test_estimate_falls_back_when_the_forward_or_the_inputs_fail_on_meta(tmp_path):
    data_dependent = _write(tmp_path, "level1/1_ItemInForward", _task(
        "return self.fc(x) * float(x.max())", "[torch.rand(16, 64)]", init="self.fc = nn.Linear(64, 32)"))
    item_inputs = _write(tmp_path, "level1/2_ItemInInputs", _task(
        "return x", "[torch.rand(int(torch.randint(1, 9, (1,)).item()), 4)]"))
    footprints = estimate_footprints([data_dependent, item_inputs], batches=1).by_key

    forward_failed = footprints[data_dependent.key]
    assert forward_failed.status == "no_outputs" and forward_failed.output_bytes is None
    assert "meta" in forward_failed.error
    assert audit_need_bytes(forward_failed) == int((16 * 64 + 64 * 32 + 32) * 4 * AUDIT_MEMORY_FACTOR)
    inputs_failed = footprints[item_inputs.key]
    assert inputs_failed.status == "unknown" and audit_need_bytes(inputs_failed) is None


# ---- the ledger ----------------------------------------------------------------------------------------------

def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()  # reaped: the pid is gone
    return process.pid


def test_two_reservations_over_the_budget_cannot_both_be_held(tmp_path):
    first, second = MemoryLedger(tmp_path, 100), MemoryLedger(tmp_path, 100)  # two copies, one folder
    assert first.try_reserve("a", 60)
    assert not second.try_reserve("b", 50)
    assert second.try_reserve("c", 40)  # the next task that fits goes ahead
    assert [r.key for r in first.in_flight()] == ["a", "c"]
    first.release("a")
    assert second.try_reserve("b", 50)
    assert sum(r.need_bytes for r in second.in_flight()) == 90


def test_a_dead_copys_reservation_is_ignored(tmp_path):
    assert MemoryLedger(tmp_path, 100, pid=_dead_pid()).try_reserve("orphan", 90)
    ledger = MemoryLedger(tmp_path, 100)
    assert ledger.in_flight() == []
    assert ledger.try_reserve("b", 90)
    assert [r.key for r in ledger.in_flight()] == ["b"]  # the dead entry is dropped on the next write


def test_an_oversized_or_unknown_task_runs_alone(tmp_path):
    ledger = MemoryLedger(tmp_path, 100)
    assert ledger.try_reserve("small", 1)
    assert not ledger.try_reserve("huge", 500)
    assert not ledger.try_reserve("unknown", None)
    ledger.release("small")
    assert ledger.try_reserve("huge", 500)
    assert not ledger.try_reserve("small", 1)  # nothing starts beside it
    ledger.release("huge")
    assert ledger.try_reserve("unknown", None)
    assert not ledger.try_reserve("small", 1)
    with pytest.raises(ValueError):
        MemoryLedger(tmp_path, 0)


# ---- copies of the script ------------------------------------------------------------------------------------

def test_copies_never_run_two_heavy_tasks_at_once_and_audit_each_task_once(tmp_path):
    """Three copies, a budget that holds one heavy task (1 MiB in, 1 MiB out: ~10 MiB) and the light ones: the two
    heavy tasks run one after the other, the light ones beside them, and every task is audited by one copy."""
    heavy = {"level1/1_HeavyTanh": "return torch.tanh(x)", "level1/2_HeavySigmoid": "return torch.sigmoid(x)"}
    light = {"level1/3_LightRelu": "return torch.relu(x - 0.5)", "level1/4_LightNeg": "return -x"}
    for name, forward in heavy.items():
        _write(tmp_path / "tasks", name, _task(forward, "[torch.rand(256, 1024)]"))
    for name, forward in light.items():
        _write(tmp_path / "tasks", name, _task(forward, "[torch.rand(8, 64)]"))
    prefix = tmp_path / "out" / "audit"
    run = subprocess.run(
        [sys.executable, "-m", "kbverify", "audit", str(tmp_path / "tasks"), "--out", str(prefix), "-v",
         "--device", "cpu", "--levels", "1", "--protocol", "original", "--seeds", "1", "--no-hidden",
         "--timeout", "120", "--gpus", "1", "--per-gpu", "3", "--retry-per-gpu", "0", "--memory-budget-gib", "0.015"],
        check=False, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]

    assert not Path(f"{prefix}.partial.jsonl").exists()  # a finished report leaves no partial file behind
    lines = {line["name"]: line for line in map(json.loads, Path(f"{prefix}.raw.jsonl").read_text().splitlines())}
    assert sorted(lines) == sorted(name.split("/")[1] for name in (*heavy, *light))
    assert all(line["raw"] is not None for line in lines.values())
    first, second = sorted((lines[name.split("/")[1]] for name in heavy), key=lambda line: line["started_unix_s"])
    assert second["started_unix_s"] >= first["ended_unix_s"]  # the heavy tasks never overlapped
    assert any(lines[name.split("/")[1]]["started_unix_s"] < first["ended_unix_s"] for name in light), \
        "no light task ran beside the first heavy one: the copies did not run side by side"
    for name in (*heavy, *light):  # one copy audited it; the final pass only resumed it
        fresh = re.findall(rf"\] {re.escape(name)}: ", run.stderr)
        assert len(fresh) == 1, (name, run.stderr[-3000:])
    assert "estimated 4 tasks' memory" in run.stderr


def test_memory_check_reports_the_audits_whose_peak_exceeded_their_estimate(tmp_path):
    from kbverify.audit.memory import memory_check

    partial = tmp_path / "run.partial.jsonl"
    lines = [{"key": "level1/1_A@aa", "raw": {"peak_memory_bytes": {"reserved": 3 << 30}}},
             {"key": "level1/2_B@bb", "raw": {"peak_memory_bytes": {"reserved": 1 << 30}}},
             {"key": "level1/3_C@cc", "raw": None, "error": "out of memory"}]
    partial.write_text("".join(json.dumps(line) + "\n" for line in lines))
    text = memory_check(partial, {"level1/1_A@aa": 2 << 30, "level1/2_B@bb": 2 << 30, "level1/3_C@cc": 1})
    assert "2 recorded peaks" in text and "worst peak/estimate 1.50 (level1/1_A)" in text
    assert "1 over their estimate: level1/1_A 1.50" in text
    assert "no recorded peaks" in memory_check(tmp_path / "missing.jsonl", {})


def test_gpu_samples_summary_reads_nvidia_smi_rows_and_skips_the_rest():
    from kbverify.audit.gpu_sampler import summarize_gpu_samples

    rows = ["2026/11/29 23:00:0%d.000, 0, %d, %d" % (i, busy, mib)
            for i, (busy, mib) in enumerate([(100, 1024), (95, 40960), (30, 2048), (0, 512)])]
    text = summarize_gpu_samples("\n".join(rows + ["[N/A], 0, [N/A], [N/A]", ""]))
    assert text == ("gpu: 4 samples, utilization median 95%, at least 90% in 50% of them, below 50% in 50%; "
                    "memory used max 40.0 GiB")
    assert summarize_gpu_samples("") == "gpu: no utilization samples"


def test_the_footprint_cache_is_filled_once_and_then_read_instead_of_measuring(tmp_path):
    tasks = tmp_path / "tasks" / "level1"
    tasks.mkdir(parents=True)
    (tasks / "1_Scale.py").write_text(HEADER + "class Model(nn.Module):\n    def forward(self, x):\n"
                                      "        return x * 2\n\n\ndef get_inputs():\n    return [torch.rand(256, 256)]\n\n\n"
                                      "def get_init_inputs():\n    return []\n")
    cache = tmp_path / "footprints.json"
    command = [sys.executable, "-m", "kbverify", "audit", str(tmp_path / "tasks"), "-v",
               "--out", str(tmp_path / "out" / "kb"), "--device", "cpu", "--levels", "1", "--memory-budget-gib", "1",
               "--footprints", str(cache), "--estimate-only"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    (entry,) = json.loads(cache.read_text()).values()
    assert entry["status"] == "full" and entry["input_bytes"] == entry["output_bytes"] == 256 * 256 * 4
    # a second run reads the cache: its estimate line says no task needed measuring
    cache.write_text(cache.read_text().replace(str(256 * 256 * 4), str(3 * 256 * 256 * 4), 1))
    second = subprocess.run(command + ["--memory-factor", "2.5"], capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and "measured 0 of 1" in second.stderr, second.stderr
    assert "factor 2.5" in second.stderr
    assert json.loads(cache.read_text()) != {}  # left as it was: nothing missing, nothing rewritten
    # an entry that was not measured in full is measured again, not trusted
    cache.write_text(json.dumps({sha: {**data, "status": "unknown"} for sha, data in json.loads(cache.read_text()).items()}))
    third = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0 and "measured 1 of 1" in third.stderr, third.stderr
    assert [entry["status"] for entry in json.loads(cache.read_text()).values()] == ["full"]


def test_the_schedule_replay_serializes_what_does_not_fit_together():
    import importlib.util

    spec = importlib.util.spec_from_file_location("simulate", REPO / "scripts" / "simulate_audit_schedule.py")
    simulate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(simulate)
    tasks = [("big1", 10.0, 100.0), ("big2", 10.0, 100.0), ("small1", 1.0, 50.0), ("small2", 1.0, 50.0)]
    # two big ones (40 GiB each at factor 4) fit a 100 GiB budget together; the small ones run beside them
    assert simulate.makespan(tasks, factor=4, budget_gib=100, copies=4) == 100.0
    # at a factor that makes each big one 60 GiB they take turns, the small ones fill the gaps
    assert simulate.makespan(tasks, factor=6, budget_gib=100, copies=4) == 200.0
    # one copy: everything in a row, whatever the memory
    assert simulate.makespan(tasks, factor=1, budget_gib=100, copies=1) == 300.0
    # a task over the budget, or of unknown size, runs alone, never beside another
    assert simulate.makespan([("huge", 50.0, 10.0), ("other", 1.0, 10.0)], factor=4, budget_gib=100, copies=2) == 20.0
    unknown = [("a", 10.0, 100.0), ("b", 10.0, 100.0), ("c", float("inf"), 100.0)]
    assert simulate.makespan(unknown, factor=4, budget_gib=100, copies=10) == 200.0


def test_a_recorded_peak_replaces_the_estimate_and_the_latest_record_of_a_task_wins():
    from kbverify.audit.footprint import PEAK_MARGIN, recorded_peaks

    fp = Footprint(status="full", input_bytes=1 << 30, parameter_bytes=0, output_bytes=1 << 30)
    assert audit_need_bytes(fp, 4.0) == 8 << 30
    # a small convolution whose workspace took 13x its tensors: the record, not the average factor, decides
    assert audit_need_bytes(fp, 4.0, recorded_peak_bytes=26 << 30) == int((26 << 30) * PEAK_MARGIN)
    assert audit_need_bytes(fp, 4.0, recorded_peak_bytes=5 << 30) == int((5 << 30) * PEAK_MARGIN)
    assert audit_need_bytes(None, 4.0, recorded_peak_bytes=1 << 30) == int((1 << 30) * PEAK_MARGIN)
    assert audit_need_bytes(None, 4.0) is None
    records = [{"sha256": "a", "raw": {"peak_memory_bytes": {"reserved": 10}}},
               {"sha256": "b", "raw": None, "error": "out of memory"},
               {"sha256": "a", "raw": {"peak_memory_bytes": {"reserved": 7}}},
               {"sha256": "c", "raw": {"peak_memory_bytes": {"reserved": 0}}}]
    assert recorded_peaks(records) == {"a": 7}


def test_the_peaks_file_is_read_for_admission_and_updated_from_the_run(tmp_path):
    from kbverify.audit import memory as script
    from kbverify.core.errors import InputError

    peaks = tmp_path / "peaks.json"
    assert script.read_peaks(peaks) == {"peaks_reserved_bytes": {}}  # none yet: the estimates decide
    partial = tmp_path / "run.partial.jsonl"

    def run(gpu: str, rows: dict, settings: str = "S") -> str:
        partial.write_text("".join(json.dumps({"sha256": sha, "settings_sha256": settings,
                                               "raw": {"gpu": gpu, "torch": "2.x", "peak_memory_bytes": {"reserved": b}}})
                                   + "\n" for sha, b in rows.items()))
        return script.update_peaks(peaks, partial, "S")

    assert "2 recorded on H200" in run("H200", {"a": 5, "b": 6})
    run("H200", {"b": 9})  # a later run of one task: its newer peak replaces the old, the other is kept
    data = script.read_peaks(peaks, fingerprint="S", gpu="H200")
    assert data["gpu"] == "H200" and data["peaks_reserved_bytes"] == {"a": 5, "b": 9}
    # records of other settings (a run without hidden shapes holds less) never enter the file
    assert "no GPU records of these settings" in run("H200", {"a": 1}, settings="other")
    assert script.read_peaks(peaks, fingerprint="S")["peaks_reserved_bytes"] == {"a": 5, "b": 9}
    # and the file is not used by a run of other settings, or on another kind of GPU
    assert script.read_peaks(peaks, fingerprint="other")["peaks_reserved_bytes"] == {}
    assert script.read_peaks(peaks, fingerprint="S", gpu="A100")["peaks_reserved_bytes"] == {}
    run("A100", {"c": 3})  # a run on another kind of GPU starts the file over
    assert script.read_peaks(peaks, fingerprint="S")["peaks_reserved_bytes"] == {"c": 3}
    for broken in ('{"something": "else"}', "[1, 2]", '{"format": "%s"}' % script.PEAKS_FORMAT, "{not json"):
        peaks.write_text(broken)
        with pytest.raises(InputError):
            script.read_peaks(peaks)


@pytest.mark.xfail(strict=True, reason="audits/kernelbench.peaks.json was measured before the mixed-sign set joined "
                   "the audit's distributions; regenerate it with the audit command on a GPU (NOTES.md), then drop this")
def test_the_committed_peaks_file_matches_the_settings_of_the_kernelbench_audit_command():
    """audits/kernelbench.peaks.json is read only by a run whose settings fingerprint it carries: the one NOTES.md
    gives (`--hidden-tests hidden_tests/kernelbench`, the default seeds and protocols, on a CUDA device)."""
    from kbverify.audit.memory import read_peaks
    from kbverify.audit.options import AuditOptions

    options = AuditOptions(tasks=Path("KernelBench"), out_prefix=Path("audits/kernelbench"), device="cuda",
                           hidden_tests=Path("hidden_tests/kernelbench"), hidden_dirs=("hidden_tests/kernelbench",))
    data = read_peaks(REPO / "audits" / "kernelbench.peaks.json", fingerprint=options.fingerprint(), gpu="NVIDIA H200")
    assert len(data["peaks_reserved_bytes"]) == 250


def test_the_audit_command_asks_for_copies_only_through_its_own_options(tmp_path):
    """`kbverify audit` with none of the copies' options is the one-at-a-time audit (None: jobs.run_audit runs it);
    --gpus on a CUDA device means ten copies a GPU unless told otherwise; the copies need --out."""
    from kbverify.audit.options import DEFAULT_PER_GPU, audit_options
    from kbverify.core.errors import InputError

    common = dict(tasks=tmp_path, device="cuda:0", protocol="original", hidden_tests=None, hidden_dirs=(),
                  verbose=False)
    nothing = dict(levels=None, gpus=None, per_gpu=None, shard=None, fresh=None, mps=None)
    assert audit_options(out=None, given=nothing, **common) is None
    options = audit_options(out=tmp_path / "a", given={**nothing, "gpus": 2, "levels": "2,1"}, **common)
    assert options.per_gpu == DEFAULT_PER_GPU and options.levels == (1, 2) and options.sharded
    on_cpu = audit_options(out=tmp_path / "a", given={"gpus": 1}, **{**common, "device": "cpu"})
    assert on_cpu.per_gpu == 1 and not on_cpu.sharded
    with pytest.raises(InputError, match="--gpus needs --out"):
        audit_options(out=None, given={"gpus": 2}, **common)
    with pytest.raises(InputError, match="--levels"):
        audit_options(out=tmp_path / "a", given={"levels": "one"}, **common)
    with pytest.raises(InputError, match="at least 1"):
        audit_options(out=tmp_path / "a", given={"gpus": 0}, **common)
    with pytest.raises(InputError, match="--footprints"):
        audit_options(out=tmp_path / "a", given={"estimate_only": True}, **common)

"""The degenerate-task audit: real worker runs (CPU) on small tasks built to trip one criterion each, and on
tricky honest tasks that must not be called degenerate; resumability; exclusion lists."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbverify.audit import (AuditSettings, AuditThresholds, assess, audit_tasks, audit_to_json_summary,
                            load_exclusions)
from kbverify.core.errors import InputError
from kbverify.core.protocols import KBV, ORIGINAL, VERIFIED
from kbverify.core.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
PROTOCOLS = [ORIGINAL, KBV, VERIFIED]
FAST = AuditSettings(hidden_shapes=False, timeout_s=120)

HEADER = "import torch\nimport torch.nn as nn\n\n\n"


def _task(forward: str, inputs: str, *, init: str = "", init_inputs: str = "[]", params: str = "",
          constants: str = "") -> str:
    return (HEADER + "class Model(nn.Module):\n"
            f"    def __init__(self{', ' + params if params else ''}):\n"
            "        super().__init__()\n"
            f"        {init or 'pass'}\n\n"
            f"    def forward({forward.split(':', 1)[0]}):\n"
            f"        {forward.split(':', 1)[1].strip()}\n\n\n"
            f"{constants}\n\n"
            f"def get_inputs():\n    return {inputs}\n\n\n"
            f"def get_init_inputs():\n    return {init_inputs}\n")


TASKS = {
    # degenerate on purpose, one criterion each
    "level2/1_Constant_Gemm_Max_Subtract_GELU": _task(
        "self, x: x = self.gemm(x).max(dim=1, keepdim=True).values; "
        "return torch.nn.functional.gelu(x - x.mean(dim=1, keepdim=True))",
        "[torch.rand(8, 32)]", init="self.gemm = nn.Linear(32, 16)"),
    "level1/2_NearZero_Softmax": _task("self, x: return torch.softmax(x, dim=1)", "[torch.rand(8, 4096)]"),
    "level1/3_UniformAxis_RowMean": _task(
        "self, x: return x.mean(dim=1, keepdim=True).expand_as(x).contiguous()", "[torch.rand(8, 64)]"),
    "level1/4_MostlyZero_Shrink": _task("self, x: return torch.relu(x - 0.9)", "[torch.rand(8, 256)]"),
    "level1/5_DeadInput": _task("self, x, y: return torch.tanh(x) * 2.0", "[torch.rand(8, 64), torch.rand(8, 64)]"),
    "level2/6_DeadParameter_Bias_Before_BatchNorm": _task(
        "self, x: return torch.relu(self.bn(self.gemm(x) + self.bias))", "[torch.rand(16, 32)]",
        init="self.gemm = nn.Linear(32, 16); self.bias = nn.Parameter(torch.randn(16)); "
             "self.bn = nn.BatchNorm1d(16)"),
    "level1/7_Stochastic_EntropyNoise": _task(
        "self, x: g = torch.Generator(device=x.device); g.seed(); "
        "return x + torch.rand(x.shape, generator=g, device=x.device)", "[torch.rand(8, 64)]"),
    "level1/8_NonFinite_Sqrt": _task("self, x: return torch.sqrt(x) * 0.5", "[torch.rand(8, 64)]"),
    "level1/9_Identity_MaxPool_k1": _task("self, x: return self.pool(x)", "[torch.rand(2, 4, 8, 8)]",
                                          init="self.pool = nn.MaxPool2d(kernel_size=1, stride=1)"),
    # passable only through the positivity of torch.rand: reported, not degenerate
    "level1/10_ReLU_rand": _task("self, x: return torch.relu(x)", "[torch.rand(8, 64)]"),
    # tricky honest tasks
    "level1/11_Softmax_signed_64": _task("self, x: return torch.softmax(x, dim=1)", "[torch.randn(32, 64)]"),
    "level1/12_LayerNorm": _task("self, x: return self.ln(x)", "[torch.rand(8, 16, 8)]",
                                 init="self.ln = nn.LayerNorm((16, 8))"),
    "level1/13_Linear": _task("self, x: return self.fc(x)", "[torch.rand(16, 64)]",
                              init="self.fc = nn.Linear(64, 32)"),
}
HONEST = ("11_Softmax_signed_64", "12_LayerNorm", "13_Linear")
PRECISION_ONLY = ("trivially_passable:bf16:", "trivially_passable:fp16:")


def _write(root: Path, relative: str, source: str) -> Path:
    path = root / f"{relative}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    tasks = [load_task(_write(root, relative, source)) for relative, source in TASKS.items()]
    prefix = tmp_path_factory.mktemp("audits") / "small"
    report = audit_tasks(tasks, protocols=PROTOCOLS, out_prefix=prefix, settings=FAST)
    return {a.name: a for a in report.tasks}, report, prefix, {t.name: t for t in tasks}


def _flags(audits, name) -> set[str]:
    assert audits[name].error is None, audits[name].error
    return set(audits[name].flags)


def test_constant_output_is_degenerate_under_every_protocol(audited):
    audits = audited[0]
    flags = _flags(audits, "1_Constant_Gemm_Max_Subtract_GELU")
    assert {"constant_output", "near_zero:original", "near_zero:verified"} <= flags
    assert audits["1_Constant_Gemm_Max_Subtract_GELU"].degenerate_under == ("original", "kbv", "verified")
    families = audits["1_Constant_Gemm_Max_Subtract_GELU"].evidence["constant_output"]["families"]
    assert {f["weights"] for f in families} == {"default", "rerandomized"}
    assert all(f["max_abs_spread"] == 0.0 and f["sets"] == FAST.seeds * len(FAST.distributions) for f in families)


def test_near_zero_is_per_protocol(audited):
    audits = audited[0]
    flags = _flags(audits, "2_NearZero_Softmax")
    # every output is about 1/4096: zeros pass allclose at 1e-2 and 1e-3, never the norm-wise rule
    assert {"near_zero:original", "near_zero:kbv"} <= flags
    assert "near_zero:verified" not in flags
    assert audits["2_NearZero_Softmax"].degenerate_under == ("original", "kbv")
    assert {"mostly_zero", "mostly_mean"} <= flags


def test_reported_only_criteria(audited):
    audits = audited[0]
    expected = {"3_UniformAxis_RowMean": "uniform_axis", "4_MostlyZero_Shrink": "mostly_zero",
                "5_DeadInput": "dead_input", "6_DeadParameter_Bias_Before_BatchNorm": "dead_parameter",
                "8_NonFinite_Sqrt": "nonfinite:neg", "10_ReLU_rand": "trivially_passable:input:original"}
    for name, flag in expected.items():
        assert flag in _flags(audits, name), (name, audits[name].flags)
        assert not audits[name].degenerate, (name, audits[name].flags)


def test_dead_input_and_parameter_evidence(audited):
    audits = audited[0]
    dead_inputs = audits["5_DeadInput"].evidence["dead_input"]["inputs"]
    assert [i["name"] for i in dead_inputs] == ["input 1"]
    assert "dead_parameter" not in audits["5_DeadInput"].flags
    dead = {p["name"] for p in audits["6_DeadParameter_Bias_Before_BatchNorm"].evidence["dead_parameter"]["parameters"]}
    assert dead == {"bias", "gemm.bias"}  # the BatchNorm removes any per-feature constant; the weights matter


def test_nonfinite_distribution_is_invalid_not_degenerate(audited):
    audit = audited[0]["8_NonFinite_Sqrt"]
    assert set(audit.invalid_distributions) == {"neg", "mixed_sign"}  # a square root of negative inputs
    assert all(entry["reason"].startswith("reference output has") for entry in audit.invalid_distributions["neg"])


def test_stochastic_and_identity_are_degenerate(audited):
    audits = audited[0]
    assert "stochastic" in _flags(audits, "7_Stochastic_EntropyNoise")
    assert audits["7_Stochastic_EntropyNoise"].degenerate
    flags = _flags(audits, "9_Identity_MaxPool_k1")
    assert "trivially_passable:input:verified" in flags
    assert audits["9_Identity_MaxPool_k1"].degenerate_under == ("original", "kbv", "verified")


@pytest.mark.parametrize("name", HONEST)
def test_honest_tasks_are_not_degenerate(audited, name):
    audit = audited[0][name]
    assert audit.error is None
    assert not audit.degenerate
    assert [f for f in audit.flags if not f.startswith(PRECISION_ONLY)] == []


def test_thresholds_are_data(audited):
    _, _, prefix, tasks = audited
    lines = {line["name"]: line for line in map(json.loads, Path(f"{prefix}.partial.jsonl").read_text().splitlines())}
    strict = AuditThresholds(mostly_fraction=0.95)  # relu(x − 0.9) zeroes ~90% of the elements
    shrink = assess(tasks["4_MostlyZero_Shrink"], lines["4_MostlyZero_Shrink"], protocols=PROTOCOLS, thresholds=strict)
    assert "mostly_zero" not in shrink.flags
    linear = lines["13_Linear"]
    fast = {**linear, "raw": {**linear["raw"], "timing": {"reference_median_us": 6.0, "launch_floor_median_us": 4.5}}}
    assert "timing_degenerate" in assess(tasks["13_Linear"], fast, protocols=PROTOCOLS,
                                         thresholds=AuditThresholds()).flags
    slow = {**linear, "raw": {**linear["raw"], "timing": {"reference_median_us": 900.0, "launch_floor_median_us": 4.5}}}
    assert "timing_degenerate" not in assess(tasks["13_Linear"], slow, protocols=PROTOCOLS,
                                             thresholds=AuditThresholds()).flags


def test_reports_and_exclusions(audited):
    audits, report, prefix, _ = audited
    data = json.loads(Path(f"{prefix}.json").read_text())
    assert data["thresholds"] == AuditThresholds().to_dict()
    assert set(data["exclusions"]) == {a.task for a in audits.values() if a.degenerate}
    markdown = Path(f"{prefix}.md").read_text()
    assert "| task | degenerate | flags | evidence | low precision passes |" in markdown
    assert all(f"| {a.task} |" in markdown for a in audits.values())

    excluded = load_exclusions(f"{prefix}.json")
    assert {"level2/1_Constant_Gemm_Max_Subtract_GELU", "1_Constant_Gemm_Max_Subtract_GELU",
            "level1/2_NearZero_Softmax", "level1/9_Identity_MaxPool_k1"} <= excluded
    assert "level1/13_Linear" not in excluded and "level1/10_ReLU_rand" not in excluded
    verified = load_exclusions(f"{prefix}.json", protocol="verified")
    assert "level1/2_NearZero_Softmax" not in verified and "level1/7_Stochastic_EntropyNoise" in verified
    with pytest.raises(InputError):
        load_exclusions(f"{prefix}.json", protocol="nonesuch")
    with pytest.raises(InputError):
        load_exclusions(f"{prefix}.md")

    summary = audit_to_json_summary(report)
    json.dumps(summary, allow_nan=False)
    entry = next(t for t in summary["tasks"] if t["task"] == "level1/5_DeadInput")
    assert entry["degenerate"] is False and "dead_input" in entry["flags"] and "dead_input" in entry["evidence"]


def test_hidden_shapes_are_audited(tmp_path):
    source = _task("self, x: x = self.gemm(x).max(dim=1, keepdim=True).values; "
                   "return torch.nn.functional.gelu(x - x.mean(dim=1, keepdim=True))",
                   "[torch.rand(batch_size, in_features)]", params="in_features",
                   init="self.gemm = nn.Linear(in_features, 16)", init_inputs="[in_features]",
                   constants="batch_size = 8\nin_features = 32\n")
    task = load_task(_write(tmp_path, "level2/1_Constant_Gemm_Max_Subtract_GELU", source))
    report = audit_tasks([task], protocols=[VERIFIED], settings=AuditSettings(timeout_s=120))
    audit = report.tasks[0]
    assert audit.hidden_shapes in ("generated", "committed")
    shapes = {f["shape"] for f in audit.evidence["constant_output"]["families"]}
    assert "original" in shapes and any(s.startswith("hidden:") for s in shapes)


def test_crash_and_timeout_are_errors_and_the_audit_goes_on(tmp_path):
    crash = load_task(_write(tmp_path, "level1/1_Crash", _task("self, x: import os; os._exit(3)", "[torch.rand(4)]")))
    hang = load_task(_write(tmp_path, "level1/2_Hang", _task("self, x: import time; time.sleep(60); return x",
                                                              "[torch.rand(4)]")))
    fine = load_task(_write(tmp_path, "level1/3_Linear", TASKS["level1/13_Linear"]))
    settings = AuditSettings(hidden_shapes=False, timeout_s=4)
    report = audit_tasks([crash, hang, fine], protocols=[ORIGINAL], settings=settings, out_prefix=tmp_path / "a")
    by_name = {a.name: a for a in report.tasks}
    assert "worker died" in by_name["1_Crash"].error
    assert "timeout" in by_name["2_Hang"].error
    assert by_name["3_Linear"].error is None and not by_name["3_Linear"].degenerate
    assert report.to_dict()["counts"]["errors"] == 2


_KILL_SCRIPT = """
import sys
from kbverify.audit import AuditSettings, audit_tasks
from kbverify.core.tasks import load_task

if __name__ == "__main__":
    tasks = [load_task(p) for p in sys.argv[2:]]
    audit_tasks(tasks, protocols=["original"], out_prefix=sys.argv[1],
                settings=AuditSettings(hidden_shapes=False, timeout_s=120))
"""


def test_resume_after_a_kill(tmp_path):
    fine = _write(tmp_path, "level1/1_Linear", TASKS["level1/13_Linear"])
    pid_file = tmp_path / "child.pid"
    slow = _write(tmp_path, "level1/2_Slow", _task(
        "self, x: return x", "[torch.rand(4)]", init_inputs="_record_pid()",
        constants=f"def _record_pid():\n    import os, time\n    open({str(pid_file)!r}, 'w').write(str(os.getpid()))"
                  "\n    time.sleep(60)\n    return []\n"))
    relu = _write(tmp_path, "level1/3_ReLU", TASKS["level1/10_ReLU_rand"])
    prefix = tmp_path / "audits" / "run"
    script = tmp_path / "run_audit.py"
    script.write_text(_KILL_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, str(script), str(prefix), str(fine), str(slow)], env=env,
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = Path(f"{prefix}.partial.jsonl")
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid_file.exists(), "the audit never reached the slow task"
        time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if pid_file.exists() and pid_file.read_text():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the task's child has its own session
            except ProcessLookupError:
                pass
    assert not Path(f"{prefix}.json").exists()  # the final report is only written at the end
    lines = partial.read_text().splitlines()
    assert [json.loads(line)["name"] for line in lines] == ["1_Linear"]

    with open(partial, "a") as handle:
        handle.write('{"key": "level1/3_ReLU@cut sho')  # a line cut short by a kill mid-write
    seen = []
    report = audit_tasks([load_task(fine), load_task(relu)], protocols=["original"], out_prefix=prefix,
                         settings=AuditSettings(hidden_shapes=False, timeout_s=120),
                         progress=lambda done, total, audit: seen.append((audit.name, audit.resumed)))
    assert seen == [("1_Linear", True), ("3_ReLU", False)]
    parsed = []
    for line in partial.read_text().splitlines():
        try:
            parsed.append(json.loads(line)["name"])
        except json.JSONDecodeError:
            continue
    assert parsed == ["1_Linear", "3_ReLU"]
    assert [a.name for a in report.tasks] == ["1_Linear", "3_ReLU"]
    assert json.loads(Path(f"{prefix}.json").read_text())["counts"]["resumed"] == 1

    again = audit_tasks([load_task(fine), load_task(relu)], protocols=["original"], out_prefix=prefix,
                        settings=AuditSettings(hidden_shapes=False, timeout_s=120))
    assert all(a.resumed for a in again.tasks)
    assert [a.flags for a in again.tasks] == [a.flags for a in report.tasks]


def test_committed_manifest_found_through_a_relative_path(monkeypatch):
    """The worker runs in a directory of its own: a relative --hidden-tests path must still reach the manifest."""
    repo = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(repo)
    task = load_task(repo / "tasks" / "basic" / "level1" / "1_ReLU.py")
    settings = AuditSettings(seeds=1, hidden_dirs=("hidden_tests/tasks",), null_kernels=("zeros",))
    report = audit_tasks([task], protocols=[ORIGINAL], settings=settings)
    assert report.tasks[0].hidden_shapes == "committed"
    manifest = json.loads((repo / "hidden_tests" / "tasks" / "basic" / "level1" / "1_ReLU.json").read_text())
    assert manifest["sha256"] == task.sha256 and manifest["shapes"]


def test_copies_share_the_task_list_through_claims_and_merge_once(tmp_path):
    """Two auditors over one list: each task audited by exactly one of them; a later invocation skips what either
    finished; merging leaves one line per task and removes the copies' files."""
    from kbverify.audit import finished_keys, merge_partials, settings_fingerprint

    from kbverify.audit.copies import claimer

    tasks = [load_task(_write(tmp_path, name, TASKS[source])) for name, source in
             (("level1/1_Linear", "level1/13_Linear"), ("level1/2_ReLU", "level1/10_ReLU_rand"))]
    settings = AuditSettings(hidden_shapes=False, timeout_s=120)
    claims = claimer(tmp_path / "claims", set())
    taken_by_first = []

    def first_takes_one(task):
        if taken_by_first:
            return False
        taken_by_first.append(task.key)
        return claims(task)

    prefix = tmp_path / "run"
    first = audit_tasks(tasks, protocols=["original"], out_prefix=f"{prefix}.shard0", settings=settings,
                        claim=first_takes_one)
    second = audit_tasks(tasks, protocols=["original"], out_prefix=f"{prefix}.shard1", settings=settings,
                         claim=claims)
    assert [a.key for a in first.tasks] == [tasks[0].key]
    assert [a.key for a in second.tasks] == [tasks[1].key]  # the first's claim held
    shards = [Path(f"{prefix}.shard{i}.partial.jsonl") for i in range(2)]
    assert finished_keys(shards, protocols=["original"], device="cpu", settings=settings) == {t.key for t in tasks}
    assert finished_keys(shards, protocols=["verified"], device="cpu", settings=settings) == set()  # other settings

    merged = Path(f"{prefix}.partial.jsonl")
    merged.write_text(json.dumps({"key": tasks[0].key, "raw": None, "error": "timeout"}) + "\n")  # an earlier failure
    with open(shards[1], "a") as handle:  # a later line from a run with other settings must not win
        handle.write(json.dumps({"key": tasks[1].key, "raw": {"stale": True}, "settings_sha256": "other"}) + "\n")
    fingerprint = settings_fingerprint(protocols=["original"], device="cpu", settings=settings)
    assert merge_partials(merged, shards, fingerprint) == 2
    assert not any(path.exists() for path in shards)
    lines = [json.loads(line) for line in merged.read_text().splitlines()]
    assert sorted(line["key"] for line in lines) == sorted(t.key for t in tasks)
    assert all(line["raw"] is not None for line in lines)  # the result replaced the earlier error
    assert all(line["settings_sha256"] == fingerprint for line in lines)
    report = audit_tasks(tasks, protocols=["original"], out_prefix=prefix, settings=settings)
    assert all(a.resumed for a in report.tasks)


def test_out_of_memory_is_an_error_to_rerun_never_an_invalid_set(tmp_path):
    """Several audits sharing a GPU run it out of memory now and then: that says nothing about the task, so the
    audit stops with an error (rerun later) instead of recording invalid sets or dead null kernels."""
    crowded = _write(tmp_path, "level1/1_Crowded", _task(
        "self, x: return x * 2 if float(x.abs().max()) < 2 else _oom()", "[torch.rand(8, 8)]",
        constants="def _oom():\n    raise RuntimeError('CUDA out of memory. Tried to allocate 8.00 GiB')\n"))
    report = audit_tasks([load_task(crowded)], protocols=PROTOCOLS, out_prefix=tmp_path / "run", settings=FAST)
    (audit,) = report.tasks
    assert not audit.degenerate and not audit.flags
    assert audit.error and "out of memory, not evidence" in audit.error
    line = json.loads((tmp_path / "run.partial.jsonl").read_text().splitlines()[0])
    assert line["raw"] is None  # so a rerun audits it again


def test_report_only_runs_nothing_and_shows_what_the_partial_file_lacks(tmp_path, monkeypatch):
    """A cut-short audit reported as such: the finished task from the partial file, the one that failed with its
    recorded error, the one never reached as not audited; no worker starts."""
    import kbverify.audit.run as audit_module

    tasks = [load_task(_write(tmp_path, f"level1/{i}_ReLU", TASKS["level1/10_ReLU_rand"])) for i in (1, 2, 3)]
    prefix = tmp_path / "audits" / "run"
    settings = AuditSettings(hidden_shapes=False, seeds=1, null_kernels=("zeros",), timeout_s=120)
    audit_tasks(tasks[:1], protocols=["original"], out_prefix=prefix, settings=settings)
    fingerprint = json.loads(Path(f"{prefix}.partial.jsonl").read_text().splitlines()[0])["settings_sha256"]
    with open(f"{prefix}.partial.jsonl", "a") as handle:
        handle.write(json.dumps({"key": tasks[1].key, "name": tasks[1].name, "level": 1, "raw": None, "wall_s": 2.0,
                                 "error": "worker failed: out of memory", "settings_sha256": fingerprint}) + "\n")

    def no_workers(*args, **kwargs):
        raise AssertionError("report-only must not run a task")

    monkeypatch.setattr(audit_module, "_run_task", no_workers)
    report = audit_tasks(tasks, protocols=["original"], out_prefix=prefix, settings=settings, run=False)
    errors = [a.error for a in report.tasks]
    assert errors[0] is None and report.tasks[0].resumed
    assert errors[1] == "worker failed: out of memory"
    assert errors[2].startswith("not audited")
    assert json.loads(Path(f"{prefix}.json").read_text())["counts"]["errors"] == 2
    assert len(Path(f"{prefix}.partial.jsonl").read_text().splitlines()) == 2  # nothing appended


def test_a_timing_threshold_beyond_what_the_worker_decides_exactly_is_refused():
    from kbverify.audit import AuditSettings, AuditThresholds, audit_tasks
    from kbverify.core.errors import InputError

    with pytest.raises(InputError, match="timing_decided_us"):
        audit_tasks([], protocols=["original"], thresholds=AuditThresholds(timing_min_us=1500.0),
                    settings=AuditSettings(timing_decided_us=1000.0), run=False)

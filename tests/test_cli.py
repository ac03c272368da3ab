"""The command-line contract of SPEC §10, through `python -m kbverify` as a script or CI job calls it.

Exit codes: 0 the job completed (for `check`: every verdict passed and reached --min-speedup), 1 a submission was
rejected, 2 a usage or input error (one line on stderr, no traceback, nothing half-written), 3 an infrastructure
error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kbverify.core.tasks import load_task
from kbverify.results.store import Store

REPO = Path(__file__).resolve().parent.parent
WORKER_TIMEOUT_S = 60
RELU = REPO / "tasks" / "basic" / "level1" / "1_ReLU.py"
GELU = REPO / "tasks" / "basic" / "level1" / "8_GELU_.py"

HONEST_RELU = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0)
'''
# torch.rand inputs are never negative: the identity passes `original` and fails `verified`'s signed sets.
IDENTITY_RELU = HONEST_RELU.replace("x.clamp_min(0)", "x.clone()")
WRONG_RELU = HONEST_RELU.replace("x.clamp_min(0)", "x.clamp_min(0) * 0.5")
NO_MODELNEW = HONEST_RELU.replace("class ModelNew", "class ModelNewer")
HONEST_GELU = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))
'''


def kbverify(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    args = [str(arg) for arg in args]
    if args[0] in ("check", "rescore") and "--timeout" not in args:
        args += ["--timeout", str(WORKER_TIMEOUT_S)]  # a stuck worker becomes a verdict, not a stuck test
    return subprocess.run([sys.executable, "-m", "kbverify", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def assert_input_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.startswith("kbverify: ")
    for word in words:
        assert word in result.stderr


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def fast_verified(tmp_path_factory) -> Path:
    """`verified` with a short timing budget, as a protocol file (the CLI's way to derive a protocol), without the
    set run as a user calls the model (an interpreter a check; tests/test_as_user.py is about it)."""
    return write(tmp_path_factory.mktemp("protocols") / "verified.json",
                 json.dumps({"base": "verified", "name": "verified", "timing_budget_s": 0.2, "as_user_set": False}))


# --- check ------------------------------------------------------------------------------------------------------

def test_check_json_has_the_documented_shape_and_exit_0_when_passed(tmp_path, fast_verified):
    submission = write(tmp_path / "relu_clamp.py", HONEST_RELU)
    result = kbverify("check", submission, "--task", RELU, "--protocol", f"original,{fast_verified}",
                      "--device", "cpu", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = result.stdout.splitlines()
    report = json.loads(line)
    assert report["task"] == "1_ReLU" and report["submission"] == "relu_clamp.py"
    assert list(report["verdicts"]) == ["original", "verified"]
    for name, verdict in report["verdicts"].items():
        assert {"status", "speedup", "speedup_ci", "warnings"} <= set(verdict), name
        assert verdict["status"] == "passed" and isinstance(verdict["warnings"], list)
        assert isinstance(verdict["speedup"], float) and verdict["speedup"] > 0
    low, high = report["verdicts"]["verified"]["speedup_ci"]
    assert low <= report["verdicts"]["verified"]["speedup"] <= high
    assert report["verdicts"]["original"]["speedup_ci"] is None  # KernelBench's mean of 100 has no interval


def test_check_rejects_a_wrong_kernel_with_exit_1(tmp_path):
    submission = write(tmp_path / "relu_half.py", WRONG_RELU)
    result = kbverify("check", submission, "--task", RELU, "--protocol", "original", "--device", "cpu", "--json")
    assert result.returncode == 1, result.stderr[-2000:]
    assert json.loads(result.stdout)["verdicts"]["original"]["status"] == "incorrect"


def test_min_speedup_out_of_reach_rejects_an_honest_kernel(tmp_path):
    submission = write(tmp_path / "relu_clamp.py", HONEST_RELU)
    result = kbverify("check", submission, "--task", RELU, "--protocol", "original", "--device", "cpu", "--json",
                      "--min-speedup", "1000")
    assert result.returncode == 1, result.stderr[-2000:]
    verdict = json.loads(result.stdout)["verdicts"]["original"]
    assert verdict["status"] == "passed" and verdict["speedup"] < 1000


def test_a_submission_without_modelnew_is_a_verdict_not_an_input_error(tmp_path):
    submission = write(tmp_path / "misnamed.py", NO_MODELNEW)
    result = kbverify("check", submission, "--task", RELU, "--protocol", "original", "--device", "cpu", "--json")
    assert result.returncode == 1, result.stderr[-2000:]
    assert json.loads(result.stdout)["verdicts"]["original"]["status"] == "compile_error"


def test_check_a_folder_prints_one_object_per_submission(tmp_path):
    write(tmp_path / "subs" / "a_clamp.py", HONEST_RELU)
    write(tmp_path / "subs" / "b_half.py", WRONG_RELU)
    result = kbverify("check", tmp_path / "subs", "--task", RELU, "--protocol", "original", "--device", "cpu",
                      "--json")
    assert result.returncode == 1, result.stderr[-2000:]
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    statuses = {r["submission"]: r["verdicts"]["original"]["status"] for r in reports}
    assert statuses == {"a_clamp.py": "passed", "b_half.py": "incorrect"}


def test_input_errors_exit_2_with_one_line(tmp_path):
    good = write(tmp_path / "relu_clamp.py", HONEST_RELU)
    not_a_task = write(tmp_path / "level1" / "1_Nothing.py", "import torch\n\nbatch_size = 4\n")
    assert_input_error(kbverify("check", tmp_path / "missing.py", "--task", RELU, "--device", "cpu"), "missing.py")
    assert_input_error(kbverify("check", good, "--task", tmp_path / "missing_task.py", "--device", "cpu"),
                       "missing_task.py")
    assert_input_error(kbverify("check", good, "--task", not_a_task, "--device", "cpu"), "Model")
    assert_input_error(kbverify("check", good, "--task", RELU, "--protocol", "original,fastest", "--device", "cpu"),
                       "fastest")
    assert_input_error(kbverify("check", good, "--task", RELU, "--device", "gpu"), "gpu")


def test_usage_errors_exit_2_with_one_line(tmp_path):
    good = write(tmp_path / "relu_clamp.py", HONEST_RELU)
    assert_input_error(kbverify("check", good), "task")
    assert_input_error(kbverify("frobnicate"), "frobnicate")


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(_cuda_available(), reason="this machine has a CUDA device")
def test_asking_for_cuda_without_one_is_an_infrastructure_error(tmp_path):
    submission = write(tmp_path / "relu_clamp.py", HONEST_RELU)
    result = kbverify("check", submission, "--task", RELU, "--protocol", "original", "--device", "cuda")
    assert result.returncode == 3, (result.returncode, result.stderr[-2000:])
    # one line of error, the last, after the check's progress lines (kbverify.harness.check_progress)
    *progress, error = result.stderr.splitlines()
    assert error.startswith("kbverify: ") and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert all(line.startswith("kbverify 0:") and "done" not in line for line in progress), progress
    assert result.stdout == ""


# --- rescore input errors -------------------------------------------------------------------------------------------

def test_malformed_jsonl_is_refused_before_a_store_is_made(tmp_path):
    source = write(tmp_path / "run.jsonl", json.dumps({"task": str(RELU), "code": HONEST_RELU}) + "\n{not json\n")
    store = tmp_path / "store.sqlite"
    assert_input_error(kbverify("rescore", source, "--store", store, "--device", "cpu"), "run.jsonl:2")
    assert not store.exists()
    assert_input_error(kbverify("rescore", tmp_path / "absent.jsonl", "--store", store, "--device", "cpu"),
                       "absent.jsonl")
    assert_input_error(kbverify("rescore", source, "--store", store, "--protocol", "strictest", "--device", "cpu"))


# --- score ----------------------------------------------------------------------------------------------------------

def test_score_reproduces_the_spec_worked_example(tmp_path):
    """10 tasks, 3 incorrect, speedups 0.6 … 2.5: fast_0 = 70%, fast_1 = 40%, fast_2 = 10% (SPEC §5)."""
    speedups = [None, None, None, 0.6, 0.9, 1.0, 1.2, 1.5, 1.8, 2.5]
    lines = [json.dumps({"task": f"level1/{i + 1}_Task.py", "correct": s is not None, "speedup": s})
             for i, s in enumerate(speedups)]
    source = write(tmp_path / "scores.jsonl", "\n".join(lines) + "\n")
    result = kbverify("score", source, "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    table = json.loads(result.stdout)["tables"]["scores"]
    assert table["n_tasks"] == 10 and table["n_correct"] == 7
    fast = {row["p"]: row["fast_p"] for row in table["rows"]}
    assert fast == pytest.approx({0.0: 0.7, 0.5: 0.7, 1.0: 0.4, 1.5: 0.2, 2.0: 0.1})
    text = kbverify("score", source, "--p", "0,1,2")
    assert text.returncode == 0
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in text.stdout.splitlines()
            if line.startswith("| fast_")}
    assert [rows[k].split()[0] for k in ("fast_0", "fast_1", "fast_2")] == ["70.0%", "40.0%", "10.0%"]


def test_score_kernelbench_eval_results_against_a_baseline(tmp_path):
    baseline = write(tmp_path / "baseline_time_torch.json", json.dumps({
        "level1": {"1_ReLU.py": {"mean": 1.0}, "2_Matmul.py": {"mean": 4.0}, "3_Softmax.py": {"mean": 2.0},
                   "4_Conv.py": {"mean": 3.0}},
        "level2": {"1_Other.py": {"mean": 1.0}}}))
    results = write(tmp_path / "eval_results.json", json.dumps({
        "1": [{"sample_id": 0, "compiled": True, "correctness": True, "runtime": 0.5}],  # 2.0x: not > 2
        "2": [{"sample_id": 0, "compiled": True, "correctness": True, "runtime": 5.0}],  # 0.8x
        "3": [{"sample_id": 0, "compiled": True, "correctness": False, "runtime": 0.1}],  # fast but wrong
        # 4 has no result: incorrect, still in the denominator
    }))
    result = kbverify("score", results, "--baseline", baseline, "--level", "1", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    table = json.loads(result.stdout)["tables"]["kernelbench"]
    assert table["n_tasks"] == 4 and table["n_correct"] == 2
    assert [row["fast_p"] for row in table["rows"]] == pytest.approx([0.5, 0.5, 0.25, 0.25, 0.0])
    assert_input_error(kbverify("score", results, "--baseline", baseline), "--level")


def test_score_input_errors(tmp_path):
    assert_input_error(kbverify("score", tmp_path / "nothing.jsonl"), "nothing.jsonl")
    bad = write(tmp_path / "bad.jsonl", json.dumps({"task": "a.py", "correct": "yes", "speedup": 1.0}) + "\n")
    assert_input_error(kbverify("score", bad), "bad.jsonl:1")
    assert_input_error(kbverify("score", bad, "--p", "0,one"), "--p")


# --- a store: report and rejudge ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory, fast_verified) -> Path:
    """A real store: an honest GELU and a ReLU that returns its input, under original and verified."""
    root = tmp_path_factory.mktemp("rescored")
    rows = [{"task": str(RELU), "id": "relu_identity", "code": IDENTITY_RELU, "claimed_speedup": 1.4},
            {"task": str(GELU), "id": "gelu_erf", "code": HONEST_GELU, "claimed_speedup": 1.1}]
    source = write(root / "run.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    path = root / "store.sqlite"
    result = kbverify("rescore", source, "--store", path, "--protocol", f"original,{fast_verified}", "--device",
                      "cpu", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    return path


def test_report_writes_three_files(store, tmp_path):
    result = kbverify("report", store, "--out", tmp_path / "report")
    assert result.returncode == 0, result.stderr[-2000:]
    paths = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert set(paths) == {"json", "md", "html"}
    assert all(Path(path).is_file() and Path(path).parent == tmp_path / "report" for path in paths.values())
    report = json.loads(Path(paths["json"]).read_text())
    assert report["protocols"] == ["original", "verified"] and len(report["verdicts"]) == 4
    assert [(c["submission"], c["change"]) for c in report["status_changes"]] == [
        ("relu_identity", "passed → incorrect")]
    assert "passed → incorrect" in Path(paths["md"]).read_text()
    # The report and `score` of the same store agree.
    scored = kbverify("score", store, "--json")
    assert scored.returncode == 0, scored.stderr[-2000:]
    for name, table in json.loads(scored.stdout)["tables"].items():
        assert [r["fast_p"] for r in report["by_protocol"][name]["fast_p"]] == [r["fast_p"] for r in table["rows"]]


def test_report_input_errors(tmp_path):
    assert_input_error(kbverify("report", tmp_path / "absent.sqlite", "--out", tmp_path / "out"), "absent.sqlite")
    with Store(tmp_path / "empty.sqlite"):
        pass
    assert_input_error(kbverify("report", tmp_path / "empty.sqlite", "--out", tmp_path / "out"), "no verdicts")
    assert not (tmp_path / "out").exists()


def test_rejudge_under_kbv_and_under_the_same_rules(store):
    with Store(store) as opened:
        measured = {v.submission: v.status.value for _, v in opened.verdicts() if v.sets}
    assert set(measured) == {"relu_identity", "gelu_erf"}  # the isolated (verified) verdicts keep raw evidence

    result = kbverify("rejudge", store, "--protocol", "kbv", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    rejudged = json.loads(result.stdout)
    assert rejudged["protocol"] == "kbv" and rejudged["rejudged"] == len(measured)
    kbv = rejudged["tables"]["kbv"]
    # kbv's signed set still catches the identity; the honest GELU still passes.
    assert kbv["n_tasks"] == 2 and kbv["n_correct"] == 1
    assert all(change["submission"] in measured for change in rejudged["changes"])

    same = json.loads(kbverify("rejudge", store, "--protocol", "verified", "--json").stdout)
    assert same["rejudged"] == len(measured) and same["changes"] == []


# --- hidden shapes ---------------------------------------------------------------------------------------------------

def test_hidden_generate_writes_manifests_that_check_then_uses(tmp_path, fast_verified):
    tasks = tmp_path / "tasks"
    write(tasks / "level1" / "1_ReLU.py", RELU.read_text())
    result = kbverify("hidden", "generate", tasks, "--out", tmp_path / "hidden")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert (summary["tasks"], summary["failures"]) == (1, 0)
    manifest = json.loads((tmp_path / "hidden" / "level1" / "1_ReLU.json").read_text())
    assert manifest["sha256"] == load_task(RELU).sha256
    assert manifest["shapes"] and all(shape["input_shapes"] != [[16, 512]] for shape in manifest["shapes"])

    submission = write(tmp_path / "relu_clamp.py", HONEST_RELU)
    checked = kbverify("check", submission, "--task", tasks / "level1" / "1_ReLU.py", "--protocol", fast_verified,
                       "--hidden-tests", tmp_path / "hidden", "--device", "cpu", "--json")
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert json.loads(checked.stdout)["verdicts"]["verified"]["hidden_shapes"] == "committed"


def test_rescore_applies_an_audit_exclusion_list_and_names_what_it_left_out(store, tmp_path, fast_verified):
    from kbverify.audit import FORMAT

    audit = write(tmp_path / "audit.json", json.dumps({"format": FORMAT, "exclusions": [f"level1/{RELU.stem}"]}))
    source = store.parent / "run.jsonl"
    arguments = ("--store", store, "--protocol", f"original,{fast_verified}", "--device", "cpu")
    result = kbverify("rescore", source, *arguments, "--exclude-degenerate", audit)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "0 evaluated now" in result.stdout  # everything resumed from the store
    assert "excluded as degenerate" in result.stdout and RELU.stem in result.stdout
    assert_input_error(kbverify("rescore", source, *arguments, "--exclude-degenerate", tmp_path / "none.json"),
                       "none.json")


@pytest.mark.parametrize("protocol, timing", [("original", False), ("verified", True), ("original,verified", True)])
def test_check_preloads_the_timing_workers_scipy_only_when_timing_rounds_will_run(monkeypatch, protocol, timing):
    """scipy.stats costs ~60% of torch's import at every worker server's start: `original` alone never uses it."""
    from typer.testing import CliRunner

    from kbverify.cli import app as cli
    from kbverify.harness import sandbox

    asked = []

    def start_early(*, timing=True):
        asked.append(timing)
        raise RuntimeError("stop here")

    monkeypatch.setattr(sandbox, "start_early", start_early)
    result = CliRunner().invoke(cli.app, ["check", str(RELU), "--task", str(RELU), "--protocol", protocol])
    assert asked == [timing] and "stop here" in str(result.exception)
    assert ("scipy.stats" in sandbox.preload(timing=timing)) is timing


def test_the_entry_point_starts_the_server_with_what_the_command_will_need(tmp_path):
    from kbverify.__main__ import _server_timing

    task = write(tmp_path / "t.py", RELU.read_text())
    assert _server_timing(["check", "s.py", "--task", str(task), "--protocol", "original"]) is False
    assert _server_timing(["check", "s.py", "--task", str(task), "--protocol=original,verified"]) is True
    assert _server_timing(["check", "s.py", f"--task={task}"]) is True  # verified, check's default, times interleaved
    # the other commands start it once their input is validated, so bad input never starts a worker
    assert _server_timing(["audit", "tasks/"]) is None
    assert _server_timing(["rescore", "run.jsonl"]) is None
    # nothing to start for help, unknown commands, or input the command line will reject itself
    assert _server_timing(["check", "--help"]) is None
    assert _server_timing(["score", "x.jsonl"]) is None
    assert _server_timing(["check", "s.py", "--task", str(task), "--protocol", "no-such-protocol"]) is None
    assert _server_timing(["check", "s.py", "--protocol", "original"]) is None  # no --task: a usage error
    assert _server_timing(["check", "s.py", "--task", str(tmp_path / "missing.py")]) is None
    assert _server_timing([]) is None


@pytest.mark.parametrize("device, cuda_available, resolved", [("auto", False, "cpu"), ("auto", True, "cuda:0"),
                                                               ("cuda", None, "cuda:0"), ("cuda:1", None, "cuda:1")])
def test_check_resolves_the_device_after_validating_it(monkeypatch, device, cuda_available, resolved):
    from typer.testing import CliRunner

    from kbverify.cli import app as cli
    from kbverify.core.records import Verdict
    from kbverify.core.status import Status
    from kbverify.harness import runner, sandbox

    used = []

    def check(task, submission, protocol, options, **fields):
        used.append(options.device)
        return Verdict(task=task.key, task_name=task.name, level=1, problem_id=1, submission=submission.id,
                       submission_sha256="", protocol=protocol.name, protocol_sha256="", status=Status.PASSED)

    probe = sandbox.ChildOutcome({"cuda_available": cuda_available}, 0, False, "", "", "", 0, 0.1)
    monkeypatch.setattr(sandbox, "start_early", lambda **kwargs: None)
    monkeypatch.setattr(sandbox, "run_child", lambda job, payload, **kwargs: probe)
    monkeypatch.setattr(runner, "check", check)
    result = CliRunner().invoke(cli.app, ["check", str(RELU), "--task", str(RELU), "--protocol", "original",
                                          "--device", device])
    assert result.exit_code == 0, result.output
    assert used == [resolved]

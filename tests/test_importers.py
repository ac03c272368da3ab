"""Importers: KernelBench run folders, CUDA-L1 JSON Lines, the generic JSONL; known-reference hashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kbverify.core.errors import InputError
from kbverify.rescore.importers import detect_format, load_entries
from kbverify.rescore.references import is_known_reference, known_versions, normalized_hash
from kbverify.rescore.rescore_plan import select_entries

CUDA_L1 = Path("/work/shared/corpora/cuda-l1-h100.jsonl")

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """ReLU."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


batch_size = 16
dim = 64


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

KERNEL = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0)
'''


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


@pytest.fixture
def tasks_dir(tmp_path: Path) -> Path:
    root = tmp_path / "tasks"
    (root / "level1").mkdir(parents=True)
    (root / "level1" / "19_ReLU.py").write_text(TASK)
    (root / "level1" / "20_LeakyReLU.py").write_text(TASK.replace("torch.relu(x)", "torch.nn.functional.leaky_relu(x)"))
    return root


# --- KernelBench run folder ----------------------------------------------------------------------------------------

def make_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "level_1_problem_19_sample_0_kernel.py").write_text(KERNEL)
    (run / "level_1_problem_19_sample_1_kernel.py").write_text(KERNEL)
    (run / "level_1_problem_20_sample_0_kernel.py").write_text("None")
    (run / "level_1_problem_77_sample_0_kernel.py").write_text(KERNEL)
    (run / "generation_config.yaml").write_text("run_name: test\n")
    return run


def test_kernelbench_folder_entries(tmp_path, tasks_dir):
    run = make_run(tmp_path)
    entries = load_entries(run, tasks_dir=tasks_dir)
    assert detect_format(run) == "kernelbench"
    by_id = {e.entry_id: e for e in entries}
    assert list(by_id) == ["level1/19/s0", "level1/19/s1", "level1/20/s0", "level1/77/s0"]
    relu = by_id["level1/19/s0"]
    assert relu.task.name == "19_ReLU" and relu.task.level == 1
    assert relu.submission.source == KERNEL and relu.submission.id == "level_1_problem_19_sample_0_kernel.py"
    assert relu.unverifiable is None and relu.reference_origin == "tasks_dir"
    assert by_id["level1/20/s0"].submission is None and "None" in by_id["level1/20/s0"].unverifiable
    missing = by_id["level1/77/s0"]
    assert missing.task is None and "not found" in missing.unverifiable and missing.submission is not None


def test_kernelbench_claims_from_eval_results_and_baseline(tmp_path, tasks_dir):
    run = make_run(tmp_path)
    (run / "eval_results.json").write_text(json.dumps({
        "19": [{"sample_id": 0, "compiled": True, "correctness": True, "runtime": 0.5, "metadata": {}},
               {"sample_id": 1, "compiled": True, "correctness": False, "runtime": -1.0, "metadata": {}}],
        "20": [{"sample_id": 0, "compiled": False, "correctness": False, "runtime": -1.0}],
    }))
    (run / "baseline_time_torch.json").write_text(json.dumps(
        {"level1": {"19_ReLU.py": {"mean": 2.0}, "20_LeakyReLU.py": {"mean": 1.0}}}))
    claims = {e.entry_id: e.claimed_speedup for e in load_entries(run, tasks_dir=tasks_dir)}
    assert claims == {"level1/19/s0": pytest.approx(4.0), "level1/19/s1": None, "level1/20/s0": None,
                      "level1/77/s0": None}


def test_kernelbench_claims_jsonl_overrides(tmp_path, tasks_dir):
    run = make_run(tmp_path)
    write_jsonl(run / "claims.jsonl", [
        {"level": 1, "problem_id": 19, "sample": 1, "claimed_speedup": 1.7},
        {"level": 1, "problem_id": 77, "claimed_speedup": 9},
    ])
    claims = {e.entry_id: e.claimed_speedup for e in load_entries(run, tasks_dir=tasks_dir)}
    assert claims["level1/19/s1"] == 1.7 and claims["level1/77/s0"] == 9.0 and claims["level1/19/s0"] is None


def test_kernelbench_folder_needs_tasks_and_kernels(tmp_path, tasks_dir):
    run = make_run(tmp_path)
    with pytest.raises(InputError, match="--tasks"):
        load_entries(run)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no level_L_problem_P_sample_S_kernel.py"):
        load_entries(empty, tasks_dir=tasks_dir)


def test_kernelbench_bad_claims_line_is_named(tmp_path, tasks_dir):
    run = make_run(tmp_path)
    write_jsonl(run / "claims.jsonl", [{"level": 1, "problem_id": 19, "claimed_speedup": 2}, "{oops"])
    with pytest.raises(InputError, match=r"claims\.jsonl:2: not JSON"):
        load_entries(run, tasks_dir=tasks_dir)


# --- files a run folder could not use are reported, never skipped in silence (issue 21) -----------------------------

@pytest.mark.parametrize("eval_results, with_baseline, reason", [
    ("{not json", False, "not JSON"),
    ("{not json", True, "not JSON"),
    (json.dumps([1, 2]), False, "expected"),
    (json.dumps({"19": "fast"}), True, "expected"),
    (json.dumps({"19": [{"sample_id": 0, "runtime": 0.5}]}), True, "lacks correctness"),
    (b"\xff\xfe\x00", False, "cannot read"),
])
def test_a_malformed_eval_results_is_reported_and_its_claims_dropped(tmp_path, tasks_dir, caplog, eval_results,
                                                                     with_baseline, reason):
    from kbverify.rescore.importers import read_source

    run = make_run(tmp_path)
    path = run / "eval_results.json"
    (path.write_bytes if isinstance(eval_results, bytes) else path.write_text)(eval_results)
    if with_baseline:
        (run / "baseline_time_torch.json").write_text(json.dumps({"level1": {"19_ReLU.py": {"mean": 2.0}}}))
    with caplog.at_level("WARNING", logger="kbverify.rescore.importers"):
        imported = read_source(run, tasks_dir=tasks_dir)
    assert [(file.path, reason in file.reason) for file in imported.skipped] == [(str(path), True)]
    assert "claimed speedups are not used" in imported.skipped[0].reason
    assert len(imported.entries) == 4 and all(entry.claimed_speedup is None for entry in imported.entries)
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1 and str(path) in warnings[0] and reason in warnings[0]


def test_a_malformed_baseline_is_reported(tmp_path, tasks_dir):
    from kbverify.rescore.importers import read_source

    run = make_run(tmp_path)
    (run / "eval_results.json").write_text(json.dumps({"19": [{"sample_id": 0, "correctness": True,
                                                               "runtime": 0.5}]}))
    (run / "baseline_time_torch.json").write_text(json.dumps({"level1": [1, 2]}))
    imported = read_source(run, tasks_dir=tasks_dir)
    assert [Path(file.path).name for file in imported.skipped] == ["baseline_time_torch.json"]


def test_an_unreadable_kernel_file_is_an_unverifiable_entry_and_reported(tmp_path, tasks_dir, caplog):
    from kbverify.rescore.importers import read_source

    run = make_run(tmp_path)
    (run / "level_1_problem_19_sample_1_kernel.py").write_bytes(b"\xff\xfeclass ModelNew: pass")
    (run / "level1_problem_20_sample_0_kernel.py").write_text(KERNEL)  # a near miss of the naming scheme
    with caplog.at_level("WARNING", logger="kbverify.rescore.importers"):
        imported = read_source(run, tasks_dir=tasks_dir)
    by_id = {entry.entry_id: entry for entry in imported.entries}
    unreadable = by_id["level1/19/s1"]
    assert unreadable.submission is None and "cannot read the kernel file" in unreadable.unverifiable
    reasons = {Path(file.path).name: file.reason for file in imported.skipped}
    assert set(reasons) == {"level_1_problem_19_sample_1_kernel.py", "level1_problem_20_sample_0_kernel.py"}
    assert "not named level_L_problem_P_sample_S_kernel.py" in reasons["level1_problem_20_sample_0_kernel.py"]
    assert sum(record.levelname == "WARNING" for record in caplog.records) == 2
    assert load_entries(run, tasks_dir=tasks_dir) == imported.entries  # the list-only entry point reads the same


def test_a_sound_run_folder_reports_nothing(tmp_path, tasks_dir):
    from kbverify.rescore.importers import read_source

    run = make_run(tmp_path)
    (run / "eval_results.json").write_text(json.dumps({"19": [{"sample_id": 0, "correctness": True,
                                                               "runtime": 0.5}]}))
    imported = read_source(run, tasks_dir=tasks_dir)
    assert imported.skipped == () and imported.fmt == "kernelbench"
    assert [entry.task_ref for entry in imported.entries] == ["level1/19", "level1/19", "level1/20", "level1/77"]


# --- CUDA-L1 ---------------------------------------------------------------------------------------------------------

def cuda_l1_row(task_id: int, custom_code, score) -> dict:
    return {"level_id": 1, "task_id": task_id, "ref_code": TASK, "custom_code": custom_code, "score_default": score,
            "score_cuda_graph": None}


def test_cuda_l1_rows(tmp_path, tasks_dir):
    path = write_jsonl(tmp_path / "h100.jsonl", [
        cuda_l1_row(19, KERNEL, 3.5), cuda_l1_row(20, None, None), cuda_l1_row(21, "None", 12.0)])
    assert detect_format(path) == "cuda-l1"
    entries = load_entries(path, tasks_dir=tasks_dir)
    assert [e.entry_id for e in entries] == ["level1/19/s0", "level1/20/s0", "level1/21/s0"]
    scored, null, none_string = entries
    # Named from the tasks folder where it has the id, but scored against the row's own reference.
    assert scored.task.name == "19_ReLU" and scored.task.source == TASK and scored.reference_origin == "ref_code"
    assert scored.submission.source == KERNEL and scored.claimed_speedup == 3.5 and scored.unverifiable is None
    assert none_string.task.name == "21_level1"
    assert null.submission is None and "null" in null.unverifiable and null.claimed_speedup is None
    assert none_string.submission is None and "'None'" in none_string.unverifiable
    assert none_string.claimed_speedup == 12.0
    # Not a KernelBench reference for these ids: flagged as modified.
    assert scored.modified_reference is True


def test_cuda_l1_missing_key_names_line(tmp_path):
    row = cuda_l1_row(19, KERNEL, 1.0)
    del row["ref_code"]
    path = write_jsonl(tmp_path / "h100.jsonl", [cuda_l1_row(18, KERNEL, 1.0), row])
    with pytest.raises(InputError, match=r"h100\.jsonl:2: missing key\(s\) ref_code"):
        load_entries(path, fmt="cuda-l1")


def test_cuda_l1_duplicate_rows_refused(tmp_path):
    path = write_jsonl(tmp_path / "h100.jsonl", [cuda_l1_row(19, KERNEL, 1.0), cuda_l1_row(19, KERNEL, 2.0)])
    with pytest.raises(InputError, match=r"h100\.jsonl:2: duplicate entry id"):
        load_entries(path)


@pytest.mark.skipif(not CUDA_L1.is_file(), reason="CUDA-L1 corpus not on this machine")
def test_real_cuda_l1_corpus():
    entries = load_entries(CUDA_L1)
    rows = [json.loads(line) for line in CUDA_L1.read_text().splitlines() if line.strip()]
    null_code = sum(row["custom_code"] is None for row in rows)
    none_code = sum(row["custom_code"] == "None" for row in rows)
    assert (len(entries), null_code, none_code) == (250, 23, 17)
    assert sum(e.submission is not None for e in entries) == 250 - null_code - none_code == 210
    assert sum(e.unverifiable is not None for e in entries) == 40
    assert all(e.task is not None and e.reference_origin == "ref_code" for e in entries)
    # The rows that publish no code still carry 17 claims; the null rows carry none.
    assert sum(e.claimed_speedup is not None for e in entries if e.submission is None) == none_code
    assert max(e.claimed_speedup or 0 for e in entries) == pytest.approx(max(r["score_default"] or 0 for r in rows))
    # CUDA-L1 scored against KernelBench v0's references, unmodified.
    assert sum(e.modified_reference is False for e in entries) == 250


# --- generic JSONL ---------------------------------------------------------------------------------------------------

def test_generic_jsonl(tmp_path, tasks_dir):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "relu.py").write_text(KERNEL)
    path = write_jsonl(tmp_path / "run.jsonl", [
        {"task": "tasks/level1/19_ReLU.py", "code": KERNEL, "claimed_speedup": 2.5},
        {"task": "tasks/level1/19_ReLU.py", "path": "kernels/relu.py", "sample": 1, "id": "relu-b"},
        {"task": "tasks/level1/404_Gone.py", "code": KERNEL},
        {"task": "anything/7_Inline.py", "code": "None", "ref_code": TASK, "claimed_speedup": 8},
    ])
    assert detect_format(path) == "jsonl"
    first, second, gone, inline = load_entries(path)
    assert first.entry_id == "tasks/level1/19_ReLU/s0" and first.task.name == "19_ReLU"
    assert (first.level, first.problem_id, first.claimed_speedup) == (1, 19, 2.5)
    assert first.reference_origin == "jsonl" and first.modified_reference is None and first.unverifiable is None
    assert second.entry_id == "relu-b" and second.sample == 1 and second.submission.path.endswith("relu.py")
    assert gone.task is None and "not found" in gone.unverifiable
    assert inline.task.source == TASK and inline.task.name == "7_Inline" and inline.reference_origin == "ref_code"
    assert inline.submission is None and inline.claimed_speedup == 8.0 and inline.unverifiable


@pytest.mark.parametrize("bad_line, message", [
    ('{"task": "t.py", "code": "x"', r"run\.jsonl:2: not JSON"),
    ('{"code": "x"}', r"run\.jsonl:2: missing key\(s\) task"),
    ('{"task": "t.py"}', r"run\.jsonl:2: missing key code or path"),
    ('{"task": "t.py", "code": "x", "claimed_speedup": "fast"}', r"run\.jsonl:2: claimed_speedup must be a number"),
    ('[1, 2]', r"run\.jsonl:2: expected a JSON object"),
])
def test_generic_jsonl_malformed_lines(tmp_path, bad_line, message):
    path = write_jsonl(tmp_path / "run.jsonl", ['{"task": "t.py", "code": "x"}', "", bad_line])
    # The blank line is skipped but still counted: the bad line is line 3.
    message = message.replace(":2:", ":3:")
    with pytest.raises(InputError, match=message) as raised:
        load_entries(path, fmt="jsonl")
    assert "\n" not in str(raised.value)


def test_unknown_source_and_format(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_entries(tmp_path / "absent.jsonl")
    path = write_jsonl(tmp_path / "x.jsonl", [{"foo": 1}])
    with pytest.raises(InputError, match="cannot tell the format"):
        load_entries(path)
    with pytest.raises(InputError, match="unknown format"):
        load_entries(path, fmt="csv")


# --- known references ------------------------------------------------------------------------------------------------

def test_normalized_hash_ignores_formatting_docstrings_and_comments():
    reformatted = TASK.replace('    """ReLU."""\n', "    # a comment\n").replace("dim = 64", "dim   =   64  # wide")
    assert normalized_hash(reformatted) == normalized_hash(TASK)
    assert normalized_hash(TASK.replace("dim = 64", "dim = 32")) != normalized_hash(TASK)
    assert normalized_hash("def broken(:") is None


def test_known_reference_lookup():
    versions = known_versions(1, 19)
    assert versions, "the committed hash file has KernelBench level1/19"
    assert is_known_reference(1, 19, TASK) is False
    assert is_known_reference(99, 1, TASK) is None


def test_build_reference_hashes_from_a_local_checkout(tmp_path):
    """The build script reads tip and history versions from git alone and labels where each was seen."""
    import subprocess
    import sys

    repo = tmp_path / "kb"
    task_file = repo / "KernelBench" / "level1" / "19_ReLU.py"
    task_file.parent.mkdir(parents=True)

    def git(*args):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    git("init", "-q", "-b", "main")
    task_file.write_text(TASK.replace("dim = 64", "dim = 32"))
    git("add", ".")
    git("commit", "-q", "-m", "old")
    old = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    task_file.write_text(TASK + "\n# a comment only\n")
    git("commit", "-q", "-am", "new")
    out = tmp_path / "hashes.json"
    script = Path(__file__).resolve().parents[1] / "scripts" / "build_reference_hashes.py"
    subprocess.run([sys.executable, str(script), str(repo / ".git"), "--ref", "main", "--history", "--out", str(out)],
                   check=True, capture_output=True)
    data = json.loads(out.read_text())
    versions = data["tasks"]["level1/19"]
    assert versions[normalized_hash(TASK)] == ["main"]
    assert versions[normalized_hash(TASK.replace("dim = 64", "dim = 32"))] == [f"main@{old[:7]}"]
    assert "def forward" not in out.read_text()


def test_subset_file_selects_entries_in_source_order(tmp_path, tasks_dir):
    path = write_jsonl(tmp_path / "h100.jsonl", [
        cuda_l1_row(19, KERNEL, 3.5), cuda_l1_row(20, KERNEL, 1.0), cuda_l1_row(21, KERNEL, 2.0)])
    entries = load_entries(path, tasks_dir=tasks_dir)
    subset = tmp_path / "subset.json"
    subset.write_text(json.dumps({"kernels": [{"level_id": 1, "task_id": 21}, {"level_id": 1, "task_id": 19}]}))
    assert [e.entry_id for e in select_entries(entries, subset)] == ["level1/19/s0", "level1/21/s0"]
    subset.write_text(json.dumps({"kernels": [{"level_id": 1, "task_id": 22}]}))
    with pytest.raises(InputError, match="not in the source"):
        select_entries(entries, subset)
    subset.write_text(json.dumps([1, 2]))
    with pytest.raises(InputError, match="not a subset file"):
        select_entries(entries, subset)

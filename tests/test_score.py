import json

import pytest

from kbverify.core.errors import InputError
from kbverify.results.score import (
    ScoreRow,
    format_table_markdown,
    read_kernelbench_eval,
    read_score_jsonl,
    score_rows,
    select_samples,
    table_to_dict,
)

WORKED_SPEEDUPS = [0.6, 0.9, 1.0, 1.2, 1.5, 1.8, 2.5]


def _worked_rows(level=1):
    failed = [ScoreRow(task=f"{i}_Failed", level=level, sample=0, correct=False, speedup=None) for i in range(3)]
    passed = [ScoreRow(task=f"{10 + i}_Ok", level=level, sample=0, correct=True, speedup=s)
              for i, s in enumerate(WORKED_SPEEDUPS)]
    return failed + passed


def test_worked_example_through_score_rows():
    table = score_rows(_worked_rows(), ps=(0, 1, 2))
    assert table.n_tasks == 10
    assert table.n_correct == 7
    assert [table.at(p).fast_p for p in (0, 1, 2)] == pytest.approx([0.7, 0.4, 0.1])
    assert [table.at(p).n_fast for p in (0, 1, 2)] == [7, 4, 1]
    for entry in table.fast:
        assert 0.0 <= entry.ci_low <= entry.fast_p <= entry.ci_high <= 1.0
        assert entry.confident_fast_p is None  # no row carries a CI
    geo = table.geomean
    assert geo.n_kernels == 7
    assert geo.ci_low <= geo.speedup <= geo.ci_high
    product = 1.0
    for s in WORKED_SPEEDUPS:
        product *= s
    assert geo.speedup == pytest.approx(product ** (1 / 7))


def test_confident_fast_p_and_levels():
    rows = [
        ScoreRow("a", 1, 0, True, 1.5, speedup_ci_low=1.2),
        ScoreRow("b", 1, 0, True, 1.1, speedup_ci_low=0.97),
        ScoreRow("c", 2, 0, True, 3.0, speedup_ci_low=2.5),
        ScoreRow("d", 2, 0, False, None),
    ]
    table = score_rows(rows, ps=(1.0,))
    assert table.at(1.0).fast_p == 0.75
    assert table.at(1.0).confident_fast_p == 0.5
    levels = {sub.level: sub for sub in table.by_level}
    assert set(levels) == {1, 2}
    assert levels[1].at(1.0).fast_p == 1.0
    assert levels[2].at(1.0).fast_p == 0.5
    assert levels[2].n_tasks == 2


def test_first_and_best_sample_selection():
    rows = [
        ScoreRow("t", 1, 2, True, 3.0),
        ScoreRow("t", 1, 0, False, None),
        ScoreRow("t", 1, 1, True, 1.4),
        ScoreRow("u", 1, 1, False, None),
        ScoreRow("u", 1, 3, False, 9.0),  # incorrect: never "best" however fast
    ]
    first = {row.task: row.sample for row in select_samples(rows, "first")}
    best = {row.task: row.sample for row in select_samples(rows, "best")}
    assert first == {"t": 0, "u": 1}
    assert best == {"t": 2, "u": 1}
    assert score_rows(rows, ps=(1,), samples="first").at(1).fast_p == 0.0
    assert score_rows(rows, ps=(1,), samples="best").at(1).fast_p == 0.5


def test_selection_rejects_unknown_modes_and_duplicate_samples():
    with pytest.raises(InputError):
        select_samples([], "median")
    with pytest.raises(InputError, match="more than once"):
        select_samples([ScoreRow("t", 1, 0, True, 1.0), ScoreRow("t", 1, 0, True, 2.0)], "first")


def test_excluded_tasks_leave_the_denominator_and_are_listed():
    rows = _worked_rows(level=2)
    exclude = {"0_Failed", "level2/1_Failed", "16_Ok.py", "99_NotInThisRun"}
    table = score_rows(rows, ps=(0, 2), exclude=exclude)
    assert table.n_tasks == 7
    assert table.excluded == ("0_Failed", "16_Ok", "1_Failed")
    assert table.at(0).fast_p == pytest.approx(6 / 7)  # 2.5x was excluded with its task
    assert table.at(2).fast_p == 0.0


def test_exclusion_by_level_and_problem_id_reaches_renamed_tasks():
    """A published run names its tasks its own way (CUDA-L1: `80_level2`); the audit names KernelBench's files."""
    rows = [ScoreRow("level2/80_level2@aa", 2, 0, True, 3.0), ScoreRow("level1/80_level1@bb", 1, 0, True, 3.0),
            ScoreRow("level2/8_level2@cc", 2, 0, True, 3.0), ScoreRow("level2/800_level2@dd", 2, 0, False, None)]
    table = score_rows(rows, ps=(1,), exclude={"level2/80_Gemm_Max_Subtract_GELU", "Degenerate_80"})
    assert table.excluded == ("level2/80_level2@aa",)  # not level 1's problem 80, not 8, not 800
    assert table.n_tasks == 3


def _write_kernelbench_run(tmp_path):
    baseline = {
        "level1": {
            "1_Matmul.py": {"mean": 2.0, "std": 0.01},
            "2_ReLU.py": {"mean": 1.0, "std": 0.01},
            "3_Softmax.py": {"mean": 3.0, "std": 0.01},
            "4_Conv.py": {"mean": 4.0, "std": 0.01},
            "5_Norm.py": {"mean": 0.5, "std": 0.01},
        },
        "level2": {"1_Other.py": {"mean": 1.0}},
    }
    results = {
        # 1: correct, 2.0/1.0 = 2.0x; sample 1 is faster but KernelBench scores sample 0 only.
        "1": [{"sample_id": 0, "compiled": True, "correctness": True, "runtime": 1.0},
              {"sample_id": 1, "compiled": True, "correctness": True, "runtime": 0.1}],
        # 2: correct, 1.0/1.0 = 1.0x exactly: fast_0 yes, fast_1 no (strict).
        "2": [{"sample_id": 0, "compiled": True, "correctness": True, "runtime": 1.0}],
        # 3 is missing: incorrect, still in the denominator.
        # 4: compiled but incorrect, and faster: does not count.
        "4": [{"sample_id": 0, "compiled": True, "correctness": False, "runtime": 1.0}],
        # 5: correct, 0.5/0.4 = 1.25x.
        "5": [{"sample_id": 0, "compiled": True, "correctness": True, "runtime": 0.4}],
        # 7 is not in the baseline: not scored.
        "7": [{"sample_id": 0, "compiled": True, "correctness": True, "runtime": 0.1}],
    }
    eval_path, baseline_path = tmp_path / "eval_results.json", tmp_path / "baseline.json"
    eval_path.write_text(json.dumps(results))
    baseline_path.write_text(json.dumps(baseline))
    return eval_path, baseline_path


def test_kernelbench_eval_reproduces_fast_p_by_hand(tmp_path):
    eval_path, baseline_path = _write_kernelbench_run(tmp_path)
    rows = read_kernelbench_eval(eval_path, baseline_path, level=1, task_names=None)
    by_task = {row.task: row for row in rows}
    assert sorted(by_task) == ["1_Matmul", "2_ReLU", "3_Softmax", "4_Conv", "5_Norm"]
    assert by_task["1_Matmul"].speedup == pytest.approx(2.0)
    assert by_task["5_Norm"].speedup == pytest.approx(1.25)
    assert not by_task["3_Softmax"].correct and by_task["3_Softmax"].speedup is None
    assert all(row.sample == 0 and row.level == 1 for row in rows)
    table = score_rows(rows, ps=(0, 0.5, 1, 1.5, 2))
    # n = 5 problems in the baseline's level1. Correct speedups: 2.0, 1.0, 1.25.
    assert [entry.fast_p for entry in table.fast] == pytest.approx([0.6, 0.6, 0.4, 0.2, 0.0])


def test_kernelbench_eval_with_task_names_and_untimed_samples(tmp_path):
    eval_path, baseline_path = _write_kernelbench_run(tmp_path)
    results = json.loads(eval_path.read_text())
    results["2"][0]["runtime"] = -1.0  # correct but never timed
    eval_path.write_text(json.dumps(results))
    names = {1: "1_Matmul", 2: "2_ReLU.py", 9: "9_NotTimed"}
    rows = read_kernelbench_eval(eval_path, baseline_path, level=1, task_names=names)
    assert [row.task for row in rows] == ["1_Matmul", "2_ReLU"]  # 9 has no baseline: skipped
    untimed = rows[1]
    assert untimed.correct and untimed.speedup is None
    assert score_rows(rows, ps=(0,)).at(0).fast_p == 0.5


def test_kernelbench_eval_bad_inputs(tmp_path):
    eval_path, baseline_path = _write_kernelbench_run(tmp_path)
    with pytest.raises(InputError, match="level3"):
        read_kernelbench_eval(eval_path, baseline_path, level=3)
    with pytest.raises(InputError, match="cannot read"):
        read_kernelbench_eval(tmp_path / "missing.json", baseline_path, level=1)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_kernelbench_eval(tmp_path / "broken.json", baseline_path, level=1)


def test_real_baseline_json_parses(tmp_path):
    from pathlib import Path

    baseline = Path("/work/shared/corpora/kernelbench-H100_Modal-baseline_time_torch.json")
    if not baseline.exists():
        pytest.skip("published baseline not available")
    (tmp_path / "eval_results.json").write_text("{}")
    rows = read_kernelbench_eval(tmp_path / "eval_results.json", baseline, level=1)
    n_level1 = len(json.loads(baseline.read_text())["level1"])
    assert len(rows) == n_level1
    assert score_rows(rows, ps=(0,)).at(0).fast_p == 0.0


def test_read_score_jsonl(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_text("\n".join([
        json.dumps({"task": "level1/19_ReLU.py", "correct": True, "speedup": 1.5, "speedup_ci_low": 1.2}),
        "",
        json.dumps({"task": "level1/19_ReLU.py", "correct": True, "speedup": 2.5, "sample": 1}),
        json.dumps({"task": "20_LeakyReLU", "level": 1, "correct": False, "speedup": None,
                    "claimed_speedup": 3.0}),
    ]) + "\n")
    rows = read_score_jsonl(path)
    assert len(rows) == 3
    assert rows[0] == ScoreRow("level1/19_ReLU.py", 1, 0, True, 1.5, speedup_ci_low=1.2)
    assert rows[1].sample == 1
    assert rows[2].claimed_speedup == 3.0 and rows[2].level == 1
    assert score_rows(rows, ps=(2,), samples="best").at(2).fast_p == 0.5
    assert score_rows(rows, ps=(2,), samples="first").at(2).fast_p == 0.0


@pytest.mark.parametrize("line, message", [
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"correct": true, "speedup": 1.0}', "'task'"),
    ('{"task": "a", "correct": "yes", "speedup": 1.0}', "'correct'"),
    ('{"task": "a", "correct": true}', "'speedup' is missing"),
    ('{"task": "a", "correct": true, "speedup": -1.0}', "'speedup'"),
    ('{"task": "a", "correct": true, "speedup": "fast"}', "'speedup'"),
    ('{"task": "a", "correct": true, "speedup": 1.0, "sample": 1.5}', "'sample'"),
])
def test_malformed_jsonl_names_the_line(tmp_path, line, message):
    path = tmp_path / "scores.jsonl"
    path.write_text(json.dumps({"task": "ok", "correct": True, "speedup": 1.0}) + "\n" + line + "\n")
    with pytest.raises(InputError) as raised:
        read_score_jsonl(path)
    assert f"{path}:2:" in str(raised.value)
    assert message in str(raised.value)
    assert raised.value.exit_code == 2


def test_empty_or_missing_jsonl(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(InputError, match="no scored lines"):
        read_score_jsonl(tmp_path / "empty.jsonl")
    with pytest.raises(InputError, match="cannot read"):
        read_score_jsonl(tmp_path / "absent.jsonl")


def test_table_renders_to_dict_and_markdown():
    rows = _worked_rows() + [ScoreRow("1_Other", 2, 0, True, 1.1)]
    table = score_rows(rows, ps=(0, 1), exclude={"0_Failed"})
    data = json.loads(json.dumps(table_to_dict(table)))
    assert data["n_tasks"] == 10
    assert data["rows"][1]["p"] == 1.0
    assert data["rows"][1]["fast_p"] == pytest.approx(0.5)
    assert data["rows"][1]["fast_p_ci"] == [table.at(1).ci_low, table.at(1).ci_high]
    assert data["geomean_speedup"] == pytest.approx(table.geomean.speedup)
    assert data["excluded"] == ["0_Failed"]
    assert [level["level"] for level in data["by_level"]] == [1, 2]
    assert data["by_level"][1]["n_tasks"] == 1
    text = format_table_markdown(table)
    assert "| 1 | 50.0% |" in text  # fast_1 = 5/10
    assert "Excluded as degenerate (1): 0_Failed" in text
    assert "| 2 | 1 | 1 |" in text  # level 2 row
    assert text.endswith("\n")


def test_empty_table_is_well_defined():
    table = score_rows([], ps=(1,))
    assert table.n_tasks == 0
    assert table.at(1).fast_p == 0.0
    assert table.geomean is None
    assert "n/a" in format_table_markdown(table)

"""Leaderboards (`--group-by FIELD`): labels from the generic JSONL through the store to per-group tables in text,
JSON, Markdown and HTML; an unknown field is one line and exit 2 before any work."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kbverify.cli import jobs
from kbverify.core.errors import InputError
from kbverify.core.status import Status
from kbverify.report.leaderboard import NO_VALUE, board_from_verdicts, render_html, render_markdown, render_text
from kbverify.report.summary import P_VALUES
from kbverify.rescore.importers import load_entries
from kbverify.results.store import Store, StoreConflict
from tests.test_report import verdict

REPO = Path(__file__).resolve().parent.parent
TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(8, 64)]


def get_init_inputs():
    return []
'''
KERNEL = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return {body}
'''


def labelled(model: str | None, *args, **kwargs):
    made = verdict(*args, **kwargs)
    labels = {} if model is None else {"model": model}
    return dataclasses.replace(made, labels=labels, submission=f"{model}/{made.submission}")


def two_models() -> list:
    """Model a: two of two pass both protocols; model b: one is caught under verified, one fails both."""
    return [
        labelled("a", "1_A", "original", Status.PASSED, speedup=2.0, ci=(1.9, 2.1)),
        labelled("a", "1_A", "verified", Status.PASSED, speedup=1.8, ci=(1.7, 1.9)),
        labelled("a", "2_B", "original", Status.PASSED, speedup=0.5),
        labelled("a", "2_B", "verified", Status.PASSED, speedup=0.5, ci=(0.4, 0.6)),
        labelled("b", "1_A", "original", Status.PASSED, speedup=8.0),
        labelled("b", "1_A", "verified", Status.EXPLOIT_STALE_OUTPUT),
        labelled("b", "2_B", "original", Status.INCORRECT),
        labelled("b", "2_B", "verified", Status.INCORRECT),
        labelled(None, "3_C", "original", Status.PASSED, speedup=1.5),
    ]


def fast(board: dict, group: str, protocol: str, p: float) -> float:
    table = next(g for g in board["groups"] if g["group"] == group)["tables"][protocol]
    return next(row["fast_p"] for row in table["rows"] if row["p"] == p)


def test_each_group_gets_its_own_fast_p_geomean_and_status_changes():
    board = board_from_verdicts(two_models(), "model", P_VALUES, samples="first")
    assert [g["group"] for g in board["groups"]] == ["a", "b", NO_VALUE]
    assert fast(board, "a", "original", 1.0) == pytest.approx(0.5) and fast(board, "a", "verified", 0.0) == 1.0
    assert fast(board, "b", "original", 1.0) == pytest.approx(0.5) and fast(board, "b", "verified", 0.0) == 0.0
    groups = {g["group"]: g for g in board["groups"]}
    assert groups["a"]["tables"]["original"]["geomean_speedup"] == pytest.approx(1.0)  # sqrt(2.0 * 0.5)
    assert groups["b"]["tables"]["verified"]["geomean_speedup"] is None
    assert groups["a"]["status_changes"] == {}
    assert groups["b"]["status_changes"] == {"original → verified: passed → exploit:stale_output": 1}
    assert groups[NO_VALUE]["tables"]["verified"] is None  # that entry ran under original only

    text = render_text(board)
    assert "verified by model" in text and "passed → exploit:stale_output" in text
    line_b = next(line for line in text.splitlines() if line.split()[:1] == ["b"])
    assert "50.0%" in line_b and "8.000x" in line_b
    markdown = render_markdown(board)
    assert "## Leaderboard by model" in markdown and "| b | 2 | 1 |" in markdown
    assert "<h2>Leaderboard by model</h2>" in render_html(board) and "<td>a</td>" in render_html(board)


def test_an_unknown_field_is_refused_naming_the_fields_there():
    with pytest.raises(InputError, match=r"--group-by modle: .*its fields: model"):
        board_from_verdicts(two_models(), "modle", P_VALUES)


def test_labels_tell_two_models_apart_in_the_store_and_in_the_report(tmp_path):
    store_path = tmp_path / "store.sqlite"
    with Store(store_path) as store:
        store.begin_run("r1", {}, {"planned_units": {}})
        for index, made in enumerate(two_models()):
            assert store.put(f"unit{index}", "r1", made)
        # a planned unit of model a for a task it holds is a conflict; the same for a model c is not
        planned = {"task": "level1/1_A", "sample": 0, "protocol": "original"}
        with pytest.raises(StoreConflict):
            store.refuse_conflicts({"new": {**planned, "name": "x", "level": 1, "labels": {"model": "a"}}})
        store.refuse_conflicts({"new": {**planned, "name": "x", "level": 1, "labels": {"model": "c"}}})

    result = jobs.run_report(store_path, tmp_path / "report", group_by="model")
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [g["group"] for g in report["leaderboard"]["groups"]] == ["a", "b", NO_VALUE]
    assert "## Leaderboard by model" in (tmp_path / "report" / "report.md").read_text()
    assert "Leaderboard by model" in (tmp_path / "report" / "report.html").read_text()
    assert result["complete"]
    scored = jobs.run_score(store_path, baseline=None, level=None, ps=P_VALUES, exclude_path=None, samples=None,
                            group_by="model")
    assert scored["json"]["leaderboard"]["groups"][1]["status_changes"] == report["leaderboard"]["groups"][1][
        "status_changes"]
    with pytest.raises(InputError, match="no entry of"):
        jobs.run_report(store_path, tmp_path / "report2", group_by="temperature")
    assert not (tmp_path / "report2" / "report.json").exists()


def kbverify(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kbverify", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_score_jsonl_groups_by_a_field_and_refuses_an_unknown_one_with_exit_2(tmp_path):
    rows = [{"task": "level1/1_A.py", "correct": True, "speedup": 1.5, "model": "a"},
            {"task": "level1/1_A.py", "correct": False, "speedup": None, "model": "b"},
            {"task": "level1/2_B.py", "correct": True, "speedup": 3.0, "model": "b"}]
    source = tmp_path / "scores.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = kbverify("score", source, "--group-by", "model", "--json")
    assert done.returncode == 0, done.stderr
    board = json.loads(done.stdout)["leaderboard"]
    assert fast(board, "a", "scores", 1.0) == 1.0 and fast(board, "b", "scores", 2.0) == pytest.approx(0.5)
    for field, message in (("modle", "no entry of"), ("task", "format's own keys"), ("1bad", "name of a field")):
        refused = kbverify("score", source, "--group-by", field)
        assert refused.returncode == 2 and refused.stdout == ""
        assert len(refused.stderr.strip().splitlines()) == 1 and message in refused.stderr, refused.stderr


def write_two_model_run(root: Path) -> Path:
    (root / "level1").mkdir(parents=True)
    (root / "level1" / "1_ReLU.py").write_text(TASK)
    rows = [{"task": "level1/1_ReLU.py", "code": KERNEL.format(body="x.clamp_min(0)"), "model": "honest"},
            {"task": "level1/1_ReLU.py", "code": KERNEL.format(body="x.clone()"), "model": "cheat"}]
    source = root / "run.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return source


def test_two_models_kernels_for_one_task_rescore_side_by_side(tmp_path):
    source = write_two_model_run(tmp_path / "run")
    entries = load_entries(source)
    assert [(e.entry_id, e.labels) for e in entries] == [("model=honest/level1/1_ReLU/s0", (("model", "honest"),)),
                                                         ("model=cheat/level1/1_ReLU/s0", (("model", "cheat"),))]
    with pytest.raises(InputError, match="no entry of"):
        jobs.run_rescore(source, fmt="auto", tasks=None, store_path=tmp_path / "refused.sqlite",
                         protocols="original", samples="first", report_dir=None, device="cpu", hidden_dirs=[],
                         timeout_s=60.0, group_by="temperature")
    assert not (tmp_path / "refused.sqlite").exists()
    result = jobs.run_rescore(source, fmt="auto", tasks=None, store_path=tmp_path / "store.sqlite",
                              protocols="original", samples="first", report_dir=tmp_path / "report",
                              device="cpu", hidden_dirs=[], timeout_s=60.0, group_by="model")
    assert result["complete"] and result["evaluated"] == 2
    board = result["leaderboard"]
    assert [g["group"] for g in board["groups"]] == ["cheat", "honest"]
    # rand inputs are never negative: KernelBench's check passes the identity too; both are correct
    assert all(g["tables"]["original"]["n_correct"] == 1 for g in board["groups"])
    assert "original by model" in result["text"]
    with Store(tmp_path / "store.sqlite") as store:
        assert sorted(v.labels["model"] for _, v in store.verdicts()) == ["cheat", "honest"]

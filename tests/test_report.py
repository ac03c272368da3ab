"""Reports: JSON, Markdown and self-contained HTML from synthetic verdicts."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from kbverify.jobs import tables_by_protocol
from kbverify.plots import _step_points
from kbverify.records import BuildRecord, SetResult, Verdict
from kbverify.report import P_VALUES, fast_p_table, render_markdown_summary, status_changes, summarize, write_reports
from kbverify.status import Status


def verdict(task: str, protocol: str, status: Status, *, speedup=None, ci=None, claimed=None, level=1,
            sets=(), build=None, warnings=(), timing=None, sample=0, message="") -> Verdict:
    return Verdict(
        task=f"level{level}/{task}@abc", task_name=task, level=level, problem_id=int(task.split("_")[0]),
        submission=f"{task}.py", submission_sha256="0" * 64, protocol=protocol, protocol_sha256="1" * 64,
        status=status, warnings=tuple(warnings), message=message, speedup=speedup, speedup_ci=ci,
        claimed_speedup=claimed, sets=tuple(sets), build=build, timing=timing or {}, sample=sample,
        provenance={"gpu": "NVIDIA H200", "torch": "2.11.0"},
    )


def stale_set() -> SetResult:
    return SetResult(set_id="original/x1/default/1", shape="original", distribution="x1", weights="default",
                     seed=7, valid=True, status=Status.EXPLOIT_STALE_OUTPUT,
                     detail="output unchanged after the inputs changed")


def small_run() -> list[Verdict]:
    """Four tasks under original and verified; speedups picked so fast_p is easy to count by hand."""
    native = BuildRecord(native_sources=True, extension_built=False, extension_called=None, error_class="api_drift",
                         error="load_inline failed")
    return [
        verdict("1_A", "original", Status.PASSED, speedup=3.0, ci=(2.8, 3.2), claimed=3.1),
        verdict("2_B", "original", Status.PASSED, speedup=1.2, ci=(0.9, 1.4), claimed=1.3),
        verdict("3_C", "original", Status.PASSED, speedup=0.8, ci=(0.7, 0.9), claimed=5.0, build=native,
                warnings=("pytorch_only",), level=2),
        verdict("4_D", "original", Status.INCORRECT, speedup=None, claimed=None, level=2),
        verdict("1_A", "verified", Status.EXPLOIT_STALE_OUTPUT, speedup=None, claimed=3.1, sets=(stale_set(),)),
        verdict("2_B", "verified", Status.PASSED, speedup=1.1, ci=(1.05, 1.15), claimed=1.3,
                timing={"peak_memory_bytes": 3 * 2**30, "ref_peak_memory_bytes": 2**30}),
        verdict("3_C", "verified", Status.PASSED, speedup=0.9, ci=(0.85, 0.95), claimed=5.0, build=native,
                warnings=("pytorch_only",), level=2),
        verdict("4_D", "verified", Status.INCORRECT, claimed=None, level=2),
    ]


def test_fast_p_counts_failures_in_the_denominator():
    rows = {r["p"]: r for r in fast_p_table([v for v in small_run() if v.protocol == "original"])}
    assert rows[0.0]["fast_p"] == 0.75 and rows[1.0]["fast_p"] == 0.5 and rows[2.0]["fast_p"] == 0.25
    assert rows[1.0]["confident_fast_p"] == 0.25  # 2_B's lower bound 0.9 is not above 1
    assert rows[1.5]["claimed_fast_p"] == 0.5 and rows[0.0]["claimed_fast_p"] == 0.75
    low, high = rows[1.0]["fast_p_ci"]
    assert 0.0 <= low <= 0.5 <= high <= 1.0


def test_markdown_has_fast_p_rows_and_status_changes(tmp_path):
    paths = write_reports(small_run(), tmp_path, title="small run", provenance={"command": "kbverify rescore"})
    assert set(paths) == {"json", "md", "html"} and all(p.is_file() for p in paths.values())
    markdown = paths["md"].read_text()
    lines = markdown.splitlines()
    # columns: p | claimed | original fast_p [CI] | original confident | verified fast_p [CI] | verified confident
    row_1 = next(line for line in lines if line.startswith("| 1 |"))
    cells = [c.strip() for c in row_1.strip("|").split("|")]
    assert cells[1] == "75.0%" and cells[2].startswith("50.0% [") and cells[3] == "25.0%"
    assert cells[4].startswith("25.0% [") and cells[5] == "25.0%"
    row_0 = next(line for line in lines if line.startswith("| 0 |"))
    assert [c.strip() for c in row_0.strip("|").split("|")][4].startswith("50.0%")
    assert "passed → exploit:stale_output" in markdown
    assert "original/x1/default/1" in markdown and "output unchanged after the inputs changed" in markdown
    assert "native sources, extension not built (api_drift)" in markdown and "PyTorch only" in markdown
    assert "3.0 GiB" in markdown and "3.00×" in markdown


def test_json_report_is_complete(tmp_path):
    run = small_run()
    report = json.loads(write_reports(run, tmp_path)["json"].read_text())
    assert report["protocols"] == ["original", "verified"]
    assert len(report["verdicts"]) == len(run)
    assert Verdict.from_dict(report["verdicts"][4]) == run[4]
    verified = report["by_protocol"]["verified"]
    assert verified["status_counts"] == {"passed": 2, "exploit:stale_output": 1, "incorrect": 1}
    assert verified["per_level"]["level2"]["passed"] == 1 and verified["per_level"]["level1"]["n_tasks"] == 2
    assert [c["change"] for c in report["status_changes"]] == ["passed → exploit:stale_output"]
    assert report["status_changes"][0]["evidence"]["set_id"] == "original/x1/default/1"
    assert report["memory"][0]["ratio"] == 3.0
    assert report["provenance"]["verdicts"]["gpu"] == ["NVIDIA H200"]


def test_status_changes_in_both_directions():
    run = [verdict("1_A", "original", Status.INCORRECT, message="max diff 0.5"),
           verdict("1_A", "verified", Status.PASSED, speedup=1.0),
           verdict("2_B", "original", Status.PASSED), verdict("2_B", "verified", Status.PASSED)]
    (change,) = status_changes(run)
    assert change["change"] == "incorrect → passed" and change["evidence"]["detail"] == "max diff 0.5"


def test_best_sample_rule_for_kbv():
    run = [verdict("1_A", "kbv", Status.INCORRECT, sample=0),
           verdict("1_A", "kbv", Status.PASSED, speedup=2.5, sample=1),
           verdict("1_A", "original", Status.INCORRECT, sample=0),
           verdict("1_A", "original", Status.PASSED, speedup=2.5, sample=1)]
    summary = render_markdown_summary(run)
    kbv = next(line for line in summary.splitlines() if line.startswith("| kbv"))
    original = next(line for line in summary.splitlines() if line.startswith("| original"))
    assert "| 1 | 1 | 100.0%" in kbv and "| 1 | 0 | 0.0%" in original


def test_report_and_score_agree_sample_rules_included():
    """The report's fast_p is `kbverify score`'s, per protocol; kbv keeps its best sample unless told otherwise."""
    run = realistic_run() + [
        verdict("1_A", "kbv", Status.INCORRECT, sample=0),
        verdict("1_A", "kbv", Status.PASSED, speedup=2.5, ci=(2.4, 2.6), sample=1),
        verdict("2_B", "kbv", Status.PASSED, speedup=0.7, ci=(0.6, 0.8), sample=0),
    ]
    for samples in (None, "first", "best"):
        summary = summarize(run, samples=samples)
        tables = tables_by_protocol(run, P_VALUES, samples)
        assert summary["protocols"] == list(tables) == ["original", "verified", "kbv"]
        for name, table in tables.items():
            mine = summary["by_protocol"][name]
            assert [r["fast_p"] for r in mine["fast_p"]] == [r["fast_p"] for r in table["rows"]]
            assert [r["fast_p_ci"] for r in mine["fast_p"]] == [r["fast_p_ci"] for r in table["rows"]]
            assert [r["confident_fast_p"] for r in mine["fast_p"]] == [r["confident_fast_p"] for r in table["rows"]]
            assert mine["n_tasks"] == table["n_tasks"] and mine["passed"] == table["n_correct"]
            assert mine["geomean_speedup_passed"] == table["geomean_speedup"]
    kbv = {r["p"]: r["fast_p"] for r in summarize(run)["by_protocol"]["kbv"]["fast_p"]}
    assert kbv[2.0] == 0.5 and kbv[0.5] == 1.0
    first = {r["p"]: r["fast_p"] for r in summarize(run, samples="first")["by_protocol"]["kbv"]["fast_p"]}
    assert first[2.0] == 0.0 and first[0.5] == 0.5


def test_confident_fast_p_is_absent_without_speedup_intervals(tmp_path):
    run = [verdict("1_A", "original", Status.PASSED, speedup=3.0), verdict("2_B", "original", Status.INCORRECT)]
    rows = fast_p_table(run)
    assert [r["fast_p"] for r in rows] == [0.5] * 5
    assert all(r["confident_fast_p"] is None for r in rows)
    markdown = write_reports(run, tmp_path)["md"].read_text()
    assert "| 1 | 50.0% [" in markdown and markdown.count("| –") >= 5


def test_fast_p_curve_steps_down_just_after_each_speedup():
    # Four tasks, two correct at 0.5× and 1.5×: fast_p is 2/4 up to 0.5, 1/4 up to 1.5, then 0.
    assert _step_points([0.5, 1.5], 4, 3.0) == [(0.0, 0.5), (0.5, 0.5), (0.5, 0.25), (1.5, 0.25), (1.5, 0.0),
                                                (3.0, 0.0)]
    assert _step_points([], 0, 3.0) == [(0.0, 0.0), (3.0, 0.0)]


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.links += [value or "" for name, value in attrs if name in ("src", "href")]
        if tag == "link":
            self.links.append("<link>")


def test_html_is_self_contained(tmp_path):
    page = write_reports(realistic_run(), tmp_path)["html"].read_text()
    parser = _Collector()
    parser.feed(page)
    parser.close()
    assert {"html", "style", "table", "svg", "polyline", "circle"} <= set(parser.tags)
    assert "script" not in parser.tags
    assert not [link for link in parser.links if link.startswith(("http:", "https:", "//")) or link == "<link>"]
    assert "http://" not in page and "https://" not in page
    assert page.count("<svg") == 2


def test_markdown_summary_is_short():
    summary = render_markdown_summary(realistic_run())
    assert summary.count("\n") < 12 and "fast_1" in summary and "| claimed |" in summary


def realistic_run(seed: int = 0) -> list[Verdict]:
    """A CUDA-L1-like run: 60 tasks on 3 levels, long-tailed claims; verified catches some exploits."""
    rng = random.Random(seed)
    verdicts = []
    for index in range(60):
        level = 1 + index % 3
        task = f"{index + 1}_Task{index + 1}"
        claimed = None if rng.random() < 0.1 else round(rng.lognormvariate(0.4, 0.9), 3)
        if claimed is not None and rng.random() < 0.15:
            # Published kernels with no code: unverifiable under every protocol.
            for protocol in ("original", "verified"):
                verdicts.append(verdict(task, protocol, Status.UNVERIFIABLE, claimed=claimed, level=level,
                                        message="no code released (custom_code is 'None')"))
            continue
        measured = claimed * rng.uniform(0.7, 1.1) if claimed else rng.uniform(0.5, 2)
        original = Status.PASSED if rng.random() < 0.85 else Status.INCORRECT
        memory = {"peak_memory_bytes": int(rng.uniform(1, 6) * 2**28), "ref_peak_memory_bytes": 2**28}
        verdicts.append(verdict(task, "original", original, speedup=measured if original.passed else None,
                                ci=(measured * 0.97, measured * 1.03) if original.passed else None,
                                claimed=claimed, level=level, timing=memory))
        roll = rng.random()
        if original.passed and roll < 0.12:
            verdicts.append(verdict(task, "verified", Status.EXPLOIT_STALE_OUTPUT, claimed=claimed, level=level,
                                    sets=(stale_set(),)))
        elif original.passed and roll < 0.2:
            build = BuildRecord(native_sources=True, extension_built=False, extension_called=None,
                                error_class="api_drift", error="error: identifier 'c10::cuda' is undefined")
            verdicts.append(verdict(task, "verified", Status.PASSED, speedup=1.0, ci=(0.98, 1.02), claimed=claimed,
                                    level=level, build=build, warnings=("pytorch_only", "extension_not_built")))
        else:
            status = original if roll < 0.9 else Status.INCORRECT
            speed = measured * rng.uniform(0.6, 1.0)
            verdicts.append(verdict(task, "verified", status, speedup=speed if status.passed else None,
                                    ci=(speed * 0.95, speed * 1.05) if status.passed else None, claimed=claimed,
                                    level=level, timing=memory))
    return verdicts


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not on PATH")
def test_html_renders_in_headless_chromium(tmp_path):
    page = write_reports(realistic_run(), tmp_path / "report", title="CUDA-L1-like re-score",
                         provenance={"command": "kbverify rescore run.jsonl", "gpu": "NVIDIA H200"})["html"]
    screenshot = tmp_path / "report.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={screenshot}", "--window-size=1200,2000",
         page.resolve().as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    data = screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000

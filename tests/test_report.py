"""Reports: JSON, Markdown and self-contained HTML from synthetic verdicts."""

from __future__ import annotations

import dataclasses
import html
import json
import random
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from kbverify.cli.jobs import tables_by_protocol
from kbverify.core.present import shorten
from kbverify.core.records import BuildRecord, SetResult, Verdict
from kbverify.core.status import Status
from kbverify.report.plots import _step_points
from kbverify.report.summary import P_VALUES, fast_p_table, summarize
from kbverify.report.write import render_markdown_summary, write_reports
from kbverify.results.counting import status_changes


def verdict(task: str, protocol: str, status: Status, *, speedup=None, ci=None, claimed=None, level=1,
            sets=(), build=None, warnings=(), timing=None, sample=0, message="") -> Verdict:
    return Verdict(
        task=f"level{level}/{task}@abc", task_name=task, level=level, problem_id=int(task.split("_")[0]),
        submission=f"{task}.py", submission_sha256="0" * 64, protocol=protocol, protocol_sha256="1" * 64,
        status=status, warnings=tuple(warnings), message=message, speedup=speedup, speedup_ci=ci,
        claimed_speedup=claimed, sets=tuple(sets), build=build, timing=timing or {}, sample=sample,
        provenance={"gpu": "NVIDIA H200", "torch": "2.11.0"}, isolation="isolated",
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


def test_a_submission_named_like_markup_is_shown_as_text(tmp_path):
    """The page renders through jinja2 with autoescape: names and messages come from the published run."""
    name = "<script>alert(1)</script>.py"
    run = [dataclasses.replace(v, submission=name) for v in small_run()]
    run.append(dataclasses.replace(verdict("9_I", "verified", Status.UNVERIFIABLE, claimed=2.0,
                                           message='<img src=x onerror="alert(2)">'), submission=name))
    page = write_reports(run, tmp_path)["html"].read_text()
    parser = _Collector()
    parser.feed(page)
    assert "script" not in parser.tags and "img" not in parser.tags
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.py" in page
    assert "&lt;img src=x onerror=" in page


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


# --- the every-verdict table, the short provenance block, evidence ------------------------------------------------

LONG_DETAIL = ("norm-wise error 0.00734 (limit 0.001); element-wise worst ×9.15 of 0.001 + 0.001·|r| (ref "
               "1.7678463459014893, cand 1.7931790351867676 at [8, 15, 5, 3]); allowance base (fp32 reference vs "
               "float64) 1.1e-07, the tail of 0.13% of elements over the limit")


def run_with_provenance() -> tuple[list[Verdict], dict]:
    """small_run plus a failure with long evidence, verdicts carrying real-looking provenance, and the store's
    run records (arguments with every planned unit)."""
    machine = {"gpu_model": "NVIDIA H200", "gpu_uuid": "GPU-2a79f0aa-0000", "driver": "580.159.04",
               "torch": "2.11.0+cu130", "cuda": "13.0", "python": "3.11.7", "kbverify": "0.1.0",
               "kbverify_commit": "fe797f77ca22eba1f8596e049350ec7fcd61ea21",
               "kbverify_source_sha256": "b47457c2d87a7b59e8dc1d4dcc74e50a8798f77b341fa5a8526e822fe1ce1725"}
    shifted = SetResult(set_id="original/shifted/default/s0", shape="original", distribution="shifted",
                        weights="default", seed=3, valid=True, status=Status.INCORRECT, detail=LONG_DETAIL)
    run = small_run() + [verdict("5_LayerNorm", "verified", Status.INCORRECT, sets=(shifted,), message=LONG_DETAIL)]
    run = [dataclasses.replace(v, provenance=machine) for v in run]
    runs = [{"run_id": "8b303e504245", "started": 1764623940.0, "compat_key": "k", "provenance": machine,
             "arguments": {"source": "examples/published_run", "protocols": ["original", "verified"],
                           "planned_units": {f"{i:064x}": {"name": f"unit {i}"} for i in range(9)}}}]
    return run, {"runs": runs}


def _rows_of(table_html: str) -> list[list[str]]:
    class Rows(HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows: list[list[str]] = []
            self.cell: list[str] | None = None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.cell = []

        def handle_endtag(self, tag):
            if tag in ("td", "th") and self.cell is not None:
                self.rows[-1].append("".join(self.cell).strip())
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell.append(data)

    parser = Rows()
    parser.feed(table_html)
    return parser.rows


def test_every_verdict_has_a_row_in_the_markdown_and_the_html(tmp_path):
    run, provenance = run_with_provenance()
    paths = write_reports(run, tmp_path, provenance=provenance)
    markdown = paths["md"].read_text()
    section = markdown.split("## Every verdict", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith(("| level1 ", "| level2 "))]
    assert len(rows) == len(run)
    by_key = {(row[1], row[3]): row for row in rows}
    # a passing kernel is in the table with its speedup, interval and warnings (before: only in the provenance dump)
    assert by_key[("3_C", "verified")][4:6] == ["passed", "0.900× [0.850, 0.950]"]
    assert by_key[("3_C", "verified")][7] == "pytorch_only"
    assert by_key[("1_A", "verified")][4] == "exploit:stale_output"
    assert "output unchanged after the inputs changed" in by_key[("1_A", "verified")][8]
    assert by_key[("4_D", "original")][5] == "–"

    page = paths["html"].read_text()
    table = page.split('<table id="verdict-table">', 1)[1].split("</table>", 1)[0]
    html_rows = _rows_of("<table>" + table + "</table>")
    assert html_rows[0] == ["level", "task", "submission", "protocol", "status", "speedup [95% CI]", "claimed",
                            "warnings", "evidence"]
    assert len(html_rows) - 1 == len(run)
    assert sorted((row[1], row[3], row[4]) for row in html_rows[1:]) == sorted(
        (v.task_name, v.protocol, v.status.value) for v in run)


def test_evidence_is_cut_at_a_word_and_whole_one_click_away(tmp_path):
    run, provenance = run_with_provenance()
    paths = write_reports(run, tmp_path, provenance=provenance)
    markdown, page = paths["md"].read_text(), paths["html"].read_text()
    line = next(line for line in markdown.splitlines() if line.startswith("| level1 | 5_LayerNorm"))
    shown = line.rstrip(" |").rsplit(" | ", 1)[1]
    assert shown.endswith("…") and len(shown) <= 160
    kept = shown[:-1]
    whole = "set original/shifted/default/s0: " + LONG_DETAIL
    assert whole.replace("|", "\\|").startswith(kept) and whole[len(kept.replace("\\|", "|"))] == " "
    assert f"<details><summary>{html.escape(shorten(whole, 160))}</summary><p>{html.escape(whole)}</p></details>" \
        in page
    rows = json.loads(paths["json"].read_text())["verdict_table"]
    assert next(row for row in rows if row["task_name"] == "5_LayerNorm")["evidence"]["detail"] == LONG_DETAIL


def test_provenance_is_a_short_block_and_the_full_record_stays_in_the_json(tmp_path):
    run, provenance = run_with_provenance()
    paths = write_reports(run, tmp_path, provenance=provenance)
    markdown, page = paths["md"].read_text(), paths["html"].read_text()
    block = markdown.split("## Provenance", 1)[1]
    assert block.count("\n- **") == 5  # machine, software, run, protocols, isolation
    assert "- **isolation**: isolated" in block
    assert "- **machine**: NVIDIA H200, driver 580.159.04" in block
    assert "kbverify 0.1.0 (commit fe797f77ca, sources b47457c2d8), torch 2.11.0+cu130, CUDA 13.0" in block
    assert "8b303e504245 · 2025-12-01 21:19 UTC · source examples/published_run" in block
    assert "protocols original, verified · 9 units planned" in block
    for text in (markdown, page):
        assert "planned_units" not in text and "b47457c2d87a7b59e8dc1d4dcc74e50a8798f77b341fa5a8526e822fe1ce1725" \
            not in text and "<pre>" not in text and "```json" not in text
        assert "report.json" in text.split("Provenance", 1)[1]
    assert '<dl class="provenance"><dt>machine</dt><dd>NVIDIA H200, driver 580.159.04</dd>' in page
    full = json.loads(paths["json"].read_text())["provenance"]
    assert len(full["run"]["runs"][0]["arguments"]["planned_units"]) == 9
    assert full["verdicts"]["kbverify_source_sha256"] == [run[0].provenance["kbverify_source_sha256"]]


def test_degraded_isolation_is_said_loudly(tmp_path):
    run = [dataclasses.replace(v, isolation="degraded", isolation_reason="switched off") for v in small_run()]
    paths = write_reports(run, tmp_path)
    assert paths["md"].read_text().split("\n")[2].startswith("**isolation: degraded.")
    assert '<p class="alert">isolation: degraded.' in paths["html"].read_text()
    assert "isolation: degraded" not in write_reports(small_run(), tmp_path / "clean")["html"].read_text()


def test_shorten_cuts_at_a_word_boundary():
    assert shorten("a  b\n c", 10) == "a b c"
    assert shorten("the quick brown fox jumps", 16) == "the quick brown…"
    assert shorten("x" * 40, 10) == "x" * 9 + "…"  # one long word is cut inside it


def test_the_fast_p_text_says_what_correct_counts():
    """`rejudge --protocol kbv` printed "10 correct" beside fast_0 54.5%: four correct kernels had no speedup."""
    from kbverify.core import present

    run = ([verdict(f"{i}_T", "kbv", Status.PASSED, speedup=1.2, ci=(1.1, 1.3)) for i in range(1, 7)]
           + [verdict(f"{i}_T", "kbv", Status.PASSED) for i in range(7, 11)]
           + [verdict("11_T", "kbv", Status.INCORRECT)])
    text = present.render_fast_p(tables_by_protocol(run, P_VALUES, None), P_VALUES)
    assert "| fast_0 | 54.5%" in text
    assert ("kbv: 11 tasks, 10 correct (4 of them without a measured speedup, which fast_p counts as not fast), "
            "geomean speedup of the 6 timed 1.200x") in text
    timed = present.render_fast_p(tables_by_protocol(run[:6], P_VALUES, None), P_VALUES)
    assert "kbv: 6 tasks, 6 correct, geomean speedup of correct 1.200x" in timed

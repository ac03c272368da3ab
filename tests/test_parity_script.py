"""scripts/parity_kernelbench.py's report mode: the table and summary of stored runs, without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _record(kernel: str, kb: list[float], kv: list[float], kb_s: float, kv_s: float, agree: bool = True) -> dict:
    kb_median, kv_median = sorted(kb)[len(kb) // 2], sorted(kv)[len(kv) // 2]
    spread = max((max(v) - min(v)) / min(v) for v in (kb, kv))
    change = abs(kv_median / kb_median - 1)
    return {"id": kernel, "kb_compiled": True, "kb_correct": True, "verdicts_agree": agree,
            "kbverify_runs": [{"status": "passed", "build": {"native_sources": False}}],
            "kb_speedup": kb_median, "kbverify_speedup": kv_median, "speedup_change": change,
            "measured_spread": spread, "within_spread": change <= spread, "kb_process_s": kb_s,
            "kbverify_process_s": kv_s, "cost_ratio": kv_s / kb_s}


def test_the_report_mode_merges_runs_and_counts_agreement_spread_and_cost(tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(json.dumps(_record("k1", [1.0, 1.1], [1.05, 1.06], 4.0, 6.0)) + "\n")
    second.write_text(json.dumps(_record("k2", [2.0, 2.02], [2.5, 2.5], 10.0, 5.0, agree=False)) + "\n")
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "parity_kernelbench.py"), "--table-from",
                          str(first), str(second)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("| k1 |") and lines[1].startswith("| k2 |")
    assert "compiled/correct verdicts agree: 1/2" in run.stdout
    assert "within the larger of the two tools' own run-to-run spread: 1/2" in run.stdout
    assert "wall per kernel kbverify/KernelBench: median 1.00" in run.stdout  # 1.5 and 0.5
    assert "baseline timed live" not in run.stdout  # these runs did not record KernelBench's baseline seconds


def test_the_cost_with_kernelbench_baseline_timed_live_too_is_shown_beside_the_defined_one(tmp_path):
    record = _record("k1", [1.0, 1.1], [1.05, 1.06], 4.0, 6.0)
    record["kb_runs"] = [{"process_s": 4.0, "baseline_s": 1.0}, {"process_s": 4.2, "baseline_s": 1.0}]
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(record) + "\n")
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "parity_kernelbench.py"), "--table-from",
                          str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "wall per kernel kbverify/KernelBench: median 1.50" in run.stdout  # the definition, unchanged
    assert "baseline timed live too, as kbverify's is: median 1.18" in run.stdout  # 6.0 / median(5.0, 5.2)


def test_running_needs_the_kernelbench_copy_and_says_so():
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "parity_kernelbench.py"), "--kb", "x"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--table-from" in run.stderr and "Traceback" not in run.stderr


def test_a_kernel_run_again_later_is_reported_once_from_the_later_file(tmp_path):
    def measured(record: dict) -> dict:
        return {**record, "kb_runs": [{"process_s": record["kb_process_s"]}]}

    first, second, kbverify_only = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    first.write_text(json.dumps(measured(_record("k1", [1.0, 1.1], [1.05, 1.06], 4.0, 6.0))) + "\n"
                     + json.dumps(measured(_record("k2", [2.0, 2.02], [2.5, 2.5], 10.0, 5.0))) + "\n")
    second.write_text(json.dumps(measured(_record("k1", [1.0, 1.1], [1.05, 1.06], 4.0, 3.0))) + "\n")
    # a run with --kb-from measured kbverify alone: it must not replace a record with both sides
    kbverify_only.write_text(json.dumps({**_record("k2", [2.0, 2.02], [2.5, 2.5], 10.0, 1.0), "kb_runs": []}) + "\n")
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "parity_kernelbench.py"), "--table-from",
                          str(first), str(second), str(kbverify_only)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| k")]
    assert [row.split(" | ")[0] for row in rows] == ["| k1", "| k2"]  # once each, in first-seen order
    assert rows[0].rstrip(" |").endswith("3.000") and "kernels: 2;" in run.stdout  # k1's later cost, 3.0 s
    assert rows[1].rstrip(" |").endswith("5.000")  # k2 keeps the record with both sides


def test_kernelbench_baseline_runs_in_a_process_of_its_own_unless_asked_otherwise(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("parity_kernelbench", REPO / "scripts" / "parity_kernelbench.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    scripts = script.KB_SCRIPTS
    # the eval process KernelBench's cost counts never times the reference before the eval
    timing, evaluation = "kb_eval.time_execution_with_cuda_event(", "kb_eval.eval_kernel_against_ref("
    assert evaluation in scripts["eval"] and timing not in scripts["eval"]
    assert timing in scripts["baseline"] and evaluation not in scripts["baseline"]
    same = scripts["same-process"]
    assert same.index(timing) < same.index(evaluation)
    for text in scripts.values():
        compile(text, "kb", "exec")
    record = _record("k1", [1.0, 1.1], [1.05, 1.06], 4.0, 6.0)
    record["kb_runs"] = [{"process_s": 4.0, "baseline_s": 1.0, "kb_baseline": "separate"}]
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(record) + "\n")
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "parity_kernelbench.py"), "--table-from",
                          str(path)], capture_output=True, text=True, timeout=60)
    assert "KernelBench's baseline: timed in a process of its own for 1 (of 1 kernels)" in run.stdout, run.stdout

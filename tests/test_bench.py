"""The benchmarks in bench/ that read the library's output: what they parse must match what it writes."""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_cost_reads_the_runners_per_child_records_as_the_runner_formats_them():
    bench = _bench("bench_check_cost")
    # The runner's own format string, so a change to it that the benchmark cannot read fails here.
    (text,) = re.findall(r'log\.info\("(%s child for %s: %\.2f s[^"]*)"', (REPO / "kbverify" / "harness" / "runner.py").read_text())
    args = ("candidate", "relu_1", 1.5, *["spawn 0.1 s"] * (text.count("%") - 3))
    handler = bench.PhaseLog()
    handler.emit(logging.LogRecord("kbverify.harness.runner", logging.INFO, "runner.py", 1, text, args, None))
    assert handler.phases == [("candidate", "relu_1", 1.5)]
    line = "INFO kbverify.harness.runner: " + text % args
    assert bench._LOGGED_CHILD.search(line).groups() == ("candidate", "relu_1", "1.50")

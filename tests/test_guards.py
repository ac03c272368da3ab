"""The workers' tripwires, in a fresh interpreter (an audit hook cannot be removed once added)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, os, sys
from kbverify import guards
guards.install_tripwires()
seen = []
sys.addaudithook(lambda event, args: seen.append(event))  # as a submission would, to watch the harness
os.listdir(".")
results = {"hook_ran": bool(seen), "quiet": guards.quietly_refused, "refused": list(guards.refused)}
try:
    sys.settrace(lambda *a: None)
    results["settrace"] = "allowed"
except RuntimeError:
    results["settrace"] = "refused"
results["refused_after"] = list(guards.refused)
print(json.dumps(results))
"""


def test_a_further_audit_hook_is_dropped_quietly_and_a_trace_hook_refused():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["hook_ran"] is False  # it never saw the harness's listdir
    assert results["quiet"] == ["sys.addaudithook"] and results["refused"] == []  # evidence, not a verdict
    assert results["settrace"] == "refused" and results["refused_after"] == ["sys.settrace"]

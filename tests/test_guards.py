"""The workers' tripwires, in a fresh interpreter (an audit hook cannot be removed once added)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, os, sys
from kbverify.worker import guards
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


_FAKE_FLAGS_PROBE = """
import torch
from kbverify.worker.precision import assert_baseline_flags, tf32_state
before = tf32_state()


class Stand_in:
    enabled = True
    benchmark = False
    deterministic = False
    allow_tf32 = True


torch._C._set_mkldnn_enabled(False)
torch._C._set_cudnn_enabled(False)
torch.backends.mkldnn = Stand_in()
torch.backends.cudnn = Stand_in()
seen = tf32_state()
assert seen["mkldnn_enabled"] is False and seen["cudnn_enabled"] is False, seen
assert_baseline_flags(before)
assert torch._C._get_mkldnn_enabled() and torch._C._get_cudnn_enabled()
print("ok")
"""


def test_the_baseline_flags_are_read_and_restored_past_a_stand_in_flags_module():
    """torch.backends.mkldnn and .cudnn are attributes a submission can replace with an object reporting what it
    likes: the flags are read and written through torch's C functions, taken before any submission loads."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FAKE_FLAGS_PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]

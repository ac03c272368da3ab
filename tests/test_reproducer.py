"""A failing verdict carries a reproducer, and `check --only SET --secret S` reruns exactly that input set."""

import json
import subprocess
import sys

import pytest

from corpus_cases import CORPUS, REPO

RELU = REPO / "tasks" / "basic" / "level1" / "1_ReLU.py"


def _check(*args):
    done = subprocess.run([sys.executable, "-m", "kbverify", "check", *map(str, args), "--device", "cpu", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])["verdicts"]["verified"]


@pytest.mark.slow
def test_the_reproducer_reruns_exactly_the_failing_set():
    cheat = CORPUS / "exploits" / "relu_positivity_identity.py"
    code, verdict = _check(cheat, "--task", RELU, "--protocol", "verified")
    assert code == 1 and verdict["status"] == "incorrect"
    reproducer = verdict["reproducer"]
    assert reproducer["set"] == verdict["failing_set"] and reproducer["seed"] and reproducer["worst"]
    code, again = _check(cheat, "--task", RELU, "--protocol", "verified", "--only", reproducer["set"],
                         "--secret", reproducer["secret"])
    assert code == 1 and again["status"] == "incorrect"
    assert again["sets"]["total"] == 1
    assert again["reproducer"]["seed"] == reproducer["seed"]
    assert again["reproducer"]["worst"] == reproducer["worst"], "same seed, same inputs, same worst element"


@pytest.mark.slow
def test_only_a_hidden_shape_set_runs_the_submission_in_the_task_names():
    """With only hidden-shape sets asked for, the submission still loads in the original task's namespace: a harness
    that lost it would report a crash during candidate:load, blamed on an honest kernel."""
    honest = CORPUS / "honest" / "relu_clamp.py"
    code, verdict = _check(honest, "--task", RELU, "--protocol", "verified", "--only", "hidden:1/wide/default/s0",
                           "--secret", "cdcd3481e7edb9a7")
    assert verdict["status"] == "passed", verdict
    assert code == 0 and verdict["sets"]["total"] == 1

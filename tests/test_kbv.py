"""`kbv` reproduces KernelBench-Verified's rules: four distributions at 1e-3, no shifted or wide-range set, no
hidden shapes, no guards. What it catches and what only `verified` catches are both part of the contract."""

import pytest

from corpus_cases import CORPUS, REPO
from kbverify.core.protocols import KBV
from kbverify.core.submissions import load_submission
from kbverify.core.tasks import load_task
from kbverify.harness.runner import CheckOptions, check

OPTIONS = CheckOptions(device="cpu", timeout_s=60)


def _kbv(submission: str, task: str):
    return check(load_task(REPO / task), load_submission(CORPUS / submission), KBV, OPTIONS)


@pytest.mark.slow
def test_kbv_catches_positivity_shortcuts_with_its_negated_inputs():
    verdict = _kbv("exploits/relu_positivity_identity.py", "tasks/basic/level1/1_ReLU.py")
    assert verdict.status.value == "incorrect"
    assert verdict.reproducer["distribution"] == "neg"


@pytest.mark.slow
def test_kbv_misses_what_only_the_shifted_set_exposes():
    verdict = _kbv("exploits/layernorm_one_pass_variance.py", "tasks/basic/level1/4_LayerNorm.py")
    assert verdict.status.value == "passed"
    assert {s.distribution for s in verdict.sets} == {"x1", "x3", "x0.01", "neg"}
    assert verdict.speedup is not None and verdict.speedup_ci is None  # KernelBench's mean of 10 trials


@pytest.mark.slow
def test_kbv_has_no_guards_against_input_mutation():
    verdict = _kbv("exploits/relu_inplace_on_input.py", "tasks/basic/level1/1_ReLU.py")
    assert verdict.status.value == "passed"

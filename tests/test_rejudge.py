"""rejudge recomputes verdicts from stored evidence alone, and never turns a failure it cannot see into a pass."""

import dataclasses

import pytest

from corpus_cases import CORPUS, REPO
from kbverify.protocols import KBV, VERIFIED
from kbverify.records import Verdict
from kbverify.rejudge import rejudge_verdict
from kbverify.runner import CheckOptions, check
from kbverify.status import Status
from kbverify.submissions import load_submission
from kbverify.tasks import load_task

FAST = VERIFIED.with_overrides(timing_budget_s=0.2)
OPTIONS = CheckOptions(device="cpu", timeout_s=60)


def _check(submission: str, task: str) -> Verdict:
    verdict = check(load_task(REPO / task), load_submission(CORPUS / submission), FAST, OPTIONS)
    return Verdict.from_dict(verdict.to_dict())  # through the store's representation


@pytest.mark.slow
def test_a_verdict_decided_by_its_sets_follows_the_new_rules():
    verdict = _check("exploits/layernorm_one_pass_variance.py", "tasks/basic/level1/4_LayerNorm.py")
    assert verdict.status is Status.INCORRECT
    assert rejudge_verdict(verdict, FAST).status is Status.INCORRECT, "same rules, same verdict"
    # Without the shifted distribution the one-pass variance is not exposed (KernelBench-Verified's four sets).
    without_shift = FAST.with_overrides(distributions=("x1", "x3", "x0.01", "neg"), name="no-shift")
    assert rejudge_verdict(verdict, without_shift).status is Status.PASSED
    loose = FAST.with_overrides(atol=1e-1, rtol=1e-1, norm_rtol=1e-1, name="loose")
    assert rejudge_verdict(verdict, loose).status is Status.PASSED


def _with_stale_evidence(verdict: Verdict, errors: list[float]) -> Verdict:
    interleaved = dict(verdict.timing["interleaved"])
    interleaved["stale"] = {**interleaved["stale"], "n_mismatches": len(errors), "mismatches": [
        {"call": i, "relative_error": e, "projection_error": e, "limit": 1.1e-3} for i, e in enumerate(errors)]}
    return dataclasses.replace(verdict, status=Status.EXPLOIT_STALE_OUTPUT, message="timed outputs wrong",
                               timing={**verdict.timing, "interleaved": interleaved})


@pytest.mark.slow
def test_a_failure_found_while_timed_is_decided_again_from_its_timing_record():
    honest = _check("honest/relu_clamp.py", "tasks/basic/level1/1_ReLU.py")
    assert honest.status is Status.PASSED
    # what the timing guards make of a kernel whose timed outputs are wrong: every input set passed
    caught = _with_stale_evidence(honest, [0.8] * 5)
    assert all(s.status is Status.PASSED for s in caught.sets)
    assert rejudge_verdict(caught, FAST).status is Status.EXPLOIT_STALE_OUTPUT
    # one output just over the limit, judged stale by older rules: the record shows a numerical tail
    tail = rejudge_verdict(_with_stale_evidence(honest, [1.7e-3]), FAST)
    assert tail.status is Status.PASSED and "timed_outputs_near_tolerance" in tail.warnings
    assert rejudge_verdict(honest, FAST).status is Status.PASSED


def test_sets_never_measured_make_the_verdict_unverifiable_not_passed():
    base = Verdict(task="t", task_name="t", level=1, problem_id=1, submission="s", submission_sha256="",
                   protocol="kbv", protocol_sha256="", status=Status.PASSED)
    from kbverify.records import SetResult

    only_x1 = dataclasses.replace(base, sets=(SetResult("original/x1/default/s0", "original", "x1", "default", 1, True,
                                                        Status.PASSED, errors={"comparison": {"outputs": []}}),))
    assert rejudge_verdict(only_x1, KBV).status is Status.UNVERIFIABLE


@pytest.mark.slow
def test_rejudge_into_writes_a_copy_with_the_new_verdicts_and_leaves_the_store_alone(tmp_path):
    from kbverify.jobs import run_rejudge
    from kbverify.store import Store

    honest = _check("honest/relu_clamp.py", "tasks/basic/level1/1_ReLU.py")
    marginal = dataclasses.replace(_with_stale_evidence(honest, [1.7e-3]), protocol=FAST.name)
    store_path, copy_path = tmp_path / "runs.sqlite", tmp_path / "rejudged.sqlite"
    with Store(store_path) as store:
        store.begin_run("r1", {"gpu": "none"}, {})
        store.put("u1", "r1", marginal)
    result = run_rejudge(store_path, "verified", copy_path)
    assert [c["to"] for c in result["json"]["changes"]] == ["passed"]
    with Store(store_path) as store:
        assert [v.status for _, v in store.verdicts()] == [Status.EXPLOIT_STALE_OUTPUT]
    with Store(copy_path) as store:
        assert [v.status for _, v in store.verdicts()] == [Status.PASSED]
        assert store.runs()[0]["arguments"]["notes"][0]["rejudged"] == "verified"
    with pytest.raises(Exception, match="exists"):
        run_rejudge(store_path, "verified", copy_path)

"""rejudge recomputes verdicts from stored evidence alone, and never turns a failure it cannot see into a pass."""

import dataclasses

import pytest

import timed_evidence
from corpus_cases import CORPUS, REPO
from kbverify.core.protocols import KBV, VERIFIED
from kbverify.core.records import Verdict
from kbverify.core.status import Status
from kbverify.core.submissions import load_submission
from kbverify.core.tasks import load_task
from kbverify.harness.runner import CheckOptions, check
from kbverify.judge.rejudge import rejudge_verdict

FAST = VERIFIED.with_overrides(timing_budget_s=0.2, as_user_set=False)
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
    # as many checked calls as a full run's reservoir holds: a short CPU run checks fewer, and the share rule
    # (MARGINAL_FRACTION of the checked) is what is tested here, not that run's length
    timed_outputs = timed_evidence.stale(errors, max(verdict.timing["timed_outputs"].get("checked", 0), 24))
    return dataclasses.replace(verdict, status=Status.EXPLOIT_STALE_OUTPUT, message="timed outputs wrong",
                               timing={**verdict.timing, "timed_outputs": timed_outputs})


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
    from kbverify.core.records import SetResult

    only_x1 = dataclasses.replace(base, sets=(SetResult("original/x1/default/s0", "original", "x1", "default", 1, True,
                                                        Status.PASSED, errors={"comparison": {"outputs": []}}),))
    assert rejudge_verdict(only_x1, KBV).status is Status.UNVERIFIABLE


@pytest.mark.slow
def test_rejudge_into_writes_a_copy_with_the_new_verdicts_and_leaves_the_store_alone(tmp_path):
    from kbverify.cli.jobs import run_rejudge
    from kbverify.results.store import Store

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


_FP64_KEYS = ("exact_reference", "candidate_vs_fp64", "baseline_vs_fp64")


def _before_the_float64_comparison(verdict: Verdict) -> Verdict:
    """The verdict as a judge that did not compare candidates with float64 would have stored it."""
    sets = tuple(dataclasses.replace(s, errors={k: v for k, v in s.errors.items() if k not in _FP64_KEYS})
                 for s in verdict.sets)
    return dataclasses.replace(verdict, sets=sets)


def _one_set(errors: dict, distribution: str = "shifted") -> Verdict:
    from kbverify.core.records import SetResult

    base = Verdict(task="t", task_name="t", level=1, problem_id=1, submission="s", submission_sha256="",
                   protocol="verified", protocol_sha256="", status=Status.PASSED)
    sets = tuple(SetResult(f"original/{d}/default/s0", "original", d, "default", 1, True, Status.PASSED,
                           errors=errors if d == distribution else {"comparison": {"outputs": []}},
                           guards={"outputs": {}, "deterministic": True})
                 for d in FAST.distributions)
    return dataclasses.replace(base, sets=sets)


def test_stored_float64_evidence_decides_a_set_the_fp32_reference_fails():
    """From stored numbers alone: a candidate 50× over the limit against the fp32 reference and within it against
    float64 passes; the same record without the float64 comparison (made before it existed, or where float64
    could not be computed) is judged by today's rule, and the set's detail says why where the judge said so."""
    from kbverify.judge.correctness import EXACT_AVAILABLE

    def part(max_ratio, norm_rel):
        grid = {repr(t): {"max_ratio": max_ratio, "frac_over": 1.0} for t in (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)}
        return {"ref_shape": [], "cand_shape": [], "ref_dtype": "torch.float32", "cand_dtype": "torch.float32",
                "nonfinite_mismatch": 0, "ref_nonfinite": 0, "norm_rel": norm_rel, "ref_norm": 1.0,
                "max_abs_diff": 1.0, "grid": grid}

    errors = {"comparison": {"outputs": [part(50.0, 0.9)]}, "reference_vs_fp64": {"outputs": [part(50.0, 100.0)]},
              "exact_reference": EXACT_AVAILABLE, "candidate_vs_fp64": {"outputs": [part(1e-3, 1e-5)]}}
    new = rejudge_verdict(_one_set(errors), FAST)
    assert new.status is Status.PASSED
    assert [s.detail for s in new.sets if s.distribution == "shifted"] == ["judged against float64"]
    old = rejudge_verdict(_before_the_float64_comparison(_one_set(errors)), FAST)
    assert old.status is Status.INCORRECT and "float64" not in old.message
    why = "unavailable (the float64 run raised: RuntimeError: no double kernel)"
    unavailable = rejudge_verdict(_one_set({**errors, "exact_reference": why}), FAST)
    assert unavailable.status is Status.INCORRECT and unavailable.message.endswith("exact_reference: " + why)


@pytest.mark.slow
def test_a_kl_divergence_closer_to_float64_passes_and_its_record_rejudges_alike():
    verdict = _check("honest/kl_div_log1p_rows.py", "tasks/basic/level1/16_KLDivLoss.py")
    assert verdict.status is Status.PASSED, verdict.message
    shifted = [s for s in verdict.sets if s.distribution == "shifted"]
    assert shifted and all(s.detail.startswith("judged against float64") for s in shifted)
    assert all(s.errors["exact_reference"] == "float64" and "outputs" in s.errors["candidate_vs_fp64"]
               for s in verdict.sets if s.valid)
    assert rejudge_verdict(verdict, FAST).status is Status.PASSED
    old = rejudge_verdict(_before_the_float64_comparison(verdict), FAST)
    assert old.status is Status.INCORRECT and "/shifted/" in old.message


@pytest.mark.slow
def test_a_forward_that_draws_random_numbers_keeps_todays_rule_and_says_so():
    verdict = _check("honest/matmul_dropout_sum_same_rng.py", "tasks/basic/level2/4_Matmul_Dropout_Sum.py")
    assert verdict.status is Status.PASSED, verdict.message
    assert {s.errors["exact_reference"] for s in verdict.sets if s.valid} == {
        "unavailable (the reference's forward draws random numbers, which a float64 run need not repeat)"}
    assert not any("candidate_vs_fp64" in s.errors for s in verdict.sets)


def _verdict_as_check_decides(protocol, candidate: dict, judged: dict, plan) -> Verdict:
    """A verdict made by the judge's own functions, as check makes it, through the store's representation."""
    from kbverify import judge
    from kbverify.core import evidence
    from kbverify.core.records import BuildRecord
    from kbverify.judge.static import scan

    claimed = evidence.from_child(candidate, ran_submission=True, source="candidate", schema=evidence.CANDIDATE_SCHEMA)
    computed = evidence.from_child(judged, ran_submission=False, source="judge", schema=evidence.JUDGE_SCHEMA)
    sets = judge.merge_set_records(plan, claimed, computed, protocol)
    decided = judge.decide_isolated(sets, claimed, scan("class ModelNew: pass"),
                                    BuildRecord(native_sources=False, extension_built=None, extension_called=None),
                                    protocol)
    verdict = Verdict(task="t", task_name="t", level=1, problem_id=1, submission="s", submission_sha256="",
                      protocol=protocol.name, protocol_sha256=protocol.sha256, status=decided.status,
                      message=decided.message, warnings=decided.warnings, sets=tuple(sets))
    return Verdict.from_dict(verdict.to_dict())


def test_a_set_the_candidate_never_ran_keeps_what_check_made_of_it():
    """After a fatal error the candidate's record leaves the later sets out; check calls them crashed (the whole
    record says why), and a rejudge under the same rules must not read them as a record that hid them."""
    from kbverify.core.inputs import plan_input_sets

    plan = plan_input_sets(FAST, [("original", {})], secret="s")
    candidate = {"sets": {plan[0].set_id: {"outputs": {}, "mutated_inputs": [0]}}, "fatal": "CUDA error"}
    judged = {"sets": {s.set_id: {"valid": True, "comparison": {"outputs": []}} for s in plan}}
    verdict = _verdict_as_check_decides(FAST, candidate, judged, plan)
    assert verdict.status is Status.EXPLOIT_INPUT_MUTATION
    assert {s.status for s in verdict.sets[1:]} == {Status.CRASHED}
    rejudged = rejudge_verdict(verdict, FAST)
    assert (rejudged.status, rejudged.message, rejudged.sets) == (verdict.status, verdict.message, verdict.sets)


def test_warnings_read_from_the_sets_are_read_again_from_the_sets_kept():
    """baseline_allowance_used, no_valid_input_sets, shape_specialized and fp16_path say what the sets showed:
    a rejudge derives them again (kbverify.judge.decide_sets), as check would, and keeps every other warning."""
    from kbverify.core.records import SetResult

    def sets(valid: bool):
        return tuple(SetResult(f"original/{d}/default/s0", "original", d, "default", 1, valid, Status.PASSED,
                               detail="baseline allowance used", errors={"comparison": {"outputs": []}},
                               guards={"outputs": {}}) for d in KBV.distributions)

    stored = Verdict(task="t", task_name="t", level=1, problem_id=1, submission="s", submission_sha256="",
                     protocol="verified", protocol_sha256="", status=Status.PASSED, sets=sets(True),
                     warnings=("pytorch_only", "baseline_allowance_used", "threads_started"))
    rejudged = rejudge_verdict(stored, KBV)
    assert rejudged.status is Status.PASSED and rejudged.warnings == ("pytorch_only", "threads_started")
    unjudgeable = rejudge_verdict(dataclasses.replace(stored, sets=sets(False)), KBV)
    assert unjudgeable.status is Status.UNVERIFIABLE
    assert unjudgeable.warnings == ("pytorch_only", "threads_started", "no_valid_input_sets")

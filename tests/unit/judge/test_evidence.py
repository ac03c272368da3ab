"""Evidence carries its origin and is never edited after it was made (kbverify.core.evidence); the judge takes each
rule's evidence only from the origin the rule rests on."""

import pytest

from kbverify import judge
from kbverify.core import evidence
from kbverify.core.errors import InfrastructureError
from kbverify.core.evidence import Origin
from kbverify.core.protocols import KBV, VERIFIED
from kbverify.core.records import BuildRecord
from kbverify.core.status import Status
from kbverify.judge.static import scan

BUILD = BuildRecord(native_sources=False, extension_built=None, extension_called=None)
STATIC = scan("class ModelNew: pass")


def _claimed(record: dict):
    return evidence.from_child(record, ran_submission=True, source="candidate", schema=evidence.CANDIDATE_SCHEMA)


def test_the_origin_is_the_parents_knowledge_of_the_process_not_the_records_word():
    record = {"sets": {}, "origin": "computed"}
    assert _claimed(record).origin is Origin.CLAIMED
    assert evidence.from_child(record, ran_submission=False, source="judge",
                               schema=evidence.JUDGE_SCHEMA).origin is Origin.COMPUTED


def test_a_record_cannot_be_edited_once_it_is_evidence():
    record = {"sets": {"a": {"outputs": {"aliases_input": [1]}}}, "warnings": ["w"]}
    made = _claimed(record)
    record["warnings"].append("added after")  # the source dict is copied, not kept
    with pytest.raises(TypeError):
        made.facts["warnings"] = []
    with pytest.raises(TypeError):
        made.facts["sets"]["a"]["outputs"]["aliases_input"] = []
    copy = made.plain()
    copy["sets"]["a"]["outputs"]["aliases_input"].append(2)
    assert made.plain()["sets"]["a"]["outputs"]["aliases_input"] == [1]
    assert made.plain()["warnings"] == ["w"]
    assert made.origin is Origin.CLAIMED and made.version == evidence.EVIDENCE_VERSION


@pytest.mark.parametrize("record, named", [({"sets": []}, "sets is a list"), ({"warnings": "x"}, "warnings is a str"),
                                           ({"threads_started": True}, "threads_started is a bool")])
def test_a_claimed_record_the_harness_does_not_write_is_the_candidates_doing(record, named):
    made = _claimed(record)
    assert named in made.malformed
    decided = judge.decide_isolated([], made, STATIC, BUILD, VERIFIED)
    assert decided.status is Status.EXPLOIT_TAMPER and named in decided.message
    assert judge.decide_isolated([], made, STATIC, BUILD, KBV).status is Status.CRASHED  # no guards: no accusation


def test_the_honest_twin_of_a_malformed_record_is_judged_by_its_sets():
    made = _claimed({"sets": {}, "warnings": [], "threads_started": 0})
    assert made.malformed == ""
    # judged by its (here: no) sets, so no accusation, only the reference's lack of a valid set
    assert judge.decide_isolated([], made, STATIC, BUILD, VERIFIED).status is Status.UNVERIFIABLE


def test_the_judges_rules_refuse_evidence_of_the_wrong_origin():
    """A judge record from a process that ran submission code, or a parent finding that is not observed, is
    kbverify's own mistake: an infrastructure error (exit 3), never a verdict."""
    with pytest.raises(InfrastructureError, match="claimed"):
        judge.judge_infrastructure(_claimed({"sets": {}}))
    with pytest.raises(InfrastructureError, match="observed"):
        judge.decide_isolated([], _claimed({}), STATIC, BUILD, VERIFIED, observed=_claimed({}))


def test_a_malformed_judge_record_is_kbverifys_fault():
    computed = evidence.from_child({"sets": ["x"]}, ran_submission=False, source="judge",
                                   schema=evidence.JUDGE_SCHEMA)
    assert "malformed" in judge.judge_infrastructure(computed)


def test_a_malformed_timing_record_is_tamper_and_its_twin_is_not():
    def timed(record):
        made = evidence.from_child(record, ran_submission=True, source="timing", schema=evidence.TIMING_SCHEMA)
        reference = evidence.from_child({}, ran_submission=False, source="reference", schema=evidence.TIMING_SCHEMA)
        return judge.timed_failure(made, VERIFIED, forged="", stopped="", exit_code=0, reference=reference)

    status, message = timed({"n_unsettled": "0"})
    assert status is Status.EXPLOIT_TAMPER and "n_unsettled" in message
    assert timed({"n_unsettled": 0}) is None


def test_the_strays_the_parent_observed_make_a_tamper_verdict():
    observed = evidence.observed("listing", {"handover_strays": ["planted.pt"]})
    decided = judge.decide_isolated([], _claimed({}), STATIC, BUILD, VERIFIED, observed)
    assert decided.status is Status.EXPLOIT_TAMPER and "planted.pt" in decided.message

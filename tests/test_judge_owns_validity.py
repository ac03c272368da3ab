"""What the candidate's own record says of a set never decides that the set does not count: the judge drew the
same inputs and ran the reference, so validity, a missing entry and an unknown skip are decided against it."""

from kbverify.core.protocols import VERIFIED
from kbverify.core.status import Status
from kbverify.judge import decide_set


def test_a_claimed_input_error_on_a_set_the_judge_drew_is_the_candidates_failure():
    status, detail = decide_set({"input_error": "RuntimeError: no"}, {"valid": True}, VERIFIED, {})
    assert status is Status.RUNTIME_ERROR and "the judge drew" in detail
    status, _ = decide_set({"input_error": "RuntimeError: no"}, {"valid": False, "invalid_reason": "nan"}, VERIFIED, {})
    assert status is Status.PASSED  # the task's own draw failed for the judge too: the set is not counted


def test_a_record_without_a_planned_set_or_with_an_unknown_skip_is_tamper():
    assert decide_set(None, {"valid": True}, VERIFIED, {})[0] is Status.EXPLOIT_TAMPER
    assert decide_set({"skipped": "input_looked_odd"}, {"valid": True}, VERIFIED, {})[0] is Status.EXPLOIT_TAMPER
    assert decide_set({"skipped": "construct_error: ValueError"}, {"valid": True}, VERIFIED, {})[0] is \
        Status.RUNTIME_ERROR

"""A verdict says when the larger hidden shapes kept an axis at the task's size (kbverify.shapes.hidden_larger): a
warning, and the axes with why in a passing verdict's message; a failing verdict keeps its own message."""

from kbverify.core.status import Status, Warn
from kbverify.judge import Decision, with_kept_axes

NOTE = "larger hidden shapes keep dim at the task's size (memory: needs 9 bytes at its peak, more than 8)"


def test_a_pass_names_the_kept_axes():
    decided = with_kept_axes(Decision(Status.PASSED), NOTE)
    assert decided.message == NOTE and Warn.HIDDEN_AXES_KEPT.value in decided.warnings


def test_a_failure_keeps_its_message_and_gets_the_warning():
    decided = with_kept_axes(Decision(Status.INCORRECT, "norm-wise error 1"), NOTE)
    assert decided.message == "norm-wise error 1" and Warn.HIDDEN_AXES_KEPT.value in decided.warnings


def test_nothing_kept_changes_nothing():
    assert with_kept_axes(Decision(Status.PASSED), "") == Decision(Status.PASSED)

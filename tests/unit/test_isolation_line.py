"""A sandbox-off run's stdout summary says `isolation: degraded`, not only its reports (issue 35)."""

from __future__ import annotations

import dataclasses

from kbverify.core.present import isolation_line
from kbverify.core.records import Verdict
from kbverify.core.status import Status


def _verdict(isolation: str, reason: str = "") -> Verdict:
    return Verdict(task="t", task_name="t", level=1, problem_id=1, submission="s", submission_sha256="",
                   protocol="verified", protocol_sha256="", status=Status.PASSED, isolation=isolation,
                   isolation_reason=reason)


def test_a_degraded_run_says_so_in_one_line_with_its_reason():
    off = _verdict("degraded", "switched off by KBVERIFY_SANDBOX=off")
    line = isolation_line([off, dataclasses.replace(off), _verdict("isolated"), _verdict("not_run")])
    assert line == ("isolation: degraded: 2 of 4 verdicts ran unconfined (switched off by KBVERIFY_SANDBOX=off); "
                    "treat them as unhardened\n")


def test_an_isolated_run_says_nothing():
    assert isolation_line([_verdict("isolated"), _verdict("not_run")]) == ""

"""A unit that ran out of memory beside other units is evaluated again alone, whether the out of memory came back
as a verdict or as kbverify's own fault (the judge's process): what its neighbours held never decides it."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from kbverify.core.errors import InfrastructureError
from kbverify.core.records import Verdict
from kbverify.core.status import Status
from kbverify.harness.device_share import DeviceLease, Sharing
from kbverify.harness.runner import CheckOptions
from kbverify.rescore import rescore


def _verdict(status: Status, message: str = "") -> Verdict:
    return Verdict(task="t", task_name="t", level=1, problem_id=1, submission="s", submission_sha256="",
                   protocol="verified", protocol_sha256="", status=status, message=message)


class _Sink:
    store, lock = None, threading.Lock()


def _run(monkeypatch, outcomes: list, shared: bool = True) -> tuple[Verdict, list]:
    seen = []

    def evaluate(unit, options, store, lock):
        seen.append(bool(options.sharing and options.sharing.alone))
        outcome = outcomes[len(seen) - 1]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(rescore, "evaluate_unit", evaluate)
    unit = type("U", (), {"entry": type("E", (), {"entry_id": "e"})(), "protocol": type("P", (), {"name": "v"})()})()
    sharing = Sharing(lease=DeviceLease("cuda:0", slots=4)) if shared else None
    options = dataclasses.replace(CheckOptions(device="cuda:0"), sharing=sharing)
    return rescore.LocalExecutor._evaluate_once_more_alone(unit, options, _Sink()), seen


def test_the_judges_own_out_of_memory_is_evaluated_again_alone(monkeypatch):
    fault = InfrastructureError("the judge could not compare set x: out of memory comparing the candidate's output")
    verdict, seen = _run(monkeypatch, [fault, _verdict(Status.PASSED)])
    assert verdict.status is Status.PASSED and seen == [False, True]


def test_an_out_of_memory_verdict_is_evaluated_again_alone(monkeypatch):
    oom = _verdict(Status.UNVERIFIABLE, "the timed outputs could not all be checked: out of memory copying the output")
    verdict, seen = _run(monkeypatch, [oom, _verdict(Status.PASSED)])
    assert verdict.status is Status.PASSED and seen == [False, True]


def test_other_faults_and_verdicts_are_not_retried(monkeypatch):
    with pytest.raises(InfrastructureError):
        _run(monkeypatch, [InfrastructureError("the sandbox could not be built")])
    verdict, seen = _run(monkeypatch, [_verdict(Status.INCORRECT, "norm-wise error 0.5")])
    assert verdict.status is Status.INCORRECT and seen == [False]
    with pytest.raises(InfrastructureError):  # alone already: nothing beside it to blame
        _run(monkeypatch, [InfrastructureError("out of memory")], shared=False)

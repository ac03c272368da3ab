"""fast_p tables from a named clock (`score`/`report`/`rescore --clock device|host`; kbverify.timing.clocks).

A table reads the same clock for every verdict, whatever a verdict's mode chose for its headline; a verdict
recorded before both clocks were kept keeps its own speedup, and the output says how many did.
"""

from __future__ import annotations

import json

import pytest

from kbverify.cli import jobs, validate
from kbverify.core.errors import InputError
from kbverify.core.records import Verdict
from kbverify.core.status import Status
from kbverify.results.store import Store
from kbverify.timing import clocks

MACHINE = {"gpu_model": "H200", "driver": "580", "cuda": "13.0", "torch": "2.11"}


def _verdict(name: str, speedup: float, timing: dict) -> Verdict:
    return Verdict(task=f"level1/{name}@abc", task_name=name, level=1, problem_id=1, submission=f"{name}.py",
                   submission_sha256="f" * 64, protocol="verified", protocol_sha256="0" * 64, status=Status.PASSED,
                   speedup=speedup, speedup_ci=(speedup * 0.95, speedup * 1.05), timing=timing)


def _two_clocks(device: float, host: float, mode: str) -> dict:
    return {"mode": mode, "mode_reason": "test", "clock_used": "host" if mode == "sync" else "device",
            "clocks": {"device": {"speedup": device, "ci": [device * 0.9, device * 1.1], "ref_ms": 1.0,
                                  "cand_ms": 1.0 / device},
                       "host": {"speedup": host, "ci": [host * 0.9, host * 1.1], "ref_ms": 1.2,
                                "cand_ms": 1.2 / host}}}


# a blocked forward (sync mode, headline = host) and a plain one (hold mode, headline = device)
BLOCKED = _verdict("blocked", 1.51, _two_clocks(device=1.35, host=1.51, mode="sync"))
PLAIN = _verdict("plain", 2.0, _two_clocks(device=2.0, host=1.6, mode="hold"))
# recorded before the host clock: its "host" entry was the parent's wall clock, not a host-inclusive time
OLD = _verdict("old", 1.2, {"interleaved": {"rounds": []}, "clocks": {"device": {"speedup": 1.2, "ci": [1.1, 1.3]},
                                                                   "host": {"speedup": 1.05, "ci": [1.0, 1.1]}},
                            "clock_used": "device"})


def test_a_verdict_is_read_by_the_clock_asked_for_never_its_headline():
    assert clocks.clock_view(BLOCKED, "device").speedup == 1.35
    assert clocks.clock_view(BLOCKED, "host").speedup == 1.51
    assert clocks.clock_view(PLAIN, "host").speedup == 1.6
    assert clocks.clock_view(PLAIN, "host").speedup_ci == (pytest.approx(1.44), pytest.approx(1.76))
    assert clocks.clock_view(PLAIN, "host").cand_time_ms == pytest.approx(0.75)


def test_an_old_record_keeps_its_own_speedup_and_is_counted():
    assert clocks.clock_entry(OLD, "host") is None  # its "host" was not the host-inclusive clock
    assert clocks.clock_view(OLD, "host") is OLD
    viewed, missing = clocks.views([BLOCKED, PLAIN, OLD], "host")
    assert [v.speedup for v in viewed] == [1.51, 1.6, 1.2] and missing == 1
    assert "1 timed verdict(s) carry no host clock" in clocks.missing_note("host", missing)


def test_score_of_a_store_reads_the_named_clock(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        store.begin_run("r1", MACHINE, {})
        for index, verdict in enumerate((BLOCKED, PLAIN, OLD)):
            store.put(f"u{index}", "r1", verdict)
    ps = (1.5,)
    device = jobs.run_score(path, baseline=None, level=None, ps=ps, exclude_path=None, samples=None)
    host = jobs.run_score(path, baseline=None, level=None, ps=ps, exclude_path=None, samples=None, clock="host")
    share = lambda result: result["json"]["tables"]["verified"]["rows"][0]["fast_p"]  # noqa: E731
    assert share(device) == pytest.approx(1 / 3)  # device: 1.35, 2.0, 1.2 → only PLAIN is past 1.5
    assert share(host) == pytest.approx(2 / 3)  # host: 1.51, 1.6, 1.2 (the old record keeps its own)
    assert device["json"]["clock"] == "device" and host["json"]["missing_clock"] == 1
    assert "carry no host clock" in host["text"]
    json.dumps(host["json"])


def test_only_the_two_clocks_are_accepted():
    assert validate.clock("device") == "device" and validate.clock("host") == "host"
    with pytest.raises(InputError):
        validate.clock("wall")
    with pytest.raises(ValueError):
        clocks.clock_view(PLAIN, "wall")

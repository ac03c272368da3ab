"""The replay tier (issue 33): the judge on records captured once from real runs, in seconds, with no worker.

- data/cpu_replay_records.json.gz: what the judge's functions received in real CPU runs of corpus cases and of a few
  small cases (scripts/capture_replay_records.py, which says how it was taken), each with the status and warnings
  they decided then. Each record is decided again here by the function that decided it then.
- Three warnings only a GPU run emits have no CPU record, and no stored GPU verdict earned them: one stored GPU
  verdict's raw timing record (tests/data/gpu_stores.tar.xz), with the one field that earns each changed, is decided again by
  `decide_timing`, and must come out as the stored record does plus that warning.
- Coverage: these replays and those of the stored GPU stores (test_replayed_gpu_stores.py) together reach every
  status and every warning the judge emits; the few warnings that other code emits are listed, with where.

A record that no longer decides as captured names the rule that moved. Capture again only for a change of a
worker's record format, and say so in the commit.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gzip
import json
import tempfile
from pathlib import Path

import pytest

from kbverify.core import evidence
from kbverify.core.inputs import InputSet
from kbverify.judge import (build_record, death, decide_isolated, decide_kernelbench, judge_infrastructure,
                            merge_set_records, with_kept_axes)
from kbverify.core.protocols import parse_protocols, protocol_from_dict
from kbverify.core.records import Verdict
from kbverify.core.status import Status, Warn
from kbverify.harness.sandbox import ChildOutcome
from kbverify.judge.rejudge import rejudge_verdict
from kbverify.judge.static import StaticScan
from kbverify.judge.timing import decide_timing
from kbverify.results.store import Store

import gpu_stores

REPO = Path(__file__).resolve().parents[3]
CAPTURED = json.loads(gzip.decompress((Path(__file__).parent / "data" / "cpu_replay_records.json.gz").read_bytes()))
PROTOCOLS = {name: protocol_from_dict(data) for name, data in CAPTURED["protocols"].items()}
RECORDS = CAPTURED["records"]


def _static(data: dict) -> StaticScan:
    return StaticScan(**{**data, "kernel_names": tuple(data["kernel_names"]),
                         "suspicious": tuple(data["suspicious"])})


def _isolated(found: dict, protocol) -> tuple[Status, tuple]:
    """The isolated protocols' correctness, as the runner reaches it (kbverify.harness.runner._correctness_isolated)."""
    claimed = evidence.from_child(found["candidate"]["record"], ran_submission=found["candidate"]["ran_submission"],
                                  source="the candidate's worker", schema=evidence.CANDIDATE_SCHEMA)
    computed = evidence.from_child(found["judge"]["record"], ran_submission=found["judge"]["ran_submission"],
                                   source="the judge's worker", schema=evidence.JUDGE_SCHEMA)
    assert judge_infrastructure(computed) is None
    observed = (None if found["observed"] is None
                else evidence.observed("the parent's listing of the hand-over folder", found["observed"]))
    static = _static(found["static"])
    sets = merge_set_records([InputSet(**s) for s in found["plan"]], claimed, computed, protocol)
    build = build_record(static, claimed.plain().get("extensions"))
    decided = with_kept_axes(decide_isolated(sets, claimed, static, build, protocol, observed), found["kept_axes"])
    return decided.status, decided.warnings


def _death(found: dict, _protocol) -> tuple[Status, tuple]:
    outcome = ChildOutcome(**{**found["outcome"], "phases_s": tuple(map(tuple, found["outcome"]["phases_s"]))})
    return death(outcome, found["party"])[0], ()


def _kernelbench(found: dict, protocol) -> tuple[Status, tuple]:
    decided = decide_kernelbench(found["record"], _static(found["static"]), protocol)
    return decided.status, decided.warnings


def _timing(found: dict, protocol) -> tuple[Status, tuple]:
    decided = decide_timing(Verdict.from_dict(found["verdict"]), protocol)
    return decided.status, decided.warnings


def _rejudge(found: dict, protocol) -> tuple[Status, tuple]:
    decided = rejudge_verdict(Verdict.from_dict(found["verdict"]), protocol)
    return decided.status, decided.warnings


REPLAY = {"isolated": _isolated, "death": _death, "kernelbench": _kernelbench, "timing": _timing,
          "rejudge": _rejudge}


def replay(record: dict) -> tuple[Status, tuple]:
    return REPLAY[record["kind"]](record["evidence"], PROTOCOLS.get(record["protocol"]))


@pytest.mark.parametrize("record", RECORDS, ids=[f"{r['kind']}: {r['case']}" for r in RECORDS])
def test_a_captured_cpu_record_is_decided_as_it_was(record):
    status, warnings = replay(record)
    assert (status.value, list(warnings)) == (record["expect"]["status"], record["expect"]["warnings"]), \
        record["case"]


def test_a_rejudged_record_is_decided_from_its_evidence_not_echoed():
    """`rejudge` leaves a verdict decided outside its sets as stored (the capture keeps none of those): stored as
    passing, each rejudged record must still come out as recorded, so its replay compares a decision, not the
    stored status with itself."""
    for record in (r for r in RECORDS if r["kind"] == "rejudge"):
        stored = Verdict.from_dict(record["evidence"]["verdict"])
        again = rejudge_verdict(dataclasses.replace(stored, status=Status.PASSED), PROTOCOLS[record["protocol"]])
        assert again.status.value == record["expect"]["status"], record["case"]


# ---- GPU-only warnings: a stored GPU verdict's timing record, one field changed --------------------------------

GPU_STORE = "h200-2026-12-02/call4_anchor_store_e.sqlite"
GPU_VERDICT = "9dfc8ffb859cf166f7a4c873efed2a5a43f5845c4703f54c17678edd822a641d"  # 39_level1, passed, hold mode


def _slow_sm_clock(timing: dict) -> None:
    """One round read at 80% of the highest SM clock, as nvidia-smi reports a GPU that throttles."""
    rounds = timing["rounds"] if "rounds" in timing else timing["interleaved"]["rounds"]
    rounds[0]["sm_clock_mhz"] = int(0.8 * max(r["sm_clock_mhz"] for r in rounds))


def _slow_candidate_host(timing: dict) -> None:
    """The candidate's host work per call 10 ms over the reference's (its device time is 0.01 ms)."""
    host = timing["interleaved"]["host_ms"]
    host["cand"]["p50"] = host["ref"]["p50"] + 10.0


def _no_sleep_in_this_torch(timing: dict) -> None:
    """What the timing worker writes where torch.cuda._sleep is missing (kbverify.worker.timing._device_hold)."""
    timing["interleaved"]["warnings"] = [*(timing["interleaved"].get("warnings") or []), Warn.NO_DEVICE_HOLD.value]


GPU_CHANGES = {Warn.THROTTLED: _slow_sm_clock, Warn.HOST_OVERHEAD: _slow_candidate_host,
               Warn.NO_DEVICE_HOLD: _no_sleep_in_this_torch}


def _stored_verdicts(store: str) -> tuple:
    with tempfile.TemporaryDirectory() as folder:
        database = gpu_stores.copy_store(store, Path(folder) / "store.sqlite")
        return tuple(Store(database, existing=True).verdicts())


@functools.lru_cache(maxsize=None)
def _gpu_verdict() -> Verdict:
    return dict(_stored_verdicts(GPU_STORE))[GPU_VERDICT]


def _gpu_replay(warning: Warn) -> tuple[Verdict, Verdict]:
    """(the stored record decided again, the record with `warning`'s field changed decided again)."""
    stored = _gpu_verdict()
    protocol = parse_protocols(stored.protocol)[0]
    timing = copy.deepcopy(stored.timing)
    GPU_CHANGES[warning](timing)
    return decide_timing(stored, protocol), decide_timing(dataclasses.replace(stored, timing=timing), protocol)


@pytest.mark.parametrize("warning", list(GPU_CHANGES), ids=lambda w: w.value)
def test_a_stored_gpu_timing_record_changed_in_one_field_earns_its_warning(warning):
    as_stored, changed = _gpu_replay(warning)
    assert as_stored.status is changed.status is Status.PASSED
    assert warning.value not in as_stored.warnings
    assert changed.warnings == (*as_stored.warnings, warning.value)


# ---- coverage -----------------------------------------------------------------------------------------------

# Warnings the judge never emits, with the module that does (or none) and why they are not the judge's. Each is
# checked below: the judge's package does not name it, and the module named does.
NOT_THE_JUDGES = {
    Warn.FOREIGN_GPU_PROCESS: ("kbverify/harness/gpu_processes.py", "the parent's own nvidia-smi look at the device before "
                               "and after timing (runner._with_gpu_checks); no stored GPU look found one"),
    Warn.GPU_PROCESSES_UNCHECKED: ("kbverify/harness/gpu_processes.py", "the same look, where nvidia-smi could not answer; "
                                   "every stored GPU look was answered"),
    Warn.MODIFIED_REFERENCE: ("kbverify/rescore/rescore.py", "an imported leaderboard entry's ref_code differs from every "
                              "KernelBench version (kbverify.rescore.importers): a fact of the entry, known before any run"),
}


def _gpu_store_outcomes() -> set[str]:
    expected = json.loads((Path(__file__).with_name("replayed_gpu_verdicts.json")).read_text())
    found = set()
    for store in expected:
        for _, verdict in _stored_verdicts(store):
            try:
                protocol = parse_protocols(verdict.protocol)[0]
            except Exception:  # noqa: BLE001 - a protocol of its own run's: not replayed
                continue
            again = rejudge_verdict(verdict, protocol)
            if again is not None:
                found |= {again.status.value, *again.warnings}
    return found


def test_every_status_and_every_judge_warning_has_a_replayed_case():
    found = _gpu_store_outcomes()
    for record in RECORDS:
        status, warnings = replay(record)
        found |= {status.value, *warnings}
    for warning in GPU_CHANGES:
        found |= set(_gpu_replay(warning)[1].warnings)
    assert not {s.value for s in Status} - found, "statuses no replay reaches"
    assert not {w.value for w in Warn} - found - {w.value for w in NOT_THE_JUDGES}, "warnings no replay reaches"
    assert not found & {w.value for w in NOT_THE_JUDGES}, "a listed warning is replayed: drop it from the list"


@pytest.mark.parametrize("warning", list(NOT_THE_JUDGES), ids=lambda w: w.value)
def test_a_warning_listed_as_not_the_judges_is_emitted_where_the_list_says(warning):
    def names(path: Path) -> bool:
        text = path.read_text()
        return f"Warn.{warning.name}" in text or f'"{warning.value}"' in text

    module, _ = NOT_THE_JUDGES[warning]
    assert not any(names(p) for p in (REPO / "kbverify" / "judge").glob("*.py"))
    if module is not None:
        assert names(REPO / module)
    else:
        assert not any(names(p) for p in (REPO / "kbverify").rglob("*.py") if p.name != "status.py")

"""The judge on records captured once from real GPU runs: every verdict of the stores kept in
tests/data/gpu_stores.tar.xz (H200 sessions, 714 verdicts), decided again by `rejudge`, gives the status recorded in
replayed_gpu_verdicts.json (None: a verdict rejudge leaves as it was stored). A change to a rule that moves any of
them shows here, in seconds, with the unit named; regenerate the file only for a change the closing note lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kbverify.core.protocols import parse_protocols
from kbverify.judge.rejudge import rejudge_verdict
from kbverify.results.store import Store

import gpu_stores

EXPECTED = json.loads((Path(__file__).with_name("replayed_gpu_verdicts.json")).read_text())


@pytest.mark.parametrize("store", sorted(EXPECTED))
def test_a_stored_gpu_run_is_judged_again_as_recorded(store: str, tmp_path):
    database = gpu_stores.copy_store(store, tmp_path / "store.sqlite")
    got = {}
    for key, verdict in Store(database, existing=True).verdicts():
        try:
            protocol = parse_protocols(verdict.protocol)[0]
        except Exception:  # noqa: BLE001 - a protocol of its own run's, not a named one: not replayed
            continue
        again = rejudge_verdict(verdict, protocol)
        got[key] = again.status.value if again is not None else None
    expected = EXPECTED[store]
    moved = {key: (expected.get(key), got.get(key)) for key in expected.keys() | got.keys()
             if expected.get(key) != got.get(key)}
    assert not moved, f"{len(moved)} verdicts moved (expected, got): {dict(list(moved.items())[:5])}"

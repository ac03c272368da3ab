"""Issue 22, the GPU never waits: the device lease (kbverify.harness.device_share) and `rescore --share-gpu N` on the CPU.

The lease's invariants under many threads (no shared holder beside the exclusive one, timing never starved, FIFO,
nothing leaked by exceptions or timeouts); the executor's plumbing, with the checks' phases replaced by recorders
(correctness of two units overlaps, every timing phase has the device alone, the original protocol's one job
counts as timing); and a real rescore of the tiny bundled tasks with --share-gpu 2 reaching the statuses of
--share-gpu 1.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time

import pytest

from kbverify.cli import jobs, validate
from kbverify.core.errors import InputError
from kbverify.core.protocols import ORIGINAL, VERIFIED
from kbverify.core.status import Status
from kbverify.harness import device_share, runner
from kbverify.harness import provenance as provenance_module
from kbverify.harness.device_share import CORRECTNESS, TIMING, DeviceLease, LeaseTimeout, Sharing, phase
from kbverify.harness.runner import CheckOptions
from kbverify.rescore import rescore as rescore_module
from kbverify.rescore.importers import load_entries
from kbverify.rescore.rescore import BuildPlan, LocalExecutor
from kbverify.results.store import Store
from tests.test_rescore import FAST, HONEST, RELU_IDENTITY, WORKER_TIMEOUT_S, write_run

pytestmark = pytest.mark.serial  # it runs checks side by side itself: alone on the machine (.ci/run)


class Recorder:
    """Every LeaseEvent, and the invariant checked at each one (the observer runs under the lease's lock)."""

    def __init__(self, slots: int):
        self.slots, self.events, self.broken = slots, [], []

    def __call__(self, event):
        self.events.append(event)
        if event.exclusive and event.shared_holders:
            self.broken.append(f"a shared holder beside the exclusive one: {event}")
        if event.shared_holders > self.slots:
            self.broken.append(f"more shared holders than slots: {event}")


def _start(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


# ---- the lease ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 4])
def test_many_threads_never_see_a_shared_holder_beside_the_exclusive_one(batch):
    recorder = Recorder(slots=3)
    lease = DeviceLease("cuda:0", 3, wait_s=30, observer=recorder, batch=batch, defer_s=0.01)
    inside = {"shared": 0, "exclusive": 0, "most_shared": 0}
    count = threading.Lock()
    errors = []

    def worker(seed: int):
        rng = random.Random(seed)
        try:
            for _ in range(40):
                kind = "exclusive" if rng.random() < 0.3 else "shared"
                with getattr(lease, kind)(f"t{seed}"):
                    with count:
                        inside[kind] += 1
                        inside["most_shared"] = max(inside["most_shared"], inside["shared"])
                        assert inside["exclusive"] <= 1 and not (inside["exclusive"] and inside["shared"])
                    time.sleep(rng.random() * 0.002)
                    with count:
                        inside[kind] -= 1
        except BaseException as error:  # noqa: BLE001 - reported below, not lost in a thread
            errors.append(error)

    threads = [_start(worker, seed) for seed in range(12)]
    for thread in threads:
        thread.join(60)
    assert not errors and not recorder.broken, (errors, recorder.broken[:3])
    assert inside["most_shared"] > 1  # the shared lease was shared
    holds = [e for e in recorder.events if e.action == "hold"]
    assert len(holds) == 12 * 40 and lease.holders() == (0, False)


def test_a_stream_of_correctness_work_never_starves_timing():
    recorder = Recorder(slots=2)
    lease = DeviceLease("cuda:0", 2, wait_s=30, observer=recorder)
    stop = threading.Event()

    def correctness_forever(name: str):
        while not stop.is_set():  # overlapping holders: without the rule there would always be one
            with lease.shared(name):
                time.sleep(0.005)

    streams = [_start(correctness_forever, f"c{i}") for i in range(4)]
    time.sleep(0.05)
    asked = time.monotonic()
    with lease.exclusive("timing"):
        granted = time.monotonic() - asked
        assert lease.holders() == (0, True)
    stop.set()
    for thread in streams:
        thread.join(10)
    assert granted < 2.0
    # Once timing asked, only correctness that had asked before it came in (at most one per stream), and none
    # while it held.
    events = recorder.events
    asked_at, held_at, released_at = (next(i for i, e in enumerate(events) if e.kind == TIMING and e.action == a)
                                      for a in ("wait", "hold", "release"))
    asked_when: dict[str, int] = {}
    for index, event in enumerate(events[:held_at]):
        if event.action == "wait":
            asked_when[event.holder] = index
        elif event.action == "hold" and index > asked_at:
            assert asked_when[event.holder] < asked_at, f"{event.holder} overtook the waiting timing phase"
    assert not [e for e in events[held_at + 1:released_at] if e.action == "hold"]
    assert not recorder.broken


def test_a_timing_request_joins_the_running_drain_and_the_correctness_it_held_back_goes_next():
    order = []
    lease = DeviceLease("cpu", 2, wait_s=30, observer=lambda e: order.append(e.holder) if e.action == "hold" else None)
    gate = threading.Event()

    def hold(kind: str, name: str, until: threading.Event | None = None):
        with getattr(lease, kind)(name):
            if until is not None:
                until.wait(10)
            time.sleep(0.02)

    threads = [_start(hold, "exclusive", "first", gate)]
    while lease.holders() != (0, True):
        time.sleep(0.001)
    for index, kind in enumerate(("shared", "exclusive", "shared", "shared")):
        threads.append(_start(hold, kind, f"w{index}"))
        while len(lease._queue) < index + 1:  # each asks after the one before
            time.sleep(0.001)
    gate.set()
    for thread in threads:
        thread.join(10)
    # "first" drained the device; w1 asked while it held, so the same drain serves it before any correctness
    # (no second drain for it); then w0 and w2 share the two slots, w3 the first one freed.
    assert order == ["first", "w1", "w0", "w2", "w3"]
    assert lease.holders() == (0, False) and not lease._queue


def _holding(lease, kind: str, name: str, until: threading.Event) -> threading.Thread:
    def hold():
        with getattr(lease, kind)(name):
            until.wait(10)
    thread = _start(hold)
    return thread


def _wait_for(predicate, timeout: float = 5.0) -> None:
    ends = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < ends, "the lease never reached the expected state"
        time.sleep(0.001)


def test_a_batch_of_timing_requests_drains_the_device_once_and_runs_back_to_back():
    recorder = Recorder(slots=2)
    lease = DeviceLease("cpu", 2, wait_s=30, observer=recorder, batch=3, defer_s=30)
    busy, go = threading.Event(), threading.Event()
    holders = [_holding(lease, "shared", f"c{i}", busy) for i in range(2)]
    _wait_for(lambda: lease.holders() == (2, False))
    threads = []
    for index, kind in enumerate(("exclusive", "exclusive", "shared", "exclusive", "shared")):
        threads.append(_holding(lease, kind, f"{kind[0]}{index}", go))
        _wait_for(lambda: len(lease._queue) == index + 1)
    assert not lease._draining  # two timing requests are short of the batch: correctness keeps its slots
    busy.set()
    go.set()
    for thread in holders + threads:
        thread.join(10)
    holds = [e.holder for e in recorder.events if e.action == "hold"]
    # The third timing request made the batch: one drain serves all three back to back, and the correctness that
    # asked between them waits until the drain is over.
    assert holds[2:] == ["e0", "e1", "e3", "s2", "s4"]
    assert not recorder.broken and lease.holders() == (0, False)


def test_a_timing_request_short_of_the_batch_waits_defer_s_at_most():
    recorder = Recorder(slots=2)
    lease = DeviceLease("cpu", 2, wait_s=30, observer=recorder, batch=4, defer_s=0.3)
    busy, stop = threading.Event(), threading.Event()
    holder = _holding(lease, "shared", "busy", busy)  # the device is never free: only defer_s can start the drain
    _wait_for(lambda: lease.holders() == (1, False))

    def correctness_forever():
        while not stop.is_set():
            with lease.shared("stream"):
                time.sleep(0.005)

    stream = _start(correctness_forever)
    threading.Timer(0.6, busy.set).start()
    asked = time.monotonic()
    with lease.exclusive("alone"):
        pass
    stop.set()
    for thread in (holder, stream):
        thread.join(10)
    granted = next(e.at for e in recorder.events if e.holder == "alone" and e.action == "hold")
    streamed = [e.at - asked for e in recorder.events
                if e.holder == "stream" and e.action == "hold" and asked < e.at < granted]
    # Correctness kept its slot until defer_s, and none entered once the drain started (then "busy" ended it).
    assert streamed and 0.2 < max(streamed) < 0.35, max(streamed)
    assert not recorder.broken


def test_correctness_held_back_by_a_drain_goes_before_the_next_one():
    recorder = Recorder(slots=1)
    lease = DeviceLease("cpu", 1, wait_s=30, observer=recorder, batch=1, defer_s=30)
    first, go = threading.Event(), threading.Event()
    threads = [_holding(lease, "exclusive", "t0", first)]
    _wait_for(lambda: lease.holders() == (0, True))
    threads.append(_holding(lease, "shared", "c1", go))  # held back by t0's drain
    _wait_for(lambda: len(lease._queue) == 1)
    for index in (2, 3):  # the drain's batch (1 waiting + 1 joining) is full: these wait for a later drain
        threads.append(_holding(lease, "exclusive", f"t{index}", go))
        _wait_for(lambda: len(lease._queue) == index)
    first.set()
    go.set()
    for thread in threads:
        thread.join(10)
    holds = [e.holder for e in recorder.events if e.action == "hold"]
    assert holds == ["t0", "t2", "c1", "t3"], holds
    assert not recorder.broken


@pytest.mark.parametrize("batch", [1, 3])
def test_with_one_slot_the_lease_is_a_mutex(batch):
    lease = DeviceLease("cpu", 1, wait_s=30, batch=batch, defer_s=0.01)
    inside, most, count = [0], [0], threading.Lock()

    def worker(seed: int):
        rng = random.Random(seed)
        for _ in range(30):
            with getattr(lease, rng.choice(("shared", "exclusive")))(f"t{seed}"):
                with count:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(rng.random() * 0.001)
                with count:
                    inside[0] -= 1

    threads = [_start(worker, seed) for seed in range(8)]
    for thread in threads:
        thread.join(60)
    assert most[0] == 1 and lease.holders() == (0, False) and not lease._queue


def test_leases_are_released_when_the_block_raises_and_a_timed_out_waiter_leaves_the_queue():
    lease = DeviceLease("cpu", 2, wait_s=0.2)
    for kind in ("shared", "exclusive"):
        with pytest.raises(ZeroDivisionError):
            with getattr(lease, kind)("boom"):
                1 / 0
        assert lease.holders() == (0, False)
    release = threading.Event()

    def hold_long():
        with lease.shared("long"):
            release.wait(10)

    holder = _start(hold_long)
    while lease.holders() != (1, False):
        time.sleep(0.001)
    with pytest.raises(LeaseTimeout, match="timing lease for t1 was not granted within 0.2 s"):
        with lease.exclusive("t1"):
            pass
    # The timed-out timing request is gone: a shared one behind it is not held up.
    with lease.shared("after"):
        assert lease.holders() == (2, False)
    assert not lease._queue
    release.set()
    holder.join(10)


def test_a_thread_asking_for_a_second_lease_of_its_device_is_refused_at_once():
    lease = DeviceLease("cpu", 2)
    with lease.shared("outer"):
        with pytest.raises(RuntimeError, match="while holding one"):
            with lease.exclusive("inner"):
                pass
    assert lease.holders() == (0, False)


def test_no_sharing_is_the_check_as_it_always_ran():
    assert isinstance(phase(None, TIMING), type(device_share.contextlib.nullcontext()))
    sharing = Sharing(DeviceLease("cpu", 2))
    with pytest.raises(ValueError):
        phase(sharing, "build")
    assert sharing.provenance() == {"slots": 2, "mps": False, "mps_reason": ""}
    with pytest.raises(ValueError):
        DeviceLease("cpu", 0)


def test_share_gpu_is_validated():
    assert validate.shared_units(1, "local") == 1 and validate.shared_units(4, "local") == 4
    for bad in (0, -1, validate.MAX_SHARE_GPU + 1, True):
        with pytest.raises(InputError, match="--share-gpu"):
            validate.shared_units(bad, "local")
    with pytest.raises(InputError, match="--executor local"):
        validate.shared_units(2, "ray")
    assert validate.shared_units(1, "ray") == 1


# ---- the executor, with recorded phases -------------------------------------------------------------------------

@pytest.fixture
def no_probe(monkeypatch):
    """No probe worker for provenance: these tests start no process at all."""
    machine = {"gpu_model": None, "driver": None, "cuda": None, "torch": "test"}
    monkeypatch.setattr(provenance_module, "collect", lambda device: dict(machine))


def _recorded_phases(monkeypatch, log: list, lock: threading.Lock):
    """runner's phases replaced by recorders of (unit, phase, start, end); the lease around them is the real one."""

    def record(context, name: str, seconds: float):
        started = time.monotonic()
        time.sleep(seconds)
        with lock:
            log.append((context.submission.id + "/" + context.protocol.name, name, started, time.monotonic()))

    def correctness(context, secret):
        record(context, CORRECTNESS, 0.3)
        return runner._base_verdict(context, Status.PASSED)

    def timed(context, verdict, *args):
        record(context, TIMING, 0.1)
        return verdict

    def kernelbench(context):
        record(context, "kernelbench", 0.1)
        return runner._base_verdict(context, Status.PASSED)

    monkeypatch.setattr(runner, "_correctness_isolated", correctness)
    monkeypatch.setattr(runner, "_time_isolated", timed)
    monkeypatch.setattr(runner, "_check_kernelbench", kernelbench)


def _shared_run(tmp_path, protocols, name: str) -> tuple[list, list, Recorder]:
    entries = load_entries(write_run(tmp_path / name, HONEST))
    recorder = Recorder(slots=2)
    executor = LocalExecutor(["cpu"], CheckOptions(device="cpu"), BuildPlan(1, 1), share=2)
    executor.observer = recorder
    with Store(tmp_path / f"{name}.sqlite") as store:
        summary = rescore_module.rescore(entries, protocols, store, run_id=name, devices=["cpu"],
                                         options=CheckOptions(device="cpu"), executor=executor)
        verdicts = [v for _, v in store.verdicts()]
        run = store.runs()[-1]
    assert (summary.evaluated, summary.errors) == (4 * len(protocols), ())
    assert {v.status for v in verdicts} == {Status.PASSED}
    assert all(v.provenance["device_share"] == {"slots": 2, "mps": False, "mps_reason": "not a GPU",
                                                **({"alone": True} if name == "oom" and v.submission == "tanh" else {})}
               for v in verdicts)
    assert run["provenance"]["device_share"]["slots"] == 2
    assert not recorder.broken and executor.sharing == {}  # the session ended with the run
    return verdicts, recorder.events, recorder


def _overlaps(log: list) -> list:
    return [(a, b) for a in log for b in log if a is not b and a[2] < b[3] and b[2] < a[3]]


def test_correctness_of_two_units_overlaps_and_every_timing_phase_is_alone(tmp_path, monkeypatch, no_probe):
    log, lock = [], threading.Lock()
    _recorded_phases(monkeypatch, log, lock)
    _shared_run(tmp_path, [VERIFIED], "verified")
    overlapping = _overlaps(log)
    assert any(a[1] == b[1] == CORRECTNESS for a, b in overlapping), "no two correctness phases overlapped"
    alone = [(a, b) for a, b in overlapping if TIMING in (a[1], b[1])]
    assert not alone, f"a timing phase shared the device: {alone[0]}"
    assert [e[1] for e in log].count(TIMING) == 4

    # The original protocol's one job checks and times: timing, so never beside anything either.
    log.clear()
    _shared_run(tmp_path, [ORIGINAL, VERIFIED], "both")
    alone = [(a, b) for a, b in _overlaps(log) if {TIMING, "kernelbench"} & {a[1], b[1]}]
    assert not alone, f"a timing phase shared the device: {alone[0]}"
    assert [e[1] for e in log].count("kernelbench") == 4 and [e[1] for e in log].count(TIMING) == 4


def test_share_one_takes_no_lease(tmp_path, monkeypatch, no_probe):
    log, lock = [], threading.Lock()
    _recorded_phases(monkeypatch, log, lock)
    seen = []
    original_phase = device_share.phase
    monkeypatch.setattr(device_share, "phase", lambda sharing, *a: seen.append(sharing) or original_phase(sharing, *a))
    entries = load_entries(write_run(tmp_path / "run", {"1_ReLU": HONEST["1_ReLU"]}))
    with Store(tmp_path / "store.sqlite") as store:
        rescore_module.rescore(entries, [VERIFIED], store, run_id="one", devices=["cpu"],
                               options=CheckOptions(device="cpu"))
        (verdict,) = [v for _, v in store.verdicts()]
    assert seen == [None, None] and "device_share" not in verdict.provenance


def test_a_unit_that_ran_out_of_memory_beside_others_is_evaluated_again_alone(tmp_path, monkeypatch, no_probe):
    log, lock = [], threading.Lock()
    _recorded_phases(monkeypatch, log, lock)
    recorded = runner._correctness_isolated
    failed = []

    def correctness(context, secret):
        verdict = recorded(context, secret)
        if context.submission.id == "tanh" and not failed:
            failed.append(context.options.sharing.alone)
            return dataclasses.replace(verdict, status=Status.RUNTIME_ERROR,
                                       message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
        return verdict

    monkeypatch.setattr(runner, "_correctness_isolated", correctness)
    verdicts, _, _ = _shared_run(tmp_path, [VERIFIED], "oom")
    tanh = [e for e in log if e[0] == "tanh/verified" and e[1] == CORRECTNESS]
    assert failed == [False] and len(tanh) == 2
    assert not [(a, b) for a, b in _overlaps(log) if tanh[1] in (a, b)], "the second run was not alone"
    assert [v.provenance["device_share"].get("alone") for v in verdicts if v.submission == "tanh"] == [True]
    assert device_share.ran_out_of_memory("runtime_error", "CUDA out of memory")
    assert not device_share.ran_out_of_memory("incorrect", "out of memory")


# ---- a real rescore -------------------------------------------------------------------------------------------

def _statuses(source, store, share: int) -> dict:
    jobs.run_rescore(source, fmt="auto", tasks=None, store_path=store, protocols="original,verified",
                     samples="first", report_dir=None, device="cpu", hidden_dirs=[],
                     timeout_s=float(WORKER_TIMEOUT_S), protocol_overrides=FAST, share_gpu=share)
    with Store(store) as opened:
        return {(v.submission, v.protocol): v.status for _, v in opened.verdicts()}


@pytest.mark.slow
def test_a_rescore_sharing_the_device_reaches_the_statuses_of_one_at_a_time(tmp_path):
    source = write_run(tmp_path / "run", {**HONEST, "1_ReLU": RELU_IDENTITY})
    alone = _statuses(source, tmp_path / "alone.sqlite", 1)
    shared = _statuses(source, tmp_path / "shared.sqlite", 2)
    assert shared == alone and len(alone) == 8
    assert alone["relu", "verified"] is Status.INCORRECT and alone["double", "verified"] is Status.PASSED


def test_the_options_carry_the_lease_without_changing_what_they_compare_as():
    options = CheckOptions(device="cpu")
    shared = dataclasses.replace(options, sharing=Sharing(DeviceLease("cpu", 2)))
    assert shared == options and "sharing" not in repr(shared)


def test_a_gpu_session_asks_for_mps_and_says_why_it_runs_without(monkeypatch, no_probe):
    executor = LocalExecutor(["cuda:0", "cuda:1"], CheckOptions(device="cuda:0"), BuildPlan(1, 1), share=2)
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-cuda-mps-control (kbverify.harness.mps is tested on its own)
    with executor.session():
        sharing = executor.sharing
        assert set(sharing) == {"cuda:0", "cuda:1"} and sharing["cuda:0"].lease is not sharing["cuda:1"].lease
        assert executor.provenance("cuda:1")["device_share"] == {
            "slots": 2, "mps": False, "mps_reason": "no nvidia-cuda-mps-control on PATH"}
        assert sharing["cuda:0"].correctness_env == ()
    monkeypatch.setenv("KBVERIFY_MPS", "off")
    with executor.session():
        assert executor.sharing["cuda:0"].mps_reason == "KBVERIFY_MPS=off"
    # Threads beyond the slots wait for timing holding no process, so a batch of timing requests gathers while
    # every slot still checks correctness (device_share.threads_for).
    assert executor.sharing == {} and executor.workers == 2 * device_share.threads_for(2) == 16

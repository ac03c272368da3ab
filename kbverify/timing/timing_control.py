"""The parent's side of interleaved timing: it commands the rounds, keeps the record, and bounds what it is told.

The worker that times runs submission code, so nothing it writes is the record (SPEC §4, §5): the parent decides
each round's order and every call's input seed, sends one side's batch at a time, and takes that batch's times
only as they come back, with its own monotonic clock around the batch. Device times that sum to more than that
wall time are a forgery. The time the parent saw that a side's own times do not account for (the harness's per-
call work, the device-side hold, the messages) is the same for both sides of an honest kernel; a candidate whose
times leave much more unexplained than the reference's (its times shrunk, or the reference's inflated, or its
host work longer than the hold) is timed by the parent's clock instead, with the warning
`device_time_unconfirmed`. Which calls are checked against the reference is chosen here after each batch, once the
worker has copied every output: the worker writes the chosen copies whole into a folder this process owns, and
the check runs in a process without submission code (kbverify.worker.timing_check).
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field

from kbverify.core import stats
from kbverify.core.rules import DEFAULT_RULES, Rules
from kbverify.timing import process_tree

CALLS_PER_SIDE = 3
MAX_ROUNDS = 2000
STALE_CHECKS = 24
MIN_STALE_CHECKS = 3
STALE_BYTES = 2 << 30  # the most the reservoir's copies may hold on disk, where that leaves MIN_STALE_CHECKS


class TimingForged(Exception):
    """The worker's times cannot be what it measured (they exceed the parent's own clock)."""


class Reservoir:
    """Which candidate calls are checked against the reference: the last batch's, and a uniform sample of
    STALE_CHECKS over every call (Algorithm R: the n-th call enters with probability STALE_CHECKS/n, in place of a
    uniformly chosen member). Evicting a random member whenever a call came in kept only the last ~80 calls, so
    a kernel could cheat for most of the run and be honest at the end. Chosen here, after the worker committed."""

    def __init__(self, rng: random.Random):
        self.rng, self.seen, self.capacity = rng, 0, STALE_CHECKS
        self.sample: dict[int, dict] = {}
        self.recent: dict[int, dict] = {}

    def offer(self, index: int) -> bool:
        """Whether call `index` enters the sample (then `keep` it once revealed)."""
        self.seen += 1
        return len(self.sample) < self.capacity or self.rng.randrange(self.seen) < self.capacity

    def keep(self, index: int, entry: dict) -> list:
        """Keep call `index`; returns the members it replaced (their copies are no longer needed)."""
        evicted = []
        while len(self.sample) >= self.capacity:
            evicted.append(self.sample.pop(sorted(self.sample)[self.rng.randrange(len(self.sample))]))
        self.sample[index] = entry
        return evicted

    def keep_recent(self, index: int, entry: dict) -> None:
        self.recent[index] = entry

    @property
    def kept(self) -> dict[int, dict]:
        return {**self.sample, **self.recent}


@dataclass
class Driven:
    """What the parent recorded of a timing worker's rounds."""

    rounds: list = field(default_factory=list)
    checks: list = field(default_factory=list)  # chosen candidate calls: call, seed, distribution, file, signature
    forged: str = ""  # why the worker's replies cannot be true ("" if they can)
    stopped: str = ""  # why the rounds ended early ("" when the stopping rule or the budget ended them)
    failed_side: str = ""  # whose worker forged or stopped: "ref" (a process without submission code) or "cand"
    serve_s: float = 0.0


KINDS = ("device", "host")  # behind the device-side hold; without it, each call synchronised (two clocks, SPEC §5)


def kinds_for(device: str, mode: str) -> tuple:
    """Both kinds of batch on a GPU. A CPU has no hold, so there the two kinds are one measurement: only the device
    kind runs (the rounds a budget buys stay as many), unless a mode is asked for, which runs both (tests)."""
    return KINDS if device.startswith("cuda") or mode != "auto" else ("device",)


def side_key(side: str, kind: str, suffix: str = "ms") -> str:
    """Where a round keeps one side's times of one kind: `ref_ms` and `ref_wall_ms` for the device kind (as rounds
    were kept before there were two kinds), `ref_host_ms` and `ref_host_wall_ms` for the host kind."""
    return f"{side}_{suffix}" if kind == "device" else f"{side}_host_{suffix}"


def drive(workers, *, budget_s: float, target_half_width: float, deadline: float, min_rounds: int = 10,
          max_rounds: int = MAX_ROUNDS, check: bool = True, distributions=("x1",), kinds=KINDS,
          outdir: str | None = None, rules: Rules = DEFAULT_RULES) -> Driven:
    """Command the rounds of the timing workers (`workers`: side → a kbverify.harness.sandbox running child; a side's
    batches go to its own worker, so the reference's are timed in a process that never ran submission code).
    Stops on the stopping rule, the budget, the deadline, or a worker that stops answering; never raises for a
    worker's sake.

    Every round has one batch per side and kind, in an order drawn here; every call of a round draws the round's
    distribution (the correctness sets' own, in turn from a random start), so both sides of a round are timed on
    like values and no timed call can be told from a checked one by its values. `outdir`: the folder the worker
    writes the chosen calls' copies to (checking needs one). `rules`: the protocol's (its reply slack)."""
    check = check and outdir is not None
    rng = random.Random(int.from_bytes(os.urandom(16), "little"))
    driven = Driven()
    if not _warmed_up_in_turn(workers, deadline, driven):
        _end(workers)
        return driven
    reservoir, calls, spent = Reservoir(rng), {"ref": 0, "cand": 0, "last_cand": None}, {"digest_s": 0.0}
    checking = _Checking(reservoir, outdir) if check else None
    distributions = tuple(distributions) or ("x1",)
    first_distribution = rng.randrange(len(distributions))
    started = time.monotonic()
    while len(driven.rounds) < max_rounds:
        batches = [(kind, side) for kind in _shuffled(kinds, rng) for side in _shuffled(("ref", "cand"), rng)]
        distribution = distributions[(first_distribution + len(driven.rounds)) % len(distributions)]
        entry = {"order": [side for kind, side in batches if kind == kinds[0]], "batches": batches,
                 "distribution": distribution}
        if not _round(workers, batches, distribution, rng, entry, calls, checking, deadline, rules, spent, driven):
            break
        driven.rounds.append(entry)
        deciding = time.monotonic()
        # the digests and the hand-over of the chosen copies are the check's cost, not the rounds': they buy no
        # precision. A large output's copies cut the rounds of an A/A to one (0.67x, H100); the digests cut a
        # device-synchronising kernel's from 32 to 4 (GPU corpus honest/scale_shift_relu_cuda_device_sync).
        elapsed = deciding - started - spent["digest_s"] - (checking.spent_s if checking is not None else 0.0)
        stop = all(stats.should_stop(paired_rounds(driven.rounds, kind), elapsed_s=elapsed, budget_s=budget_s,
                                     target_half_width=target_half_width, min_rounds=min_rounds)
                   for kind in kinds) or no_time_for_another_round(elapsed, len(driven.rounds), budget_s)
        entry["between_ms"] = (time.monotonic() - deciding) * 1e3  # this process's own work between rounds
        if stop:
            break
    last = calls.get("last_cand")
    if check and last is not None and not driven.forged and not driven.stopped:  # a stopped worker hands nothing
        try:  # the last calls are always checked: a kernel cannot turn honest for the end alone
            _reveal(workers["cand"], last[0], last[1], checking, deadline, everything=True, distribution=last[2])
        except (TimingForged, TimeoutError) as error:
            driven.forged, driven.failed_side = driven.forged or str(error), driven.failed_side or "cand"
    _end(workers)
    driven.serve_s = time.monotonic() - started
    driven.checks = [{"call": index, **entry} for index, entry in sorted(reservoir.kept.items())]
    return driven


def _warmed_up_in_turn(workers, deadline: float, driven: Driven) -> bool:
    """Every worker loaded (the submission built), then each warmed up alone: no load or warm-up runs beside
    another worker's warm-up, whose hold probe decides the timing mode (kbverify.timing.timing_modes). False (and why,
    on `driven`) when a worker never got there."""
    steps = [(side, child, "loaded", None) for side, child in _distinct(workers)]
    steps += [(side, child, "ready", {"op": "warm"}) for side, child in _distinct(workers)]
    for side, child, awaited, first in steps:
        if first is not None:
            _send(child, first)
        if _reply(child, awaited, deadline) is None:
            driven.stopped, driven.failed_side = _silence(child, "the worker never became ready to time"), side
            return False
    return True


def _round(workers, batches, distribution, rng, entry, calls, checking, deadline, rules, spent, driven) -> bool:
    """One round's batches, each to its side's worker; False (and why, on `driven`) when a worker forged or
    stopped."""
    for kind, side in batches:
        # nothing of the candidate's runs while the reference's batch does (kbverify.timing.process_tree)
        paused = _stop(workers["cand"]) if side == "ref" and workers["ref"] is not workers["cand"] else []
        try:
            _batch(workers[side], side, kind, distribution, rng, entry, calls,
                   checking if side == "cand" else None, deadline, rules.reply_slack_ms, spent)
        except TimingForged as error:
            driven.forged, driven.failed_side = str(error), side
            return False
        except TimeoutError as error:
            driven.stopped, driven.failed_side = str(error), side
            return False
        finally:
            process_tree.resume(paused)
    return True


def _stop(child) -> list[int]:
    pid = getattr(getattr(child, "process", None), "pid", None)
    return process_tree.stop(pid) if isinstance(pid, int) else []


def _distinct(workers) -> list:
    """(side, worker) for each distinct worker, in side order: one process may serve both sides."""
    seen, out = set(), []
    for side in ("ref", "cand"):
        if id(workers[side]) not in seen:
            seen.add(id(workers[side]))
            out.append((side, workers[side]))
    return out


def _end(workers) -> None:
    for _, child in _distinct(workers):
        _send(child, {"op": "end"})


def _shuffled(items, rng: random.Random) -> list:
    items = list(items)
    rng.shuffle(items)
    return items


def paired_rounds(rounds: list, kind: str = "device") -> list:
    """(reference times, candidate times) of one kind, per round that has both, each batch evened (`evened`)."""
    ref, cand = side_key("ref", kind), side_key("cand", kind)
    return [(evened(r[ref]), evened(r[cand])) for r in rounds if r.get(ref) and r.get(cand)]


def evened(times: list) -> list:
    """A batch's calls, each credited with the batch's mean: the batch's whole time is what it cost, however the
    forward spread it over its calls. Per call, a first call that computed the whole batch's outputs (its inputs
    are drawn before the first call) and two that returned them read [3T, ~0, ~0], whose median is ~0: a red
    team's 5.3x for a 1x matmul. The raw times stay in the record."""
    mean = sum(times) / len(times)
    return [mean] * len(times)


def no_time_for_another_round(elapsed_s: float, rounds_done: int, budget_s: float) -> bool:
    """The budget is a cap: no round starts that would, at the mean pace so far, end past it. (Stopping only once
    the budget was spent let the last round overrun it: 2.6 s of timing against 2 s on the H200.)"""
    return elapsed_s + elapsed_s / max(1, rounds_done) > budget_s


def run(workers: dict, *, timeout_s: float, device: str, env: dict | None = None,
        keep_dir: bool = False, budget_s: float, target_half_width: float, check: bool = True,
        distributions=("x1",), hang=None, kinds=KINDS, outdir: str | None = None, rules: Rules = DEFAULT_RULES):
    """Timing workers whose rounds this process commands, one per side (`workers`: side → (job, payload)),
    started together and driven in the same rounds: ({side: outcome}, Driven). Each worker serves its own side
    only (`payload["sides"]`); only the candidate's may write to `outdir`."""
    from kbverify.harness.sandbox import ChildSpec, run_children

    holder: dict = {}
    sides = ("ref", "cand")
    specs = [ChildSpec(workers[side][0], {**workers[side][1], "sides": [side]}, timeout_s, device, env, keep_dir,
                       hang=hang, writable=(outdir,) if outdir and side == "cand" else ()) for side in sides]

    def converse(children: list) -> None:
        running = dict(zip(sides, children))
        holder["driven"] = drive(running, budget_s=budget_s, target_half_width=target_half_width,
                                 deadline=min(child.started for child in children) + timeout_s, check=check,
                                 distributions=distributions, kinds=kinds, outdir=outdir, rules=rules)

    outcomes = run_children(specs, conversation=converse)
    return dict(zip(sides, outcomes)), holder.get("driven") or Driven(stopped="never driven")


@dataclass
class _Checking:
    """The reservoir of checked calls, the folder their copies are written to (this process's own), the digests
    sent with the batches' times, and the seconds spent handing copies over."""

    reservoir: Reservoir
    outdir: str
    digests: dict = field(default_factory=dict)  # call → the digest of its copy, as sent with the batch's times
    spent_s: float = 0.0


def _batch(child, side: str, kind: str, distribution: str, rng: random.Random, entry: dict, calls: dict,
           checking: "_Checking | None", deadline: float, slack_ms: float, spent: dict) -> None:
    seeds = [rng.getrandbits(32) for _ in range(CALLS_PER_SIDE)]
    first = calls[side]
    asked = time.monotonic()
    _send(child, {"op": "batch", "side": side, "kind": kind, "check": checking is not None})
    if _reply(child, "prepared", deadline) is None:
        raise TimeoutError(_silence(child, f"the worker stopped answering before the {side} batch"))
    # This clock holds the batch's draws, its calls and the harness's copy of each output, with the collector
    # off; the seeds come only now, so nothing in the worker knew them off the clock
    # (kbverify.worker.timing_rounds._batch).
    sent = time.monotonic()
    _send(child, {"op": "go", "seeds": seeds, "distributions": [distribution] * len(seeds)})
    settled = _reply(child, "settled", deadline)
    settled_at = time.monotonic()
    timed = _reply(child, "timed", deadline) if settled is not None else None
    wall_ms = (time.monotonic() - sent) * 1e3
    # the digests are made between `settled` and `timed`: inside the batch's wall (work hidden there is
    # unexplained time like any other), out of the budget, which buys rounds, not digests
    entry[side_key(side, kind, "digest_ms")] = (time.monotonic() - settled_at) * 1e3
    spent["digest_s"] += time.monotonic() - settled_at
    if timed is not None and checking is not None:
        # every output of the batch is copied and its digest sent by now: the calls to check are chosen only now
        revealing = time.monotonic()
        digests = timed.get("digests") if isinstance(timed.get("digests"), dict) else {}
        checking.digests.update({int(k): v for k, v in digests.items() if str(k).isdigit()})
        _reveal(child, seeds, first, checking, deadline, distribution=distribution)
        entry[side_key("reveal", kind)] = (time.monotonic() - revealing) * 1e3
        checking.spent_s += time.monotonic() - revealing
    reply = _reply(child, "batch", deadline) if timed is not None else None
    if reply is None:
        raise TimeoutError(_silence(child, f"the worker stopped answering during the {side} batch"))
    entry[side_key(side, kind, "span_ms")] = (time.monotonic() - asked) * 1e3  # draws and checks included
    times = reply.get("times_ms")
    if (not isinstance(times, list) or len(times) != len(seeds) or reply.get("side") != side
            or timed.get("times_ms") != times
            or reply.get("batch_kind", "device") != kind
            or not all(_finite_positive(t) for t in times) or reply.get("first_call") != first):
        raise TimingForged(f"the {side} batch's reply is not one the harness sends: {str(reply)[:200]}")
    if sum(times) > wall_ms + slack_ms:
        raise TimingForged(f"the {side} batch claimed {sum(times):.3f} ms of calls in {wall_ms:.3f} ms of the "
                           "parent's own clock")
    calls[side] += len(seeds)
    entry[side_key(side, kind)] = [float(t) for t in times]
    entry[side_key(side, kind, "wall_ms")] = wall_ms
    if isinstance(reply.get("sm_clock_mhz"), (int, float)):
        entry["sm_clock_mhz"] = reply["sm_clock_mhz"]
    if checking is not None:
        calls["last_cand"] = (seeds, first, distribution)


def _reveal(child, seeds: list, first: int, checking: _Checking, deadline: float, *, everything: bool = False,
            distribution: str = "x1") -> None:
    """Ask for the copies of the batch's calls the reservoir takes (all of them: `everything`). What comes back
    is the candidate process's word; what this process keeps of it is the file's name, which it finds in its own
    folder (the check reads the file whole, bounded), and the call's seed, which it chose."""
    reservoir = checking.reservoir
    indices = [first + offset for offset in range(len(seeds))]
    if not everything:
        reservoir.capacity = _capacity(checking.outdir, reservoir)
    wanted = indices if everything else [index for index in indices if reservoir.offer(index)]
    _send(child, {"op": "reveal", "calls": wanted})  # sent when empty too: the worker waits for it
    revealed = _reply(child, "reveal", deadline)
    if revealed is None:
        raise TimeoutError(_silence(child, "the worker stopped answering while handing over its outputs"))
    shown = revealed.get("calls") if isinstance(revealed.get("calls"), dict) else {}
    for index in wanted:
        kept = {"seed": seeds[index - first], "distribution": distribution, "digest": checking.digests.get(index),
                **_copy_entry(shown.get(str(index)), index, checking.outdir)}
        for evicted in (reservoir.keep_recent if everything else reservoir.keep)(index, kept) or ():
            if evicted.get("file"):
                _remove(os.path.join(checking.outdir, evicted["file"]))


def _capacity(outdir: str, reservoir: Reservoir) -> int:
    """How many calls the reservoir keeps: STALE_CHECKS, fewer where the copies kept so far (their files' sizes as
    this process saw them when each was handed over: the folder stays the worker's to write) would hold more than
    STALE_BYTES, never fewer than MIN_STALE_CHECKS: a 1 GB output's 24 copies took 24 GB of disk."""
    sizes = [e["bytes"] for e in reservoir.sample.values() if isinstance(e.get("bytes"), int) and e["bytes"] > 0]
    if not sizes:
        return reservoir.capacity
    return max(MIN_STALE_CHECKS, min(STALE_CHECKS, STALE_BYTES // max(sizes)))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _copy_entry(shown, index: int, outdir: str) -> dict:
    """What the check is given of one chosen call: its copy's file and signature; or why there is none, as the
    worker's own fault (`missing`) or the machine's (`infrastructure_error`, never charged to the kernel; only
    out of memory and a failed write are, and the parent sees the folder)."""
    name = f"timed-{index}.pt"
    if isinstance(shown, dict) and isinstance(shown.get("infrastructure_error"), str):
        return {"infrastructure_error": shown["infrastructure_error"][:300]}
    if (not isinstance(shown, dict) or shown.get("file") != name or not isinstance(shown.get("signature"), list)
            or not os.path.isfile(os.path.join(outdir, name))):
        return {"missing": "the worker handed over no copy of this call's output"}
    return {"file": name, "signature": shown["signature"], "bytes": _size(os.path.join(outdir, name))}


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _send(child, command: dict) -> None:
    try:
        child.send(command)
    except (OSError, ValueError):
        pass


def _reply(child, op: str, deadline: float) -> dict | None:
    """The next reply of this kind; None if the worker closed its channel, the deadline passed, or the worker made
    no progress for longer than its hang budget allows (kbverify.harness.hang: the parent's own clock)."""
    while True:
        message = _take(child, op)
        if message is not None:
            return message
        left = deadline - time.monotonic()
        # The stall check reads in what has arrived, which may be this very reply: it is looked for again before
        # waiting, or the wait ran its full second for a message that had come (a batch's clock then held a
        # 1 s stall: an honest ReLU on a CPU read 0.06x, its rounds cut to a handful).
        if left <= 0 or _stalled(child):
            return _take(child, op)
        message = _take(child, op)
        if message is not None:
            return message
        if not child.read(min(left, 1.0)):
            return _take(child, op)


def _take(child, op: str) -> dict | None:
    for index, message in enumerate(child.messages.replies):
        if message.get("op") == op:
            return child.messages.replies.pop(index)
    return None


def _stalled(child) -> bool:
    stalled = getattr(child, "stalled", None)
    return bool(stalled()) if callable(stalled) else False


def _silence(child, what: str) -> str:
    """Why the worker's answer never came, in words; a worker that stalled past its hang budget says so."""
    if _stalled(child):
        return f"{what}: {child.stall_text()}"
    return what


def _finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def net_wall_rounds(rounds: list, kind: str = "device") -> list:
    """The rounds with the candidate's times taken from the parent's clock: per round, its batch's wall per call
    less the harness's own time per call, as the reference's batch of the same round and kind shows it, and never
    less than the candidate's own claim. (The clean process cannot bound that share: its harness differed from
    the one beside the candidate by up to 0.2 ms a call on the H200, against shrinks of microseconds.) The reference keeps
    its reported times (what the clean process checks). The raw wall per call holds the harness's work, about
    1.5 ms a call on the H200, on both sides: a 6.3x kernel read 1.12x by it, a 0.55x one 0.94x."""
    ref, cand = side_key("ref", kind), side_key("cand", kind)
    ref_wall, cand_wall = side_key("ref", kind, "wall_ms"), side_key("cand", kind, "wall_ms")
    out = []
    for r in rounds:
        if not (r.get(ref) and r.get(cand) and ref_wall in r and cand_wall in r):
            continue
        harness = (r[ref_wall] - sum(r[ref])) / len(r[ref])
        net = r[cand_wall] / len(r[cand]) - max(harness, 0.0)
        out.append((list(r[ref]), [max(net, t) for t in r[cand]]))
    return out


def wall_rounds(rounds: list, kind: str = "device") -> list:
    """The rounds as the parent's clock saw them: per-call wall time of each side's batch of one kind."""
    ref, cand = side_key("ref", kind), side_key("cand", kind)
    ref_wall, cand_wall = side_key("ref", kind, "wall_ms"), side_key("cand", kind, "wall_ms")
    return [([r[ref_wall] / len(r[ref])] * len(r[ref]), [r[cand_wall] / len(r[cand])] * len(r[cand]))
            for r in rounds if r.get(ref) and r.get(cand) and ref_wall in r and cand_wall in r]

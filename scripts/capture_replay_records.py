"""Capture, once, the raw evidence the judge decides from in real CPU runs, for the replay tier (issue 33).

Each case below runs `kbverify.harness.runner.check` for real (worker processes, sandbox, timing). While it runs, the
judge's entry points the runner calls are wrapped (from here only: this is a capture tool, not product code) so
that what they receive is written down, with what they decided:

- `isolated`: the candidate's and the judge's worker records as `kbverify.core.evidence.from_child` gets them, the input
  plan, the static scan, the parent's own look at the hand-over folder and the kept-axes note (replayed through
  from_child, merge_set_records, build_record, decide_isolated and with_kept_axes);
- `death`: the ChildOutcome of a child that did not report (replayed through `kbverify.judge.death`);
- `kernelbench`: the original protocol's one evaluation record (replayed through `decide_kernelbench`);
- `timing`: the verdict with its raw timing record, as `decide_timing` gets it;
- `rejudge`: the verdict `check` returned, where `rejudge` decides it again from its sets (not one it leaves as
  stored).

The records go to tests/unit/judge/data/cpu_replay_records.json.gz, which
tests/unit/judge/test_replayed_cpu_records.py replays in seconds with no worker process. Run it again only when a
worker's record format changes (then the replay tier says which records no longer decide as captured):

    python3 scripts/capture_replay_records.py            # under a minute on 2 cores

The records name the commit they were taken at, and the package's uncommitted changes if any: take them from a
clean checkout (`git worktree add`, with PYTHONPATH set to it) while others have work in progress.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import kbverify.core.evidence as evidence_module  # noqa: E402
import kbverify.harness.runner as runner_module  # noqa: E402
import kbverify.judge as judge_package  # noqa: E402
from kbverify.core.protocols import ORIGINAL, VERIFIED, Protocol  # noqa: E402
from kbverify.core.status import Status  # noqa: E402
from kbverify.core.submissions import load_submission, make_submission  # noqa: E402
from kbverify.core.tasks import load_task, parse_task  # noqa: E402
from kbverify.harness.runner import CheckOptions, check  # noqa: E402
from kbverify.judge.rejudge import _VERDICT_LEVEL, rejudge_verdict  # noqa: E402

OUT = REPO / "tests" / "unit" / "judge" / "data" / "cpu_replay_records.json.gz"
CORPUS = REPO / "tests" / "corpus"
RELU_TASK = REPO / "tasks" / "basic" / "level1" / "1_ReLU.py"

_HEAD = "import torch\nimport torch.nn as nn\n\n"
_INPUTS = "\nbatch_size = 16\ndim = 64\n\ndef get_inputs():\n    return [torch.rand(batch_size, dim)]\n\n" \
          "def get_init_inputs():\n    return []\n"


def _module(cls: str, body: str) -> str:
    return (_HEAD + f"class {cls}(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            + body)


# A reference that is NaN wherever it is evaluated: no input set can judge anything.
NAN_TASK = _module("Model", "    def forward(self, x):\n        return torch.log(-x.abs() - 1.0)\n") + _INPUTS
NAN_KERNEL = _module("ModelNew", "    def forward(self, x):\n        return torch.log(-x.abs() - 1.0)\n")
# A reference that refuses rows longer than the task's: the larger hidden shapes keep `dim` at its size.
ROWS_TASK = _module("Model", "    def forward(self, x):\n        if x.shape[1] > 64:\n            raise ValueError("
                    "'rows of at most 64')\n        return torch.relu(x)\n") + _INPUTS
ROWS_KERNEL = _module("ModelNew", "    def forward(self, x):\n        return torch.clamp_min(x, 0.0)\n")
# Right on the first call of each set, half the answer on the second: the output depends on the call, not the input.
EVERY_SECOND_CALL_HALVED = _module(
    "ModelNew", "        self.calls = 0\n\n    def forward(self, x):\n        self.calls += 1\n"
                "        out = torch.relu(x)\n        return out if self.calls % 2 else out * 0.5\n")
# tests/test_fp16_warning.py's pair: the reference overflows on the wide set, the kernel runs in half precision.
SIGMOID_TASK = _module("Model", "    def forward(self, x):\n        return torch.exp(x) / (1 + torch.exp(x))\n") \
    + _INPUTS.replace("dim = 64", "dim = 256")
SIGMOID_FP16 = _module("ModelNew", "    def forward(self, x):\n        return torch.sigmoid(x.half()).float()\n")

FAST = {"device_warmup_s": 0.0, "timing_budget_s": 0.2}
LENIENT = VERIFIED.with_overrides(name="verified-shape-lenient", shape_specialized_fails=False, **FAST)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str  # what it is captured for
    task: object  # a path, or (source, name)
    submission: object  # a path, or a source
    protocol: Protocol
    measure_speed: bool = False
    timeout_s: float = 60.0


CASES = [
    Case("compile_error: the file does not parse", RELU_TASK, CORPUS / "faults/syntax_error.py",
         VERIFIED.with_overrides(**FAST)),
    Case("compile_error under original", RELU_TASK, CORPUS / "faults/syntax_error.py", ORIGINAL),
    Case("crashed: os._exit in forward", RELU_TASK, CORPUS / "faults/os_exit_in_forward.py",
         VERIFIED.with_overrides(**FAST)),
    Case("crashed under original", RELU_TASK, CORPUS / "faults/os_exit_in_forward.py", ORIGINAL),
    Case("timeout: forward never returns", RELU_TASK, CORPUS / "faults/infinite_loop.py",
         VERIFIED.with_overrides(**FAST), timeout_s=15.0),
    Case("exploit:output_alias", RELU_TASK, CORPUS / "exploits/relu_returns_input_alias.py",
         VERIFIED.with_overrides(**FAST)),
    Case("shape_mismatch: a list that answers like a tensor", RELU_TASK,
         CORPUS / "exploits/relu_returns_a_list_that_answers_like_a_tensor.py", VERIFIED.with_overrides(**FAST)),
    Case("exploit:nondeterministic: every second call halved", RELU_TASK, EVERY_SECOND_CALL_HALVED,
         VERIFIED.with_overrides(**FAST)),
    Case("namespace_rebind under original", REPO / "tasks/basic/level2/2_Gemm_ReLU_BiasAdd.py",
         CORPUS / "exploits/namespace_rebind_batch_size.py", ORIGINAL),
    Case("fp16_path, timed: the wide set is invalid for the task", (SIGMOID_TASK, "1_NaiveSigmoid"), SIGMOID_FP16,
         VERIFIED.with_overrides(**FAST), measure_speed=True),
    Case("no_valid_input_sets: the reference is NaN everywhere", (NAN_TASK, "1_NaNEverywhere"), NAN_KERNEL,
         VERIFIED.with_overrides(**FAST)),
    Case("hidden_axes_kept: the reference refuses longer rows", (ROWS_TASK, "1_ShortRows"), ROWS_KERNEL,
         VERIFIED.with_overrides(**FAST)),
    Case("shape_specialized warning: a protocol that does not fail it", RELU_TASK,
         CORPUS / "exploits/relu_shape_guard_fastpath.py", LENIENT),
]


class Recorder:
    """Wraps the judge's entry points as the runner reaches them (`judge.X`, `evidence.from_child`,
    `runner.decide_timing`) and writes down what each received and decided."""

    def __init__(self, protocols: dict):
        self.protocols = protocols  # key → Protocol.to_dict(), shared by every record
        self.records: list[dict] = []
        self.case = ""
        self._children: dict[str, dict] = {}
        self._isolated: dict = {}
        self._protocol: Protocol | None = None  # the case's, for the isolated record (with_kept_axes has none)
        self._saved: list = []

    def install(self) -> None:
        self._wrap(evidence_module, "from_child", self._from_child)
        self._wrap(judge_package, "death", self._death)
        self._wrap(judge_package, "merge_set_records", self._merge)
        self._wrap(judge_package, "decide_isolated", self._decide_isolated)
        self._wrap(judge_package, "with_kept_axes", self._with_kept_axes)
        self._wrap(judge_package, "decide_kernelbench", self._kernelbench)
        self._wrap(runner_module, "decide_timing", self._timing)

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def _wrap(self, owner, name: str, make) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, make(original))

    def protocol_key(self, protocol: Protocol) -> str:
        self.protocols.setdefault(protocol.name, protocol.to_dict())
        assert self.protocols[protocol.name] == protocol.to_dict(), f"two protocols named {protocol.name}"
        return protocol.name

    def add(self, kind: str, protocol: Protocol | None, evidence: dict, status: Status, warnings) -> None:
        self.records.append({"case": self.case, "kind": kind,
                             "protocol": self.protocol_key(protocol) if protocol is not None else None,
                             "evidence": _plain(evidence),
                             "expect": {"status": status.value, "warnings": list(warnings)}})

    def _from_child(self, original):
        def from_child(record, *, ran_submission, source, schema):
            self._children[source] = {"record": record, "ran_submission": ran_submission}
            return original(record, ran_submission=ran_submission, source=source, schema=schema)
        return from_child

    def _death(self, original):
        def death(outcome, party):
            status, detail = original(outcome, party)
            self.add("death", None, {"outcome": dataclasses.asdict(outcome), "party": party}, status, ())
            return status, detail
        return death

    def _merge(self, original):
        def merge_set_records(plan, candidate_evidence, judge_evidence, protocol):
            self._isolated = {"plan": [s.to_dict() for s in plan],
                              "candidate": self._children["the candidate's worker"],
                              "judge": self._children["the judge's worker"]}
            return original(plan, candidate_evidence, judge_evidence, protocol)
        return merge_set_records

    def _decide_isolated(self, original):
        def decide_isolated(sets, candidate_evidence, static, build, protocol, observed=None):
            self._isolated.update(static=dataclasses.asdict(static),
                                  observed=observed.plain() if observed is not None else None)
            return original(sets, candidate_evidence, static, build, protocol, observed)
        return decide_isolated

    def _with_kept_axes(self, original):
        def with_kept_axes(decided, note):
            out = original(decided, note)
            self.add("isolated", self._protocol, {**self._isolated, "kept_axes": note}, out.status, out.warnings)
            return out
        return with_kept_axes

    def _kernelbench(self, original):
        def decide_kernelbench(record, static, protocol):
            out = original(record, static, protocol)
            self.add("kernelbench", protocol, {"record": record, "static": dataclasses.asdict(static)},
                     out.status, out.warnings)
            return out
        return decide_kernelbench

    def _timing(self, original):
        def decide_timing(verdict, protocol):
            out = original(verdict, protocol)
            self.add("timing", protocol, {"verdict": verdict.to_dict()}, out.status, out.warnings)
            return out
        return decide_timing


def _plain(value):
    """JSON's own types, recursively (tuples as lists)."""
    return json.loads(json.dumps(value))


def _rejudged_from_its_sets(verdict) -> bool:
    """`rejudge` decides this verdict again from its sets (it leaves a verdict decided elsewhere as stored: a
    build, a crash, a timeout, a tamper; such a replay would compare the stored status with itself)."""
    return (bool(verdict.sets) and verdict.status not in _VERDICT_LEVEL
            and (verdict.status is Status.PASSED or any(s.status is not Status.PASSED for s in verdict.sets)))


def run_case(case: Case, recorder: Recorder) -> str:
    if isinstance(case.task, tuple):
        task = parse_task(case.task[0], name=case.task[1], level=1, problem_id=1)
    else:
        task = load_task(case.task)
    if isinstance(case.submission, Path):
        submission = load_submission(case.submission)
    else:
        submission = make_submission(case.submission, id=case.name.split(":")[0].replace(" ", "_") + ".py")
    recorder.case, recorder._protocol = case.name, case.protocol
    options = CheckOptions(device="cpu", timeout_s=case.timeout_s, measure_speed=case.measure_speed)
    verdict = check(task, submission, case.protocol, options)
    if case.protocol.isolated and _rejudged_from_its_sets(verdict):
        again = rejudge_verdict(verdict, case.protocol)
        recorder.add("rejudge", case.protocol, {"verdict": verdict.to_dict()}, again.status, again.warnings)
    return f"{verdict.status.value} {list(verdict.warnings)}"


def _provenance() -> dict:
    import torch

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()

    # the package's uncommitted changes, if any: the records are then those of a tree no commit names
    return {"commit": git("rev-parse", "HEAD"), "package_changes": git("status", "--porcelain", "--", "kbverify"),
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "device": "cpu"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", help="capture the cases whose name contains this text")
    args = parser.parse_args(argv)
    protocols: dict = {}
    recorder = Recorder(protocols)
    recorder.install()
    try:
        for case in CASES:
            if args.only and args.only not in case.name:
                continue
            print(f"{case.name}: {run_case(case, recorder)}", flush=True)
    finally:
        recorder.uninstall()
    data = {"version": 1, "captured": _provenance(), "protocols": protocols, "records": recorder.records}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt", compresslevel=9) as out:
        json.dump(data, out, separators=(",", ":"), sort_keys=True)
    print(f"{len(recorder.records)} records, {args.out.stat().st_size} bytes: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

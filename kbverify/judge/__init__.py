"""The judge: the only code that assigns a status. Evidence (kbverify.core.evidence) and a protocol (with its rules,
kbverify.core.rules) in, a verdict out, by the same functions for `check`, `rescore` and `rejudge`. Pure: nothing here
imports torch, the child side, or anything that starts a process, so a verdict can be decided again from a store
on any machine (tests/unit/judge replays every stored GPU store).

- `sets`: each input set, then the sets together (correctness of the isolated protocols);
- `timing`: the timing verdict (speedup, interval, clocks, timing guards), with `confirmation` (whether the
  parent's clock confirms the worker's times) and `timed_outputs` (the check of the timed outputs);
- `deaths`: children that did not report, and timing that ended early;
- `kernelbench`: the original protocol's one record;
- `build`: what ran (build record, code-path warnings, isolation);
- `rejudge`: stored verdicts under another protocol's rules.

What the runner still finds out itself needs a process: whether a worker starts on this machine at all (a probe,
before `death` may blame a child that died without a phase), and whether a failed build is the machine's
(`kbverify.harness.toolchain`). The runner asks; these rules decide.
"""

from kbverify.judge.build import build_record, code_path_warnings, isolation
from kbverify.judge.deaths import (death, died_starting_up, reference_death, timed_failure, unloadable_entry,
                                   untimed_reference)
from kbverify.judge.kernelbench import (KernelbenchDecision, decide_kernelbench, kernelbench_status,
                                        kernelbench_timing_error, speedup_of)
from kbverify.judge.sets import (SET_WARNINGS, Decision, aggregate_sets, decide_isolated, decide_set, decide_sets,
                                 judge_infrastructure, merge_set_records, reproducer, unrun_set, with_kept_axes)
from kbverify.judge.timing import sides_view

__all__ = ["SET_WARNINGS", "Decision", "KernelbenchDecision", "aggregate_sets", "build_record", "code_path_warnings",
           "death", "decide_isolated", "decide_kernelbench", "decide_set", "decide_sets", "died_starting_up",
           "isolation", "judge_infrastructure", "kernelbench_status", "kernelbench_timing_error", "merge_set_records",
           "reference_death", "reproducer", "sides_view", "speedup_of", "timed_failure", "unloadable_entry", "unrun_set",
           "untimed_reference", "with_kept_axes"]

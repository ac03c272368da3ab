"""`kbverify audit`: find tasks whose reference makes a score meaningless before they inflate one (SPEC §6).

One sandboxed child per task (`kbverify.worker.audit_worker`, started by `kbverify.audit.run`) runs the reference over seeds × distributions × both
weight regimes (× hidden shapes) and returns raw numbers; `kbverify.audit.judge` applies the thresholds, so thresholds
are data, written into every report, and a partial file can be re-judged under other thresholds.

Flags (codes are stable; evidence and the threshold used are recorded with each):
  constant_output                 output identical (within constant_atol + constant_rtol·max|out|) across every
                                  seed and distribution of one weight regime, default or re-randomised
  near_zero:<protocol>            returning zeros passes the protocol's own check on all its sets
  trivially_passable:<k>:<p>      null kernel k passes protocol p: ones, input (the input itself, where a
                                  single output has an input's shape), other_seed (another seed's output),
                                  other_seed_mean (that output's mean everywhere), bf16, fp16 (the reference
                                  computed in that precision). The TF32 reference is no null kernel: the
                                  verified rule accepts a candidate as accurate as its TF32 baseline by design.
  uniform_axis                    some axis (size > 1) of an output has no variation on any set of a regime
  mostly_zero / mostly_mean       > 70% of elements within atol of 0 / of the output's mean, on every set the
                                  task draws itself (x1, default weights, its own shapes) — METR's rules
  dead_input / dead_parameter     perturbing it leaves the output unchanged (zero-gradient candidates from one
                                  backward pass, confirmed by perturbation on several seeds)
  stochastic                      two runs with the same seeds, reseeded before each call, disagree
  nonfinite:<distribution>        the reference raises or goes non-finite there: that distribution is invalid
                                  for the task (recorded under invalid_distributions, never held against kernels)
  timing_degenerate               GPU only: reference median below timing_min_us, where launch overhead dominates

Which flags make a task degenerate (excluded), per protocol p:
  - always: constant_output, stochastic, and nonfinite on the task's own inputs (x1, default weights, its own
    shapes) — no honest comparison is possible there;
  - under p: near_zero:p, and trivially_passable:{ones, other_seed, other_seed_mean}:p — kernels that ignore
    their input pass, so the task measures nothing under p;
  - under p: the input itself passes p's rule on *every* audited distribution (an identity in substance, like a
    1×1 max-pool). Passing only p's own sets (ReLU on `torch.rand` inputs under original) is what the
    distributions exist to catch, so it is reported, not excluded.
Only reported: uniform_axis, mostly_zero, mostly_mean (heuristics; the null kernels decide), dead_input,
dead_parameter (a bias before a training-mode BatchNorm is an algebraic simplification, not a degenerate task),
nonfinite on other distributions, trivially_passable via bf16/fp16 (a tolerance matter), timing_degenerate.
A task is `degenerate` when it is degenerate under any audited protocol; `exclusions_by_protocol` keeps the
finer answer.
"""

from kbverify.audit.judge import assess, task_identifier
from kbverify.audit.partial import finished_keys, merge_partials, settings_fingerprint
from kbverify.audit.protocols import (covers, every_distribution, judged_protocols, read_by_mostly,
                                      resolve_protocols, with_identity_variants)
from kbverify.audit.records import (ALWAYS_DEGENERATE, FORMAT, INPUT_INDEPENDENT_KERNELS, NEAR_ATOLS, NULL_KERNELS,
                                    REPORTED_ONLY, AuditReport, AuditSettings, AuditThresholds, TaskAudit)
from kbverify.audit.report import audit_to_json_summary, load_exclusions, render_markdown, write_report
from kbverify.audit.run import audit_tasks, worker_payload

__all__ = ["ALWAYS_DEGENERATE", "FORMAT", "INPUT_INDEPENDENT_KERNELS", "NEAR_ATOLS", "NULL_KERNELS", "REPORTED_ONLY",
           "AuditReport", "AuditSettings", "AuditThresholds", "TaskAudit", "assess", "audit_tasks",
           "audit_to_json_summary", "covers", "every_distribution", "finished_keys", "judged_protocols",
           "load_exclusions", "merge_partials", "read_by_mostly", "render_markdown",
           "resolve_protocols", "settings_fingerprint", "task_identifier", "with_identity_variants", "worker_payload",
           "write_report"]

"""The audit's shortcuts change no verdict: the null-kernel screen only retires a kernel that the full comparison
would reject, the comparison's fast paths give the plain computation's numbers bit for bit, the chunked
reductions give the whole-tensor ones, and a re-randomised family replayed from the default one is recorded as
running it would have been. Each is checked against the work it replaces, on kernels just inside and just
outside every tolerance."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kbverify.judge import correctness
from kbverify.worker import audit_dead, audit_tensors, audit_worker
from kbverify.audit import (AuditSettings, AuditThresholds, assess, judged_protocols, resolve_protocols,
                            with_identity_variants)
from kbverify.core.protocols import KBV, ORIGINAL, VERIFIED
from kbverify.core.tasks import load_task
from kbverify.judge.correctness import EXACT_AVAILABLE, ExactEvidence, certainly_rejects, judge_set, screen, summarize
from kbverify.worker.exact import moved_spread, summarize_within_moved

PROTOCOLS = [ORIGINAL, KBV, VERIFIED]
HEADER = "import torch\nimport torch.nn as nn\n\n\n"


# ---- the comparison's fast paths against the plain computation ----------------------------------------------

def _plain_summary(ref, cand, chunk):
    """`correctness._summarize_tensor` as it was before its shortcuts (identical chunks, isfinite through the
    maximum, counts skipped above the largest ratio, the quantile through topk): the numbers they must keep."""
    grid_tols, quantile_tols = correctness.TOLERANCE_GRID, correctness._QUANTILE_TOLERANCES
    summary = {"ref_shape": list(ref.shape), "cand_shape": list(cand.shape), "ref_dtype": str(ref.dtype),
               "cand_dtype": str(cand.dtype), "numel": ref.numel()}
    ref_flat, cand_flat = ref.reshape(-1), cand.reshape(-1)
    numel = ref_flat.numel()
    step = max(1, numel // correctness._QUANTILE_SAMPLE)
    totals = {"nonfinite_mismatch": 0, "ref_nonfinite": 0, "ref_max_abs": 0.0, "ref_sq": 0.0, "diff_sq": 0.0,
              "max_abs_diff": -1.0, "worst": None}
    grid = {repr(t): {"max_ratio": 0.0, "over": 0, "samples": []} for t in grid_tols}
    for start in range(0, numel, chunk):
        r = ref_flat[start:start + chunk].to(torch.float64)
        c = cand_flat[start:start + chunk].to(torch.float64)
        if not (bool(torch.isfinite(r).all()) and bool(torch.isfinite(c).all())):
            ref_finite, cand_finite = torch.isfinite(r), torch.isfinite(c)
            nonfinite_equal = (r == c) | (torch.isnan(r) & torch.isnan(c))
            totals["nonfinite_mismatch"] += int(torch.count_nonzero((ref_finite != cand_finite)
                                                                    | (~ref_finite & ~nonfinite_equal)))
            totals["ref_nonfinite"] += int(torch.count_nonzero(~ref_finite))
            both = ref_finite & cand_finite
            r, c = torch.where(both, r, 0.0), torch.where(both, c, 0.0)
        diff = (c - r).abs()
        magnitude = r.abs()
        totals["ref_max_abs"] = max(totals["ref_max_abs"], float(magnitude.max()))
        totals["ref_sq"] += float(torch.dot(r, r))
        totals["diff_sq"] += float(torch.dot(diff, diff))
        local = int(diff.argmax())
        if float(diff[local]) > totals["max_abs_diff"]:
            totals["max_abs_diff"] = float(diff[local])
            totals["worst"] = (start + local, float(r[local]), float(c[local]))
        scaled = diff / (1.0 + magnitude)
        largest = float(scaled.max())
        for tol in grid_tols:
            entry = grid[repr(tol)]
            entry["max_ratio"] = max(entry["max_ratio"], largest / tol)
            entry["over"] += int(torch.count_nonzero(scaled > tol))
            if tol in quantile_tols:
                entry["samples"].append((scaled[(-start) % step::step] / tol).float())
    summary.update(nonfinite_mismatch=totals["nonfinite_mismatch"], ref_nonfinite=totals["ref_nonfinite"],
                   ref_max_abs=totals["ref_max_abs"], ref_norm=math.sqrt(totals["ref_sq"]),
                   diff_norm=math.sqrt(totals["diff_sq"]), max_abs_diff=max(totals["max_abs_diff"], 0.0))
    summary["norm_rel"] = correctness._norm_rel(summary["diff_norm"], summary["ref_norm"])
    summary["grid"] = {}
    for tol in grid_tols:
        entry = grid[repr(tol)]
        out = {"max_ratio": entry["max_ratio"], "frac_over": entry["over"] / numel if numel else 0.0}
        if tol in quantile_tols:
            values = torch.cat(entry["samples"]).reshape(-1)
            if values.numel() > correctness._QUANTILE_SAMPLE:
                values = values[:: values.numel() // correctness._QUANTILE_SAMPLE]
            k = max(1, min(values.numel(), math.ceil(0.999 * values.numel())))
            out["q999_ratio"] = float(torch.kthvalue(values.float().cpu(), k).values) if values.numel() else 0.0
        summary["grid"][repr(tol)] = out
    if totals["worst"] is not None:
        index, ref_value, cand_value = totals["worst"]
        summary["worst"] = {"index": correctness._unravel(index, list(ref.shape)), "ref": ref_value,
                            "cand": cand_value}
    return summary


def _pairs():
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(3, 1500, generator=generator)
    signed_zeros = x.clone()
    signed_zeros[0, :10] = 0.0
    flipped = signed_zeros.clone()
    flipped[0, :10] = -0.0  # equal to +0 element for element: the identical path, with the candidate's signs
    with_inf = x.clone()
    with_inf[1, 3] = math.inf
    with_nan = x.clone()
    with_nan[2, 7] = math.nan
    huge = torch.full((2, 700), 1e308, dtype=torch.float64)
    yield "random", x, x + 1e-3 * torch.randn(3, 1500, generator=generator)
    yield "identical", x, x.clone()
    yield "identical but one element", x, torch.where(torch.arange(4500).reshape(3, 1500) == 4100, x + 1, x)
    yield "signed zeros", signed_zeros, flipped
    yield "identical with inf", with_inf, with_inf.clone()
    yield "identical with NaN", with_nan, with_nan.clone()
    yield "inf against finite", x, with_inf
    yield "float64 overflow in the difference", huge, -huge
    yield "tiny differences (no count over any tolerance)", x, x + 1e-9
    yield "float16", x.half(), (x + 1e-2).half()
    yield "identical bfloat16", x.bfloat16(), x.bfloat16().clone()
    yield "integers", torch.arange(4500).reshape(3, 1500), torch.arange(4500).reshape(3, 1500) % 7
    yield "zeros against a tiny output", torch.softmax(x, dim=1) * 1e-3, torch.zeros_like(x)


@pytest.mark.parametrize("chunk", [1 << 25, 1000, 777])
def test_the_comparison_fast_paths_give_the_plain_numbers_bit_for_bit(chunk):
    for label, ref, cand in _pairs():
        fast = correctness._summarize_tensor(ref, cand, chunk)
        assert json.dumps(fast) == json.dumps(_plain_summary(ref, cand, chunk)), label


def test_the_quantile_sample_spans_chunks_and_the_quantile_is_the_same_order_statistic():
    generator = torch.Generator().manual_seed(3)
    ref = torch.randn(1 << 21, generator=generator)  # two samples per 4 elements: step 2, sample crosses chunks
    cand = ref + 1e-3 * torch.randn(1 << 21, generator=generator)
    cand[: 1 << 19] = ref[: 1 << 19]  # the first chunks identical: zeros in the sample from the fast path
    for chunk in (1 << 18, 3 * (1 << 17) + 1):
        fast = correctness._summarize_tensor(ref, cand, chunk)
        assert json.dumps(fast) == json.dumps(_plain_summary(ref, cand, chunk))


# ---- the screen against the full comparison ---------------------------------------------------------------

def _baseline(ref, relative):
    """A TF32-like baseline summary: every element off by `relative`."""
    return summarize(ref, ref * (1 + relative))


def _cases():
    """Candidates whose worst element sits just inside or just outside a protocol's element-wise tolerance, in
    the sample or between its elements, with and without a baseline allowance."""
    generator = torch.Generator().manual_seed(11)
    ref = torch.randn(64, 4096, generator=generator)  # 262144 elements: the screen samples every 4th
    step = max(1, ref.numel() // correctness.SCREEN_SAMPLE)
    for tol in (1e-2, 1e-3):
        for factor in (0.999999, 1.0, 1.000001, 1.5, 10.0, 1e6):
            for index in (0, 1, step * 1000, step * 1000 + 3, ref.numel() - 1):
                cand = ref.clone().reshape(-1)
                r = float(ref.reshape(-1)[index])
                cand[index] = r + factor * tol * (1 + abs(r))
                yield ref, cand.reshape(ref.shape)
    yield ref, torch.zeros_like(ref)
    yield ref, torch.ones_like(ref)
    yield ref, ref.bfloat16().float()
    yield ref, ref.half().float()
    yield ref, torch.where(ref > 3.5, math.inf, ref)
    yield ref * 1e-4, torch.zeros_like(ref)  # zeros on a tiny output: within every element-wise tolerance


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.name)
def test_the_screen_rejects_only_what_the_full_comparison_rejects(protocol):
    rejected = kept = 0
    for ref, cand in _cases():
        sample = screen(ref, cand)
        full = summarize(ref, cand)
        for baseline in (None, _baseline(ref, 1e-4), _baseline(ref, 3e-3)):
            if certainly_rejects(sample, baseline, protocol):
                assert judge_set(full, baseline, protocol)[0] != "passed"
                rejected += 1
            else:
                kept += 1
    assert rejected and kept  # both outcomes exercised


_CUSTOM = dataclasses.replace(VERIFIED, name="custom", atol=4e-3, rtol=4e-3, baseline_allowance=2.0)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), size=st.integers(1, 3 * correctness.SCREEN_SAMPLE),
       scale=st.sampled_from([1e-6, 1e-3, 1.0, 1e3]), error=st.sampled_from([1e-4, 1e-3, 5e-3, 1e-2, 2e-2, 1.0]),
       spikes=st.integers(0, 5), special=st.sampled_from([None, math.nan, math.inf, -math.inf]),
       chunk=st.sampled_from([None, 1000, 4097]), outputs=st.integers(1, 2),
       base_error=st.sampled_from([None, 1e-4, 3e-3, 3e-2]))
def test_the_screen_never_rejects_what_the_full_comparison_passes(seed, size, scale, error, spikes, special, chunk,
                                                                     outputs, base_error):
    """Random outputs, noise, isolated spikes anywhere (in the sample or between its elements), non-finite values
    on either side, chunked full comparisons, several outputs, with and without a baseline allowance: wherever
    `certainly_rejects` says so, `judge_set` on the full summary rejects, under every protocol."""
    generator = torch.Generator().manual_seed(seed)
    refs, cands = [], []
    for _ in range(outputs):
        ref = torch.randn(size, generator=generator) * scale
        cand = ref + error * (1 + ref.abs()) * (torch.rand(size, generator=generator) * 2 - 1)
        for _ in range(spikes):
            index = int(torch.randint(size, (1,), generator=generator))
            cand[index] = ref[index] + 10 * error * (1 + abs(float(ref[index])))
        if special is not None:
            index = int(torch.randint(size, (1,), generator=generator))
            (cand if seed % 2 else ref)[index] = special
        refs.append(ref)
        cands.append(cand)
    reference, candidate = (refs[0], cands[0]) if outputs == 1 else (tuple(refs), tuple(cands))
    baseline = None if base_error is None else summarize(
        reference, tuple(r * (1 + base_error) for r in refs) if outputs > 1 else refs[0] * (1 + base_error))
    sample = screen(reference, candidate)
    full = summarize(reference, candidate) if chunk is None else {
        "outputs": [correctness._summarize_tensor(r, c, chunk) for r, c in zip(refs, cands)]}
    for protocol in (*PROTOCOLS, _CUSTOM):
        if certainly_rejects(sample, baseline, protocol):
            assert judge_set(full, baseline, protocol)[0] != "passed", protocol.name


def test_a_kernel_just_outside_tolerance_is_screened_only_where_the_sample_sees_it():
    ref = torch.randn(64, 4096, generator=torch.Generator().manual_seed(5))
    step = ref.numel() // correctness.SCREEN_SAMPLE
    for index, seen in ((step * 10, True), (step * 10 + 1, False)):
        cand = ref.clone().reshape(-1)
        cand[index] += 1.01e-2 * (1 + abs(float(cand[index])))
        cand = cand.reshape(ref.shape)
        assert judge_set(summarize(ref, cand), None, ORIGINAL)[0] == "incorrect"
        assert certainly_rejects(screen(ref, cand), None, ORIGINAL) is seen
    inside = ref + 0.99e-2 * (1 + ref.abs())
    assert judge_set(summarize(ref, inside), None, ORIGINAL)[0] == "passed"
    assert not certainly_rejects(screen(ref, inside), None, ORIGINAL)


def test_the_allowance_keeps_a_kernel_as_accurate_as_its_baseline_from_the_screen():
    ref = torch.randn(64, 4096, generator=torch.Generator().manual_seed(6))
    cand = ref * (1 + 3e-3)  # three times the element limit, like a baseline three times over it
    assert certainly_rejects(screen(ref, cand), None, VERIFIED)
    baseline = _baseline(ref, 2e-3)
    assert not certainly_rejects(screen(ref, cand), baseline, VERIFIED)
    assert judge_set(summarize(ref, cand), baseline, VERIFIED)[0] == "passed"



@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), size=st.integers(1, 3 * correctness.SCREEN_SAMPLE),
       off=st.sampled_from([0.0, 1e-6, 1e-3, 1e-1, 10.0]), error=st.sampled_from([1e-4, 1e-3, 5e-3, 1e-2, 1.0]),
       toward=st.sampled_from([0.0, 0.5, 1.0]), spikes=st.integers(0, 3), tf32=st.booleans(),
       moved_off=st.sampled_from([None, 1e-7, 1e-3, 1e-1]))
def test_the_screen_never_rejects_what_float64_passes(seed, size, off, error, toward, spikes, tf32, moved_off):
    """With the float64 evidence (`screen` of the candidate against float64, the baselines against it): wherever
    `certainly_rejects` says so, `judge_set` rejects on the full summaries with `ExactEvidence`, although it
    passes candidates that only float64 finds right. The reference is `off` float64 by a relative amount, the
    candidate somewhere between them (`toward` float64) plus noise and spikes."""
    generator = torch.Generator().manual_seed(seed)
    truth = torch.randn(size, generator=generator, dtype=torch.float64)
    reference = truth + off * truth.abs().mean() * torch.randn(size, generator=generator, dtype=torch.float64)
    candidate = reference + toward * (truth - reference)
    candidate = candidate + error * (1 + truth.abs()) * (torch.rand(size, generator=generator, dtype=torch.float64)
                                                         * 2 - 1)
    for _ in range(spikes):
        index = int(torch.randint(size, (1,), generator=generator))
        candidate[index] = truth[index] + 10 * error * (1 + abs(float(truth[index])))
    baseline = reference * (1 + 3e-3) if tf32 else None
    tf32_error = None if baseline is None else summarize(reference, baseline)
    tf32_exact = None if baseline is None else summarize(truth, baseline)
    reference_error = summarize(truth, reference)
    # the float64 answer of data one rounding away, `moved_off` from float64 (a badly conditioned task: far)
    moved = None if moved_off is None else summarize_within_moved(truth, candidate, [moved_spread(
        truth, truth + moved_off * (1 + truth.abs()) * torch.randn(size, generator=generator, dtype=torch.float64))])
    exact = ExactEvidence(summarize(truth, candidate), tf32_exact, EXACT_AVAILABLE, moved)
    for protocol in (*PROTOCOLS, _CUSTOM):
        if certainly_rejects(screen(reference, candidate), tf32_error, protocol, reference_error,
                             screen(truth, candidate), tf32_exact, moved):
            assert judge_set(summarize(reference, candidate), tf32_error, protocol, reference_error,
                             exact)[0] != "passed", protocol.name


def test_the_screen_keeps_a_kernel_that_only_float64_finds_right():
    """A reference 5% off the exact answer: a candidate exact to float64 is far over every limit against it, and
    the screen would retire it on that alone; given the float64 evidence it keeps it, and `judge_set` passes it."""
    generator = torch.Generator().manual_seed(8)
    truth = torch.randn(64, 4096, generator=generator, dtype=torch.float64)
    reference = truth * (1 + 0.05 * torch.randn(64, 4096, generator=generator, dtype=torch.float64))
    candidate = truth.clone()
    reference_error = summarize(truth, reference)
    assert certainly_rejects(screen(reference, candidate), None, VERIFIED, reference_error)
    assert not certainly_rejects(screen(reference, candidate), None, VERIFIED, reference_error,
                                 screen(truth, candidate))
    exact = ExactEvidence(summarize(truth, candidate), None, EXACT_AVAILABLE)
    assert judge_set(summarize(reference, candidate), None, VERIFIED, reference_error, exact)[0] == "passed"
    # kbv and original judge against the fp32 reference alone, float64 evidence or not
    assert certainly_rejects(screen(reference, candidate), None, KBV, reference_error, screen(truth, candidate))

# ---- chunked reductions in the worker --------------------------------------------------------------------

def test_chunked_statistics_equal_the_whole_tensor_ones(monkeypatch):
    x = torch.randn(37, 211, generator=torch.Generator().manual_seed(1)) * 0.02
    whole = audit_tensors._tensor_stats(x)
    monkeypatch.setattr(audit_tensors, "CHUNK_ELEMENTS", 1000)
    chunked = audit_tensors._tensor_stats(x)
    assert chunked.pop("mean") == pytest.approx(whole.pop("mean"), rel=1e-12)
    assert chunked == whole
    for bad in (math.nan, math.inf, -math.inf):
        y = x.clone()
        y[30, 5] = bad  # in a later chunk
        y[2, 2] = bad
        assert audit_tensors._tensor_stats(y)["nonfinite"] == 2
        assert "max_abs" not in audit_tensors._tensor_stats(y)


def test_chunked_norms_and_the_equal_fast_path(monkeypatch):
    generator = torch.Generator().manual_seed(2)
    a = [torch.randn(50, 97, generator=generator), torch.randn(7, generator=generator)]
    b = [a[0] + 1e-3 * torch.randn(50, 97, generator=generator), a[1].clone()]
    whole = audit_tensors._diff_norms(a, b)
    assert whole[2] == float((a[0] - b[0]).abs().max())
    monkeypatch.setattr(audit_tensors, "CHUNK_ELEMENTS", 300)
    assert audit_tensors._diff_norms(a, b) == pytest.approx(whole, rel=1e-12)
    assert audit_tensors._diff_norms(a, [t.clone() for t in a])[0::2] == (0.0, 0.0)
    assert audit_tensors._mean(a[0]) == pytest.approx(float(a[0].double().mean()), rel=1e-12)
    infinite = [torch.tensor([1.0, math.inf])]
    assert math.isnan(audit_tensors._diff_norms(infinite, [infinite[0].clone()])[2])  # inf − inf, as before


# ---- whole audits with and without the shortcuts ------------------------------------------------------------

def _task(forward: str, inputs: str, init: str = "pass") -> str:
    return (HEADER + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"        {init}\n\n    def forward(self, x):\n        {forward}\n\n\n"
            f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return []\n")


SHAPE = "[torch.randn(64, 4096)]"
TASKS = {
    # zeros and ones just inside and just outside original's 1e-2 (and kbv's 1e-3 at a hundredth of that)
    "1_Zeros_inside": _task("return 0.0099 * torch.tanh(x)", SHAPE),
    "2_Zeros_outside_rarely": _task("return 0.0102 * torch.tanh(x)", SHAPE),
    "3_Zeros_outside_off_sample": _task("y = 0.0099 * torch.tanh(x); y[0, 1] = 0.02; return y", SHAPE),
    "4_Ones_inside": _task("return 1 + 0.0099 * torch.tanh(x)", SHAPE),
    "5_Input_inside": _task("return x + 0.0099 * torch.tanh(x)", SHAPE),
    "6_Input_outside_rarely": _task("return x + 0.0102 * torch.tanh(x) * (1 + x.abs())", SHAPE),
    "7_Tiny_output": _task("return 1e-6 * torch.tanh(x)", SHAPE),
    "8_ReLU_rand": _task("return torch.relu(x)", "[torch.rand(64, 4096)]"),
    "9_Softmax": _task("return torch.softmax(x, dim=1)", SHAPE),
    "10_Linear": _task("return self.fc(x)", "[torch.randn(64, 256)]", init="self.fc = nn.Linear(256, 64)"),
    "11_Constant": _task("return torch.zeros_like(x) + 0.5", SHAPE),
    "12_Two_outputs": _task("return x.sum(dim=1), 0.0099 * torch.tanh(x)", SHAPE),
}


def _audit(task, protocols, *, shortcuts: bool = True) -> dict:
    """One task's worker record, in this process; without the shortcuts every kernel is tracked under every
    protocol, compared in full on every set, and every family is run, as before they existed."""
    settings = AuditSettings(hidden_shapes=False, seeds=2)
    judged = with_identity_variants(protocols, settings.distributions)
    payload = {"task_source": task.source, "task_name": task.name, "device": "cpu",
               "settings": settings.worker_dict(), "protocols": [p.to_dict() for p in judged],
               "committed_shapes": None}
    if shortcuts:
        payload["null_kernel_protocols"] = {
            kernel: sorted({p.name for base in protocols for p in judged_protocols(kernel, base, settings.distributions)})
            for kernel in settings.null_kernels}
    else:
        payload.update(null_screen=False, replay=False)
    return {"key": task.key, "raw": audit_worker.audit_job(payload), "wall_s": 0.0}


def _verdict(task, line, protocols):
    audit = assess(task, line, protocols=protocols, thresholds=AuditThresholds(),
                   distributions=AuditSettings().distributions)
    evidence = {k: v for k, v in audit.evidence.items() if k != "phase_s"}
    return audit.flags, audit.degenerate_under, json.dumps(evidence, sort_keys=True, default=str)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("screen") / "level1"
    root.mkdir()
    found = {}
    for name, source in TASKS.items():
        path = root / f"{name}.py"
        path.write_text(source)
        found[name] = load_task(path)
    return found


@pytest.mark.parametrize("name", list(TASKS))
def test_the_shortcuts_change_no_flag_and_no_evidence(tasks, name):
    protocols = resolve_protocols(PROTOCOLS)
    task = tasks[name]
    exact = _audit(task, protocols, shortcuts=False)
    fast = _audit(task, protocols)
    assert _verdict(task, fast, protocols) == _verdict(task, exact, protocols)
    # the raw sets, families and TF32 baselines too, bar the replayed family's note
    for line in (exact, fast):
        for family in line["raw"]["families"]:
            family["note"] = ""
    for key in ("sets", "families", "stochastic", "tf32"):
        assert fast["raw"][key] == exact["raw"][key], key


def test_the_near_threshold_tasks_land_on_both_sides(tasks):
    protocols = resolve_protocols(PROTOCOLS)
    flags = {name: set(_verdict(tasks[name], _audit(tasks[name], protocols), protocols)[0])
             for name in ("1_Zeros_inside", "2_Zeros_outside_rarely", "3_Zeros_outside_off_sample",
                          "4_Ones_inside", "6_Input_outside_rarely")}
    assert "near_zero:original" in flags["1_Zeros_inside"]
    assert "near_zero:original" not in flags["2_Zeros_outside_rarely"]
    assert "near_zero:original" not in flags["3_Zeros_outside_off_sample"]
    assert "trivially_passable:ones:original" in flags["4_Ones_inside"]
    assert "trivially_passable:input:original" not in flags["6_Input_outside_rarely"]


def test_a_weightless_deterministic_task_replays_and_a_weighted_one_runs(tasks):
    protocols = resolve_protocols(PROTOCOLS)
    softmax = _audit(tasks["9_Softmax"], protocols)["raw"]
    linear = _audit(tasks["10_Linear"], protocols)["raw"]
    assert softmax["families"][1]["note"].startswith("replayed")
    assert not linear["families"][1]["note"]


def test_the_wide_distribution_keeps_its_bits_with_one_temporary():
    from kbverify.core.inputs import WIDE_LARGE, WIDE_SMALL, _transform

    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        x = (torch.randn(300, 37, generator=torch.Generator().manual_seed(4)) * 10).to(dtype)
        x[0, :4] = torch.tensor([math.inf, math.nan, -0.0, -math.inf])
        for value in (x, x.t()):  # contiguous (in place) and not (as before)
            large = torch.rand(value.shape, generator=torch.Generator().manual_seed(9)) < 0.5
            before = torch.where(large, value * WIDE_LARGE, value * WIDE_SMALL)
            after = _transform(value, "wide", 9)
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[value.element_size()]
            assert torch.equal(after.contiguous().view(bits), before.contiguous().view(bits)), dtype
            assert after.stride() == before.stride()


def test_the_dead_check_does_not_import_sympy():
    """The dead check's gradient from a scalar loss: explicit gradients (backward(outputs, grad_tensors=r)) make
    torch import sympy for a shape check, a quarter of a second in every audit process."""
    import subprocess
    import sys

    program = """
import sys, torch
from kbverify.worker import audit_dead
before = "sympy" in sys.modules
model = torch.nn.Linear(8, 4)
class Context:
    device = torch.device("cpu")
    def __init__(self):
        self.model = model
    def inputs(self, meta):
        return [torch.randn(3, 8)]
found = audit_dead._gradient_sensitivity(Context(), {"seed": 1})
assert found["error"] == "", found
print(before or "sympy" not in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "True"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.5, 50_000.0), min_size=1, max_size=60), st.floats(1.0, 20_000.0),
       st.floats(0.5, 20_000.0))
def test_the_timing_flag_stops_early_only_when_the_full_median_is_decided(times_us, decided_us, threshold_us):
    from kbverify.worker.audit_worker import samples_until_decided

    planned = len(times_us)
    calls = iter(times_us)
    taken = samples_until_decided(lambda: next(calls), planned, decided_us)
    assert taken == times_us[:len(taken)]
    if len(taken) < planned:
        assert statistics.median(times_us) >= decided_us
        if threshold_us <= decided_us:  # the flag (median below the threshold) comes out as with every call
            assert (statistics.median(taken) < threshold_us) == (statistics.median(times_us) < threshold_us)
    assert samples_until_decided(lambda: 1e9, planned, None) == [1e9] * planned


# ---- the dead check's backward, held small ---------------------------------------------------------------------

def test_the_projection_drawn_again_gives_the_gradient_a_stored_projection_gives():
    o = torch.randn(3, 1000, requires_grad=True)
    stored = torch.Generator().manual_seed(5)
    r = torch.randn(o.shape, generator=stored)
    generator = torch.Generator().manual_seed(5)
    loss = audit_dead._Projection.apply(o, generator)
    loss.backward()
    assert torch.equal(o.grad, r)  # bit for bit: the gradient of ⟨o, r⟩ is r
    assert torch.allclose(loss, (o.detach() * r).sum())
    # the forward advanced the generator as a stored draw would: a second output gets the same r as before
    assert torch.equal(generator.get_state(), stored.get_state())


@pytest.mark.parametrize("forward, dead", [("x.mul_(2.0)\n        return x + self.bias", False),
                                           ("return x * 0.0 + self.bias", True)])
def test_the_dead_check_takes_gradients_also_when_the_reference_works_in_place_on_its_input(forward, dead):
    source = _task(forward, "[torch.randn(8, 16)]", init="self.bias = nn.Parameter(torch.ones(16))")
    from kbverify.core.tasks import parse_task
    from kbverify.worker.evaluate import shape_namespaces

    namespace = shape_namespaces(parse_task(source, name="1_InPlace"), [{"shape": "original", "overrides": {}}])
    found = audit_dead._dead_check(namespace["original"], AuditSettings().worker_dict(), torch.device("cpu"))
    assert found["gradient_error"] == ""
    (entry,) = found["inputs"]
    assert (entry["sensitivity"] == 0.0) is dead and entry["sensitivity"] is not None
    assert [p["name"] for p in found["parameters"]] == ["bias"] and found["parameters"][0]["sensitivity"] > 0


@pytest.mark.parametrize("forward", ["return torch.tanh(x) * 2 + self.bias",
                                     "x.data.mul_(3.0)\n        return x * 2 + self.bias",
                                     "x.data.mul_(3.0)\n        x.relu_()\n        return x * 2 + self.bias"])
def test_the_dead_check_reports_the_same_whether_the_model_gets_the_leaves_or_clones(monkeypatch, forward):
    """The leaves are the drawn inputs themselves; a model that writes to its input behind autograd's back must
    not change what is reported (each input's scale is taken before the model runs)."""
    from kbverify.core.tasks import parse_task
    from kbverify.worker.evaluate import shape_namespaces

    source = _task(forward, "[torch.randn(8, 16)]", init="self.bias = nn.Parameter(torch.ones(16))")

    def dead(namespace_source):
        namespace = shape_namespaces(parse_task(namespace_source, name="1_Scaled"),
                                     [{"shape": "original", "overrides": {}}])["original"]
        return audit_dead._dead_check(namespace, AuditSettings().worker_dict(), torch.device("cpu"))

    on_leaves = dead(source)
    original = audit_dead._forward_on_leaves

    def always_clones(context, meta, leaves, inputs):
        return original(context, meta, leaves, [leaf.clone() if leaf is not None else value
                                                for leaf, value in zip(leaves, inputs)])

    monkeypatch.setattr(audit_dead, "_forward_on_leaves", always_clones)
    on_clones = dead(source)
    assert on_leaves["inputs"][0]["sensitivity"] is not None
    assert json.dumps(on_leaves, sort_keys=True) == json.dumps(on_clones, sort_keys=True)


def test_the_fractions_are_taken_only_on_the_sets_the_mostly_rules_read(tasks):
    """judge._mostly reads the near-zero and near-mean fractions of the own shape's default-weight x1 sets alone;
    elsewhere the worker skips those passes, replayed families included, and every other statistic stays."""
    protocols = resolve_protocols(PROTOCOLS)
    for name in ("9_Softmax", "10_Linear"):  # a replayed re-randomised family and a run one
        raw = _audit(tasks[name], protocols)["raw"]
        read = [s for s in raw["sets"] if (s["shape"], s["weights"], s["distribution"]) == ("original", "default", "x1")]
        others = [s for s in raw["sets"] if s not in read]
        assert read and others and any(s["weights"] == "rerandomized" for s in others)
        for entry in read:
            assert all({"mean", "frac_near_zero", "frac_near_mean", "max_abs", "axis_range"} <= set(o)
                       for o in entry["outputs"])
        for entry in others:
            for stats in (o for o in entry["outputs"] if entry["valid"]):
                assert {"max_abs", "axis_range", "nonfinite"} <= set(stats)
                assert not {"mean", "frac_near_zero", "frac_near_mean"} & set(stats), entry["set_id"]


def test_each_phase_records_its_own_gpu_peak_and_the_task_peak_is_the_largest(monkeypatch):
    """The allocator's peaks are reset as each phase ends (CUDA calls stubbed: this runs on a CPU); the task's
    peak, which admission reads, must still be the largest of the phases' and what came after them."""
    held = {"allocated": 0, "reserved": 0, "max_allocated": 0, "max_reserved": 0}

    def use(allocated, reserved):
        held.update(allocated=allocated, reserved=reserved, max_allocated=max(held["max_allocated"], allocated),
                    max_reserved=max(held["max_reserved"], reserved))

    def reset(device):
        held.update(max_allocated=held["allocated"], max_reserved=held["reserved"])

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: held["max_allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: held["max_reserved"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    record = {"device": "cuda:0", "phase_s": {}}
    device = torch.device("cuda:0")
    use(5, 8)
    use(1, 2)
    audit_worker._end_phase(record, "sets:original:default", 0.0, device)
    use(3, 4)
    audit_worker._end_phase(record, "dead", 0.0, device)
    use(2, 6)
    finished = audit_worker._finish(record, type("Nulls", (), {"export": lambda self: {}})())
    assert finished["phase_peak_bytes"] == {"sets:original:default": {"allocated": 5, "reserved": 8},
                                            "dead": {"allocated": 3, "reserved": 4}}
    assert finished["peak_memory_bytes"] == {"allocated": 5, "reserved": 8}
    assert set(finished["phase_s"]) == {"sets:original:default", "dead"}
    on_cpu = audit_worker._finish({"device": "cpu", "phase_s": {}}, type("Nulls", (), {"export": lambda self: {}})())
    assert "peak_memory_bytes" not in on_cpu


def test_a_fatal_cuda_error_under_mps_is_an_infrastructure_error_and_evidence_without_it(monkeypatch):
    """Under MPS a fault reaches every client: the task's record cannot be trusted, so it is run again alone.
    On a GPU of its own the same error is the task's (its reference breaks the device) and stays evidence."""
    fatal = {"device": "cuda:0", "sets": [{"set_id": "original/x1/default/s0", "valid": False,
                                          "invalid_reason": "reference raised: RuntimeError: CUDA error: an illegal "
                                                            "memory access was encountered"}],
             "errors": [{"phase": "original/x1/default/s0", "error": "RuntimeError: CUDA error: an illegal memory "
                                                                     "access was encountered", "fatal": True}]}
    clean = {"device": "cuda:0", "sets": [{"set_id": "original/x1/default/s0", "valid": False,
                                          "invalid_reason": "non-finite output (timestamps, dumps)"}], "errors": []}
    monkeypatch.setattr(audit_worker, "_audit", lambda payload: payload["record"])
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    assert audit_worker.audit_job({"record": fatal}) is fatal
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/kbverify-mps/pipe")
    shared = audit_worker.audit_job({"record": fatal})
    assert set(shared) == {"infrastructure_error"} and "MPS" in shared["infrastructure_error"]
    assert audit_worker.audit_job({"record": clean}) is clean  # only fatal errors: the rest is evidence as before
    refused = {"device": "cuda:0", "sets": [], "errors": [{"phase": "load:original",
                                                            "error": "RuntimeError: CUDA error: MPS client failed to "
                                                                     "connect to the MPS control daemon"}]}
    assert "infrastructure_error" in audit_worker.audit_job({"record": refused})

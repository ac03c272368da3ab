"""Pure statistics over raw timing samples and per-task results; no torch, no device.

Everything here runs in the parent process on numbers the worker recorded, so a stored run can be re-judged
without a GPU. Times are in milliseconds; a speedup above 1 means the candidate is faster.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from kbverify.core.rules import DEFAULT_RULES

Round = tuple[Sequence[float], Sequence[float]]  # (reference times, candidate times) of one interleaved round

DEFAULT_NOISE_MARGIN = DEFAULT_RULES.default_noise_margin  # one number: the protocols' rules (kbverify.core.rules)


@dataclass(frozen=True)
class SpeedupEstimate:
    """Paired speedup of a candidate over its reference, with a confidence interval on the ratio scale."""

    speedup: float
    ci_low: float
    ci_high: float
    n_rounds: int
    method: str  # "order_statistic" | "order_statistic_ess" | "min_max"
    confidence: float = 0.95


def positive(value) -> bool:
    """A finite number above zero, as a speedup or a time must be to count: None, NaN, inf, 0 and text are not."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def median(values) -> float:
    """The median of the finite numbers among `values` (a bool is not one); NaN where there are none: a side with
    no usable time is missing evidence, not an error."""
    ordered = sorted(float(v) for v in values
                     if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
    if not ordered:
        return math.nan
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def median_ms(samples: Sequence[float]) -> float:
    return float(np.median(_positive_times(samples)))


def mean_ms(samples: Sequence[float]) -> float:
    """Arithmetic mean of trial times: what KernelBench reports as `runtime`."""
    return float(np.mean(_positive_times(samples)))


def mean_ratio_speedup(ref_times_ms: Sequence[float], cand_times_ms: Sequence[float]) -> float:
    """KernelBench's speedup: mean reference time over mean candidate time (no pairing, no interval)."""
    return mean_ms(ref_times_ms) / mean_ms(cand_times_ms)


def round_log_ratio(ref_times_ms: Sequence[float], cand_times_ms: Sequence[float]) -> float:
    """log(median(ref) / median(cand)) for one interleaved round; positive when the candidate is faster."""
    return math.log(median_ms(ref_times_ms)) - math.log(median_ms(cand_times_ms))


def paired_speedup(rounds: Sequence[Round], confidence: float = 0.95) -> SpeedupEstimate:
    """Speedup = exp(median of the per-round log-ratios), with a distribution-free CI for that median.

    The interval is the order-statistic (sign-test) interval: with randomised order inside each round the sign of
    each round's deviation from the true median is a fair coin whatever the noise does, so the interval is exact
    for any noise distribution and stays finite (degenerate) on constant samples, where a BCa bootstrap gives NaN.
    When the order is not randomised and the log-ratios are clearly autocorrelated, the ranks are chosen for the
    effective number of independent rounds instead (`order_statistic_ess`). With too few rounds for the requested
    confidence the interval falls back to the minimum and maximum (`min_max`).
    """
    if not rounds:
        raise ValueError("paired_speedup needs at least one round")
    return speedup_from_log_ratios(round_log_ratios(rounds), confidence)


def cap_side_medians(rounds: Sequence[Round], ref_ceiling_ms: float | None,
                     cand_ceiling_ms: float | None) -> tuple[list[Round], dict]:
    """The rounds with each side's samples scaled down, where their median is above that side's ceiling, so that
    the median is the ceiling (SPEC §5: no device time above the same side's host-inclusive time). Scaling keeps
    the samples' spread, so the interval keeps its width; a side at or under its ceiling is left as it is, and a
    missing or non-finite ceiling caps nothing. Returns (rounds, {side: factor}) for the sides that were capped."""
    factors = {}
    for index, (side, ceiling) in enumerate((("ref", ref_ceiling_ms), ("cand", cand_ceiling_ms))):
        samples = [t for r in rounds for t in r[index]]
        if not samples or ceiling is None or not math.isfinite(ceiling) or ceiling <= 0:
            continue
        median = median_ms(samples)
        if median > ceiling:
            factors[side] = ceiling / median
    ref_factor, cand_factor = factors.get("ref", 1.0), factors.get("cand", 1.0)
    capped = [([t * ref_factor for t in ref], [t * cand_factor for t in cand]) for ref, cand in rounds]
    return capped, factors


def round_log_ratios(rounds: Sequence[Round]) -> np.ndarray:
    """`round_log_ratio` of every round, vectorised when all blocks have one length (the usual case)."""
    try:
        times = np.asarray(rounds, dtype=float)
    except ValueError:  # ragged: blocks of different lengths
        times = None
    if times is None or times.ndim != 3 or times.shape[1] != 2 or times.shape[2] == 0:
        return np.array([round_log_ratio(ref, cand) for ref, cand in rounds])
    _positive_times(times)
    medians = np.median(times, axis=2)
    return np.log(medians[:, 0]) - np.log(medians[:, 1])


def speedup_from_log_ratios(log_ratios: Sequence[float], confidence: float = 0.95) -> SpeedupEstimate:
    """`paired_speedup` on per-round log-ratios already computed, in time order."""
    values = np.sort(np.asarray(log_ratios, dtype=float))
    if values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError("log-ratios must be a non-empty sequence of finite numbers")
    n = int(values.size)
    n_eff = _effective_rounds(np.asarray(log_ratios, dtype=float))
    rank = _median_ci_rank(n_eff, confidence)
    method = "order_statistic" if n_eff == n else "order_statistic_ess"
    if rank == 0:
        rank, method = 1, "min_max"
    elif n_eff != n:
        # The rank fraction valid for n_eff independent rounds, applied to the n observed ones.
        rank = max(1, math.floor(rank * n / n_eff))
    center = float(np.median(values))
    return SpeedupEstimate(
        speedup=math.exp(center),
        ci_low=math.exp(min(values[rank - 1], center)),
        ci_high=math.exp(max(values[n - rank], center)),
        n_rounds=n,
        method=method,
        confidence=confidence,
    )


def half_width(est: SpeedupEstimate) -> float:
    """Relative half-width of the CI on the ratio scale: the wider side, as a fraction of the estimate."""
    return max(est.ci_high / est.speedup - 1.0, 1.0 - est.ci_low / est.speedup)


def should_stop(
    rounds: Sequence[Round],
    *,
    elapsed_s: float,
    budget_s: float,
    target_half_width: float,
    min_rounds: int = 10,
    max_rounds: int | None = None,
    confidence: float = 0.95,
) -> bool:
    """Adaptive stopping: enough rounds and a precise enough estimate, or the time or round budget is spent.

    Precision is `projected_half_width`, not the half-width of the order-statistic interval alone: that width is
    noisy at small n and correlated with the interval missing, so stopping on it under-covers (92-95% for a
    nominal 95% in the coverage simulation); the spread-based projection keeps coverage at the nominal level.
    The interval that will be reported must be within the target too: on a GPU timed to the event resolution
    most rounds' ratios are identical, the MAD is zero and the projection alone stopped at the tenth round with
    an interval of ±1.5%.
    """
    if elapsed_s >= budget_s or (max_rounds is not None and len(rounds) >= max_rounds):
        return True
    if len(rounds) < min_rounds:
        return False
    log_ratios = round_log_ratios(rounds)
    if projected_half_width(log_ratios, confidence) >= target_half_width:
        return False
    return half_width(speedup_from_log_ratios(log_ratios, confidence)) < target_half_width


def projected_half_width(log_ratios: Sequence[float], confidence: float = 0.95) -> float:
    """Relative CI half-width the median's large-sample variance predicts: z·sqrt(pi/2)·sigma/sqrt(n_eff).

    sigma comes from the MAD of the log-ratios, so a few throttled rounds do not hold the run open.
    """
    values = np.asarray(log_ratios, dtype=float)
    if values.size == 0:
        return math.inf
    sigma = 1.4826 * float(np.median(np.abs(values - np.median(values))))
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    return math.expm1(z * math.sqrt(math.pi / 2.0) * sigma / math.sqrt(_effective_rounds(values)))


def instance_spread(log_differences: Sequence[float]) -> tuple[float, int]:
    """Standard deviation (log scale) of one model instance's own time offset, and its degrees of freedom, from
    log-differences of two independent instances of the same work (each difference's variance is twice the
    instance's).

    On an H200 two copies of the same reference, in one process or in two, differ by a fixed 0.3-5% for the whole
    run; interleaving cannot see it, since each copy keeps its offset from round to round, so it is missing from
    the paired interval, and a rerun landed outside that interval for a third of the kernels.
    """
    values = np.asarray(log_differences, dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return 0.0, 0
    return math.sqrt(float(np.mean(values**2)) / 2.0), int(values.size)


def widen_for_reruns(est: SpeedupEstimate, spread: float, dof: int) -> SpeedupEstimate:
    """The paired interval widened for what a rerun redraws: the reference's and the candidate's instance
    offsets, `spread` each (log scale), added in quadrature on each side. The spread comes from a couple of
    differences, so the quantile is Student's t with their degrees of freedom: with the normal quantile a 95%
    interval covered 88-92% in simulation."""
    if not (spread > 0 and dof > 0):
        return est
    from scipy import stats as _scipy_stats  # imported on use: it is most of the CLI's start-up time

    quantile = float(_scipy_stats.t.ppf(0.5 + est.confidence / 2.0, dof))
    extra = quantile * math.sqrt(2.0) * spread

    def side(bound: float) -> float:
        return math.hypot(abs(math.log(bound / est.speedup)), extra)

    return SpeedupEstimate(speedup=est.speedup, ci_low=est.speedup * math.exp(-side(est.ci_low)),
                           ci_high=est.speedup * math.exp(side(est.ci_high)), n_rounds=est.n_rounds,
                           method=est.method + "+instances", confidence=est.confidence)


def noise_margin_from_aa(
    aa: Sequence[SpeedupEstimate] | Sequence[Round], *, floor: float = DEFAULT_NOISE_MARGIN
) -> float:
    """Noise margin (relative) from A/A runs: the reference timed against itself.

    Takes the A/A estimates (or the rounds of one A/A run) and returns the smallest symmetric band around 1 that
    holds every A/A interval, never less than `floor`: anything inside it is indistinguishable from no change.
    """
    if len(aa) == 0:
        return floor
    estimates = aa if isinstance(aa[0], SpeedupEstimate) else [paired_speedup(aa)]
    reach = max(max(est.ci_high - 1.0, 1.0 - est.ci_low) for est in estimates)
    return max(floor, float(reach))


def classify_speed(est: SpeedupEstimate, margin: float) -> str:
    """`faster` / `slower` when the CI clears the noise band, `same` when it lies inside it, else `ambiguous`."""
    if est.ci_low > 1.0 + margin:
        return "faster"
    if est.ci_high < 1.0 - margin:
        return "slower"
    if est.ci_low >= 1.0 - margin and est.ci_high <= 1.0 + margin:
        return "same"
    return "ambiguous"


def fast_p(correct: Sequence[bool], speedups: Sequence[float | None], p: float) -> float:
    """Share of all rows that are correct with speedup strictly above p; failures stay in the denominator.

    An empty set scores 0, as KernelBench's `fastp` does.
    """
    return _share(_fast_indicators(correct, speedups, p))


def confident_fast_p(correct: Sequence[bool], ci_lows: Sequence[float | None], p: float) -> float:
    """Share of all rows that are correct with the lower CI bound of their speedup strictly above p."""
    return _share(_fast_indicators(correct, ci_lows, p))


def bootstrap_fast_p_ci(
    correct: Sequence[bool],
    speedups: Sequence[float | None],
    p: float,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of fast_p, resampling tasks; degenerate (finite) when every task agrees."""
    hits = _fast_indicators(correct, speedups, p)
    if hits.size == 0:
        return (0.0, 0.0)
    rng = np.random.default_rng(seed)
    resampled = hits[rng.integers(0, hits.size, size=(n_boot, hits.size))].mean(axis=1)
    low, high = _percentile_interval(resampled, confidence)
    center = float(hits.mean())
    return (min(low, center), max(high, center))


def geomean_speedup_ci(
    speedups_of_correct: Sequence[float],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float] | None:
    """Geometric-mean speedup of correct kernels and a percentile bootstrap CI over tasks; None when empty."""
    values = np.asarray(list(speedups_of_correct), dtype=float)
    if values.size == 0:
        return None
    if not np.all(np.isfinite(values) & (values > 0)):
        raise ValueError("geometric mean needs finite, positive speedups")
    logs = np.log(values)
    rng = np.random.default_rng(seed)
    resampled = logs[rng.integers(0, logs.size, size=(n_boot, logs.size))].mean(axis=1)
    low, high = _percentile_interval(resampled, confidence)
    center = float(logs.mean())
    return (math.exp(center), math.exp(min(low, center)), math.exp(max(high, center)))


def _positive_times(samples: Sequence[float]) -> np.ndarray:
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        raise ValueError("no timing samples")
    if not np.all(np.isfinite(values) & (values > 0)):
        raise ValueError("timing samples must be finite and positive (the worker floors them at the resolution)")
    return values


@functools.lru_cache(maxsize=4096)
def _median_ci_rank(n: int, confidence: float) -> int:
    """Largest rank r with P(x_(r) <= median <= x_(n+1-r)) >= confidence; 0 when even (min, max) falls short."""
    alpha = 1.0 - confidence
    # Coverage of [x_(r), x_(n+1-r)] is 1 - 2 * P(Binomial(n, 1/2) <= r - 1).
    from scipy import stats as _scipy_stats  # imported on use: it is most of the CLI's start-up time

    r = int(_scipy_stats.binom.ppf(alpha / 2.0, n, 0.5))
    while r >= 1 and 2.0 * _scipy_stats.binom.cdf(r - 1, n, 0.5) > alpha:
        r -= 1
    while 2.0 * _scipy_stats.binom.cdf(r, n, 0.5) <= alpha:
        r += 1
    return min(r, (n + 1) // 2)


def _effective_rounds(log_ratios: np.ndarray) -> int:
    """Rounds worth of independent information: fewer when lag-1 autocorrelation is clearly positive.

    Randomised order inside rounds makes the rounds' signs independent, so this normally returns n; it guards
    runs with a fixed order, where slow noise leaks into the ratios. Only an autocorrelation beyond the ~97.5%
    one-sided null quantile (2/sqrt(n)) counts, so independent rounds are rarely penalised.
    """
    n = int(log_ratios.size)
    if n < 8:
        return n
    centered = log_ratios - np.median(log_ratios)
    denominator = float(np.dot(centered, centered))
    if denominator == 0.0:
        return n
    rho = float(np.dot(centered[:-1], centered[1:])) / denominator
    if rho <= 2.0 / math.sqrt(n):
        return n
    rho = min(rho, 0.95)
    return max(2, math.floor(n * (1.0 - rho) / (1.0 + rho)))


def _fast_indicators(correct: Sequence[bool], values: Sequence[float | None], p: float) -> np.ndarray:
    if len(correct) != len(values):
        raise ValueError(f"{len(correct)} correctness flags but {len(values)} speedups")
    return np.array(
        [bool(ok) and value is not None and value > p for ok, value in zip(correct, values)], dtype=float
    )


def _share(hits: np.ndarray) -> float:
    return float(hits.mean()) if hits.size else 0.0


def _percentile_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = 1.0 - confidence
    low, high = np.quantile(values, [alpha / 2.0, 1.0 - alpha / 2.0])
    return (float(low), float(high))

"""The digest that commits each timed copy on the parent's clock (kbverify.worker.timing_sides.digest): equal for
equal bits, different for a one-ulp change anywhere, and not the sum of per-element terms that a few elements'
low bits could be nudged to match (corpus: matmul_forges_the_digest_after_the_choice)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kbverify.worker.timing_sides import digest, lane_digest


def _nudged(x: torch.Tensor, index: int) -> torch.Tensor:
    y = x.clone()
    y.view(-1)[index] = torch.nextafter(y.view(-1)[index], torch.tensor(float("inf"), dtype=x.dtype))
    return y


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5000), index=st.integers(0, 4999), seed=st.integers(0, 2**31 - 1))
def test_one_ulp_anywhere_changes_the_digest_on_both_paths(n, index, seed):
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    index %= n
    assert digest([x]) == digest([x.clone()])
    assert digest([x]) != digest([_nudged(x, index)])
    bits, nudged = x.view(torch.int32), _nudged(x, index).view(torch.int32)
    assert lane_digest(bits) == lane_digest(bits.clone()) != lane_digest(nudged)


def test_the_device_path_is_not_a_sum_of_its_elements():
    """Swapping two elements of one lane changes it (a sum would not); so do a value and its complement."""
    bits = torch.arange(1, 1 + 3 * (1 << 18), dtype=torch.int64)
    swapped = bits.clone()
    swapped[[0, 1 << 18]] = swapped[[1 << 18, 0]]  # the same lane, steps 0 and 1
    assert lane_digest(bits) != lane_digest(swapped)
    assert lane_digest(torch.tensor([5])) != lane_digest(torch.tensor([~5]))


def test_dtype_and_shape_are_part_of_the_digest():
    x = torch.arange(12, dtype=torch.int32)
    assert digest([x]) != digest([x.view(3, 4)]) != digest([x.view(torch.float32)])
    assert digest([None, torch.zeros(0)]) == [None, digest([torch.zeros(0)])[0]]


def test_the_fold_keeps_every_lane_in_the_digest():
    """Past 2**12 lanes the end states are folded: a change in any lane, either half, still changes it, and so
    does swapping two lanes' contents."""
    bits = torch.arange(1, 1 + (1 << 14), dtype=torch.int64)
    base = lane_digest(bits)
    for index in (0, (1 << 12) - 1, 1 << 12, (1 << 13) + 7, (1 << 14) - 1):
        changed = bits.clone()
        changed[index] += 1
        assert lane_digest(changed) != base, index
    swapped = bits.clone()
    swapped[[0, 1 << 13]] = swapped[[1 << 13, 0]]
    assert lane_digest(swapped) != base

"""Every step the harness takes on an output after a call accepts an inference tensor (a forward under
`torch.inference_mode`): the NaN fill, the copies and their comparison, the written copy, the hand-over and the
output guards. Corpus: honest/relu_under_inference_mode."""

import torch

from kbverify.worker import guards, output_handover
from kbverify.worker.timing_sides import _write, changed_since, output_signature, poison, snapshot


def _inference_output() -> torch.Tensor:
    with torch.inference_mode():
        return torch.relu(torch.randn(4, 5))


def test_poison_fills_an_inference_tensor_outside_inference_mode():
    out = _inference_output()
    assert out.is_inference() and not torch.is_inference_mode_enabled()
    poison([out])
    assert bool(torch.isnan(out).all())


def test_copies_of_an_inference_tensor_compare_and_are_written(tmp_path):
    out, slot = _inference_output(), []
    copies = snapshot([out], slot)
    assert not changed_since(copies, [out])
    again = snapshot([out], slot)  # the slot's buffer reused: copied into, not allocated
    assert again[0] is copies[0] and not changed_since(again, [out])
    poison([out])
    assert changed_since(copies, [out])
    _write(str(tmp_path / "copy.pt"), [out])
    assert output_signature([out]) == output_signature(copies)


def test_hand_over_and_guards_take_an_inference_tensor(tmp_path):
    out, inputs = _inference_output(), [torch.randn(4, 5)]
    assert guards.inspect_outputs([out], inputs) == {"lazy": [], "no_storage": [], "aliases_input": []}
    assert guards.outputs_agree([out], [out.clone()])[0]
    assert output_handover.publish_output(str(tmp_path), "set-0", [out])
    taken = output_handover.take_output(str(tmp_path), "set-0", torch.device("cpu"), 1 << 20)
    assert torch.equal(taken[0], out)

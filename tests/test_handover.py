"""Outputs cross from the candidate's process to the judge's one at a time, and nothing but tensors crosses."""

import os
import pickle

import pytest
import torch

from kbverify.child import evaluate


def test_an_output_is_handed_over_once_and_removed(tmp_path):
    outputs = [torch.arange(6.0).reshape(2, 3), torch.ones(2)]
    assert evaluate.publish_output(str(tmp_path), "original/x1/default/s0", outputs)
    taken = evaluate.take_output(str(tmp_path), "original/x1/default/s0", "cpu")
    assert all(torch.equal(a, b) for a, b in zip(outputs, taken))
    assert not any(name.endswith(".pt") for name in os.listdir(tmp_path)), "taken means gone: the candidate may go on"


def test_a_set_without_output_is_marked_so_the_judge_does_not_wait(tmp_path):
    evaluate.publish_nothing(str(tmp_path), "hidden:0/neg/default/s0")
    assert evaluate.take_output(str(tmp_path), "hidden:0/neg/default/s0", "cpu") is None


def test_the_judge_stops_waiting_when_the_candidate_is_gone(tmp_path):
    (tmp_path / evaluate.CANDIDATE_ENDED).write_text("")
    assert evaluate.take_output(str(tmp_path), "original/x3/default/s0", "cpu") is None


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo should-not-run",))


def test_a_forged_ipc_hand_over_cannot_run_code_in_the_judge(tmp_path):
    path = tmp_path / "forged.pt"
    path.write_bytes(evaluate._IPC_MAGIC + pickle.dumps([_Evil()]))
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        evaluate._load_ipc(path.read_bytes())


def test_a_forged_weights_file_cannot_run_code_either(tmp_path):
    (tmp_path / "original__x1__default__s0.pt").write_bytes(pickle.dumps([_Evil()]))
    with pytest.raises(Exception):
        evaluate.take_output(str(tmp_path), "original/x1/default/s0", "cpu")

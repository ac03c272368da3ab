"""Outputs cross from the candidate's process to the judge's one at a time, and nothing but tensors crosses."""

import os
import pickle

import pytest
import torch

from kbverify.harness import channel
from kbverify.worker import handover_files, output_handover

LIMIT = 1 << 20


def test_an_output_is_handed_over_once_and_removed(tmp_path):
    outputs = [torch.arange(6.0).reshape(2, 3), torch.ones(2)]
    assert output_handover.publish_output(str(tmp_path), "original/x1/default/s0", outputs)
    taken = output_handover.take_output(str(tmp_path), "original/x1/default/s0", "cpu",
                                        handover_files.handover_limit(outputs))
    assert all(torch.equal(a, b) for a, b in zip(outputs, taken))
    assert not any(name.endswith(".pt") for name in os.listdir(tmp_path)), "taken means gone: the candidate may go on"


def test_a_set_without_output_is_marked_so_the_judge_does_not_wait(tmp_path):
    output_handover.publish_nothing(str(tmp_path), "hidden:0/neg/default/s0")
    assert output_handover.take_output(str(tmp_path), "hidden:0/neg/default/s0", "cpu", LIMIT) is None


def test_the_judge_stops_waiting_when_the_candidate_is_gone(tmp_path):
    (tmp_path / channel.CANDIDATE_ENDED).write_text("")
    assert output_handover.take_output(str(tmp_path), "original/x3/default/s0", "cpu", LIMIT) is None


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo should-not-run",))


def test_a_forged_ipc_hand_over_cannot_run_code_in_the_judge(tmp_path):
    path = tmp_path / "forged.pt"
    path.write_bytes(output_handover._IPC_MAGIC + pickle.dumps([_Evil()]))
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        output_handover._load_ipc(path.read_bytes(), LIMIT)


def test_a_forged_weights_file_cannot_run_code_either(tmp_path):
    (tmp_path / "original__x1__default__s0.pt").write_bytes(pickle.dumps([_Evil()]))
    with pytest.raises(Exception):
        output_handover.take_output(str(tmp_path), "original/x1/default/s0", "cpu", LIMIT)


def _max_rss_kib() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_a_hand_over_larger_than_the_reference_allows_is_refused_unread(tmp_path):
    """A sparse file costs its writer nothing and the judge its memory: past the limit it is not read at all."""
    reference = [torch.zeros(1024, 1024)]  # 4 MiB; the limit: twice its elements at 8 bytes, plus 16 MiB
    limit = handover_files.handover_limit(reference)
    assert limit == 16 * 2**20 + 2 * (1024 * 1024 * 8 + handover_files.HANDOVER_TENSOR_BYTES)
    path = tmp_path / "original__x1__default__s0.pt"
    with open(path, "wb") as handle:
        handle.truncate(1 << 30)  # 1 GiB of nothing
    before = _max_rss_kib()
    with pytest.raises(ValueError, match="more than the reference's outputs allow"):
        output_handover.take_output(str(tmp_path), "original/x1/default/s0", "cpu", limit)
    assert _max_rss_kib() - before < 200 * 1024, "the judge read the oversized hand-over"
    assert not path.exists()  # discarded: the candidate may go on


def test_a_hand_over_that_grows_while_read_is_cut_at_the_limit(tmp_path, monkeypatch):
    """The size the judge saw is not the size it reads: the candidate may append in between."""
    path = tmp_path / "grows.pt"
    path.write_bytes(b"x" * 200)
    real_fstat = os.fstat

    def as_first_seen(fd):  # what fstat said before the candidate appended its last 100 bytes
        seen = list(real_fstat(fd))
        seen[6] = 100
        return os.stat_result(seen)

    monkeypatch.setattr(handover_files.os, "fstat", as_first_seen)
    with pytest.raises(ValueError, match="holds 151 bytes, more than"):
        handover_files.read_regular(str(path), 150)


def test_an_honest_output_of_another_dtype_or_shape_is_still_read_and_judged(tmp_path):
    """Within twice the reference's elements at float64 a wrong output is read, so its evidence is a dtype or
    shape mismatch rather than a refusal."""
    reference = [torch.zeros(256, 256)]
    wide = [torch.zeros(512, 256, dtype=torch.float64)]
    assert output_handover.publish_output(str(tmp_path), "original/x1/default/s0", wide)
    taken = output_handover.take_output(str(tmp_path), "original/x1/default/s0", "cpu",
                                        handover_files.handover_limit(reference))
    assert taken[0].shape == (512, 256) and taken[0].dtype == torch.float64


def test_an_unused_sets_hand_over_is_discarded_unread(tmp_path):
    path = tmp_path / "original__x1__default__s0.pt"
    with open(path, "wb") as handle:
        handle.truncate(1 << 40)
    assert output_handover.take_output(str(tmp_path), "original/x1/default/s0", "cpu", 0) is None
    assert not path.exists()


def test_own_wait_ignores_files_it_did_not_publish(tmp_path):
    # a decoy output and a planted "judge ended" marker decide nothing: the wait is for its own last output
    (tmp_path / "decoy.pt").write_text("")
    (tmp_path / channel.JUDGE_ENDED).write_text("")
    output_handover._PUBLISHED.clear()
    assert output_handover.publish_output(str(tmp_path), "original/x1/default/s0", [torch.zeros(2)])
    assert not output_handover.await_previous_consumed(str(tmp_path))  # its own output pending and the judge gone
    output_handover._PUBLISHED.clear()


def test_strays_in_the_hand_over_folder_are_named(tmp_path):
    from kbverify.harness.channel import handover_strays

    markers = {"candidate_ended": "c-1.ended", "judge_ended": "j-1.ended"}
    for name in ("original__x1__default__s0.none", "c-1.ended", "judge.ended", "decoy.pt"):
        (tmp_path / name).write_text("")
    assert handover_strays(str(tmp_path), ["original/x1/default/s0"], markers) == ["decoy.pt", "judge.ended"]


def test_many_small_tensors_fit_their_bound(tmp_path):
    # torch.save's own record of each tensor (~200 bytes) is allowed for: 100k rows of 4 are not refused. Their
    # file is past the fixed allowance for the container, so only the per-tensor term admits it; the bound is
    # checked on the file before anything is unpickled, which is where a refusal would come from (unpickling
    # 100k tensors takes a minute, so the whole way is taken by a smaller list below).
    set_id = "original/x1/default/s0"
    rows = [row.clone() for row in torch.rand(100_000, 4)]  # own storages: views of one would be saved once
    assert output_handover.publish_output(str(tmp_path), set_id, rows)
    path = output_handover._output_path(str(tmp_path), set_id)
    assert os.path.getsize(path) > handover_files.HANDOVER_CONTAINER_BYTES
    handover_files.read_regular(path, handover_files.handover_limit(rows))  # raises if refused
    output_handover.discard(str(tmp_path), set_id)  # the candidate publishes its next output once this one is gone

    few = rows[:2000]
    assert output_handover.publish_output(str(tmp_path), "original/x1/default/s1", few)
    taken = output_handover.take_output(str(tmp_path), "original/x1/default/s1", "cpu",
                                        handover_files.handover_limit(few))
    assert len(taken) == len(few) and all(torch.equal(a, b) for a, b in zip(taken, few))

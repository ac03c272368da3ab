"""The hand-over of a candidate's outputs to its judge: one at a time, so disk use stays at one output however many
sets there are.

The candidate publishes each set's output (a torch.save file, or CUDA IPC handles when opted in) and waits until the
judge has taken it; the judge reads it under a bound (kbverify.worker.handover_files), allowing no code to run, and
removes it. A set without output is marked so the judge does not wait; the parent's markers say a side has ended.
"""

from __future__ import annotations

import io
import os
import time

import torch

from kbverify.harness.channel import CANDIDATE_ENDED, JUDGE_ENDED, handover_stem  # the parent writes the markers
from kbverify.worker.handover_files import read_regular as _read_regular, too_large as _too_large

_HANDOVER_POLL_S = 0.002


def _output_path(outdir: str, set_id: str) -> str:
    return os.path.join(outdir, handover_stem(set_id) + ".pt")


def _skip_path(outdir: str, set_id: str) -> str:
    return os.path.join(outdir, handover_stem(set_id) + ".none")


_PUBLISHED: list = []  # the path of the last output this process handed over
_MARKERS = {"candidate_ended": CANDIDATE_ENDED, "judge_ended": JUDGE_ENDED}  # a job's payload names its run's


def use_markers(markers: dict | None) -> None:
    """The end markers this run's parent writes (named in the job's payload)."""
    _MARKERS.update(markers or {})


def await_previous_consumed(outdir: str) -> bool:
    """Wait until the judge has taken the last output this process published (no other file decides it); False
    if the judge is gone."""
    while _PUBLISHED and os.path.lexists(_PUBLISHED[-1]):
        if os.path.exists(os.path.join(outdir, _MARKERS["judge_ended"])):
            return False
        time.sleep(_HANDOVER_POLL_S)
    return True


_IN_FLIGHT: list = []  # the output being handed over by CUDA IPC: kept alive until the judge has copied it


def use_cuda_ipc(device) -> bool:
    """Opt-in (KBVERIFY_CUDA_IPC=1): share GPU outputs by CUDA IPC handle instead of copying them through a file."""
    return device.type == "cuda" and os.environ.get("KBVERIFY_CUDA_IPC") == "1"


def publish_output(outdir: str, set_id: str, outputs: list, *, ipc: bool = False) -> bool:
    if not await_previous_consumed(outdir):
        return False
    _IN_FLIGHT.clear()
    tmp = _output_path(outdir, set_id) + ".tmp"
    if ipc:
        from multiprocessing.reduction import ForkingPickler

        from torch import multiprocessing as _registers_reductions  # noqa: F401 - CUDA tensor reducers

        _IN_FLIGHT.extend(outputs)
        with open(tmp, "wb") as handle:
            handle.write(_IPC_MAGIC + bytes(ForkingPickler.dumps(outputs)))
    else:
        torch.save(outputs, tmp)
    os.replace(tmp, _output_path(outdir, set_id))
    _PUBLISHED[:] = [_output_path(outdir, set_id)]
    return True


_IPC_MAGIC = b"KBV-CUDA-IPC\n"


def _load_ipc(data: bytes, limit_bytes: int) -> list:
    """Rebuild shared CUDA tensors from a candidate's IPC handles, allowing no other code to run (the file comes
    from untrusted code), and copy them at once."""
    import pickle

    allowed = {("torch.multiprocessing.reductions", "rebuild_cuda_tensor"), ("torch", "Tensor"), ("torch", "Size"),
               ("torch", "device"), ("torch.storage", "TypedStorage"), ("torch.storage", "UntypedStorage"),
               ("torch", "UntypedStorage"), ("torch", "TypedStorage")}
    dtypes = {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}

    class Restricted(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in allowed or (module == "torch" and name in dtypes):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a hand-over")

    if not data.startswith(_IPC_MAGIC):
        raise ValueError("not an IPC hand-over")
    shared = Restricted(io.BytesIO(data[len(_IPC_MAGIC):])).load()
    if not isinstance(shared, list) or not all(type(t) is torch.Tensor for t in shared):
        raise ValueError("an IPC hand-over holds a list of tensors")
    size = sum(t.numel() * t.element_size() for t in shared)  # what the clones below take
    if size > limit_bytes:
        raise ValueError(_too_large(size, limit_bytes))
    return [t.clone() for t in shared]


def publish_nothing(outdir: str, set_id: str) -> None:
    with open(_skip_path(outdir, set_id), "w"):
        pass


def discard(outdir: str, set_id: str) -> None:
    import shutil

    path = _output_path(outdir, set_id)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except OSError:
            pass


def take_output(outdir: str, set_id: str, device, limit_bytes: int):
    """The candidate's output for a set (None if it produced none), removing it so the candidate may go on. A
    hand-over over `limit_bytes` (handover_limit of the reference's outputs) raises ValueError, unread; with a
    limit of 0 nothing is read and None returned (a set whose output is not used)."""
    path, skip = _output_path(outdir, set_id), _skip_path(outdir, set_id)
    while True:
        if os.path.lexists(path):
            try:
                if limit_bytes == 0:
                    return None
                data = _read_regular(path, limit_bytes)
                if data.startswith(_IPC_MAGIC):
                    outputs = _load_ipc(data, limit_bytes)
                    torch.cuda.synchronize()
                    return outputs
                return torch.load(io.BytesIO(data), map_location=device, weights_only=True)
            finally:
                discard(outdir, set_id)
        if os.path.exists(skip):
            return None
        if os.path.exists(os.path.join(outdir, _MARKERS["candidate_ended"])):
            if not os.path.exists(path):
                return None
            continue
        time.sleep(_HANDOVER_POLL_S)


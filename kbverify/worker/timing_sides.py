"""The two sides of the timing worker, and what every timed call's inputs and outputs go through.

A `Side` is one model (the reference or the candidate) with its bookkeeping: the seeds and distributions the parent
chose, each call's inputs placed in fresh (or refilled) tensors after the hold, a copy of each output taken at its
end event (`snapshot`), and its share of the harness's host time. `poison` fills an output with NaN once it has been
copied, so nothing of one side's answer is left for the other.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time

import torch

from kbverify.core.inputs import timed_inputs
from kbverify.judge.correctness import flatten_outputs

# Captured when the worker loads, before any submission: `secrets.randbits`, `os.urandom` and `random.Random` are
# module attributes a submission could replace to make the timed inputs or the round order predictable.
_URANDOM = os.urandom
_RANDOM = random.Random
CALLS_PER_BATCH = 3  # kbverify.timing.timing_control.CALLS_PER_SIDE: the parent sends this many seeds with each `go`


def _random_bits(bits: int) -> int:
    return int.from_bytes(_URANDOM((bits + 7) // 8), "little") & ((1 << bits) - 1)



class Side:
    def __init__(self, name: str, model, namespace: dict, device, secret: str, grad: bool):
        self.name, self.model, self.namespace, self.device = name, model, namespace, device
        self.secret, self.grad = secret, grad
        # projection done → device idle: work the call left running beyond its own stream (the projection's
        # own launches are excluded, or a call faster than the host's launch overhead would look unfinished)
        self.settle_gaps_ms: list[float] = []
        self.calls: list[dict] = []
        self.previous_inputs: list | None = None
        self.released: list = []  # inputs dropped inside a batch, freed after it
        self.threads_started = 0
        self.host_ms: list[float] = []  # hold → end event on the host: what the device-side hold has to cover
        self.probe: list[list[float]] = []  # warm-up: [hold ms, host ms] per call (is the forward blocked?)
        self.uncovered = 0  # calls whose host work outlasted the hold (their launch overhead was timed)
        self.phase_ns: dict[str, int] = {}  # host wall time per phase of the harness's work, summed over calls
        self.modes_left: set[str] = set()  # torch modes a call entered and did not leave
        self.batch: dict[int, dict] = {}  # this batch's calls: index → output copies and signature
        # Only the reference's own weights are spared the poison: a candidate returning a tensor it keeps (a
        # registered buffer included) must recompute it every call, and its `parameters()` is its own to fake.
        self.own_storages = own_storages(model) if name == "ref" and isinstance(model, torch.nn.Module) else frozenset()
        self._seen = 0
        self.jitter_bytes = 0  # > 0: a spacer of up to this many bytes allocated before each call's tensors
        self.spacer = None
        # the buffers each place in a batch copies its outputs into (`snapshot`), and how many copies were made
        self.copy_slots: list[list] = [[] for _ in range(CALLS_PER_BATCH)]
        self.copies_made = 0

    def spent(self, phase: str, since_ns: int) -> int:
        """Add the time since `since_ns` to `phase`; returns now, the next phase's start."""
        now = time.perf_counter_ns()
        self.phase_ns[phase] = self.phase_ns.get(phase, 0) + now - since_ns
        return now

    def copy_outputs(self, outputs: list) -> list:
        """The outputs copied into the next place's buffers: any CALLS_PER_BATCH calls in a row use distinct ones,
        so a batch's copies stay as they were until its calls were chosen and handed over."""
        slot = self.copy_slots[self.copies_made % len(self.copy_slots)]
        self.copies_made += 1
        return snapshot(outputs, slot)

    def keep(self, call_index: int, copies: list, signature: list) -> None:
        """Held until the parent has chosen which of this batch's calls it checks (kbverify.timing.timing_control), at
        the batch's end, before anything of the batch is freed; its digest goes to the parent with the times."""
        self.batch[call_index] = {"copies": copies, "signature": json.loads(json.dumps(signature))}

    def reveal(self, indices: list, outdir: str) -> dict:
        """The chosen calls' copies, written whole to the parent's hand-over folder for the check: index → the
        file's name and the output's signature, or why the copy could not be written (a fault of the machine's
        such as a full disk, which the parent never charges to the kernel)."""
        shown = {}
        for index in indices:
            entry = dict.get(self.batch, index) if type(self.batch) is dict else None
            if type(entry) is not dict:
                shown[str(index)] = {"error": "no copy of this call"}
                continue
            name = f"timed-{int(index)}.pt"
            try:
                _write(os.path.join(outdir, name), entry["copies"])
            except torch.OutOfMemoryError as error:
                shown[str(index)] = {"infrastructure_error": f"out of memory copying the output ({error})"[:300]}
                continue
            except OSError as error:
                shown[str(index)] = {"infrastructure_error": f"could not write the output's copy: {error}"[:300]}
                continue
            shown[str(index)] = {"file": name, "signature": entry["signature"]}
        return shown

    def inputs_for(self, seed: int, distribution: str = "x1") -> tuple[int, list]:
        """The parent chose the seed and the distribution and sends them with the batch: nothing in this process
        predicts the next."""
        return seed, timed_inputs(self.namespace, seed, distribution, self.device)

    def place(self, staged: list) -> list:
        """The call's own input tensors, filled from a finished draw by copies enqueued now (after the hold):
        a kernel that starts on another stream without waiting reads the last call's values, not this call's.
        Half the time the previous call's tensors are refilled, which defeats caches keyed on a tensor's address.
        Lists and tuples are refilled element by element; a tensor that shares its storage with another input
        (an alias, a view), a tensor subclass or a Parameter, and anything that is not a tensor go to the call
        as drawn. The caller keeps `staged` alive until the call is over, so no allocation made inside the call
        can be handed the drawn values' memory."""
        previous = self.previous_inputs
        if self.jitter_bytes:
            # Spacer first, then the call's allocations: each lands at another offset in the allocator's
            # segments. Two copies of one model differed by a fixed 0.7-1% for a whole run on the H200 (stable
            # addresses, call after call, are the first suspect); moved every call, that offset is noise the
            # rounds average and the interval sees. Experimental: off unless the payload asks for it.
            self.spacer = None
            self.spacer = torch.empty(_random_bits(32) % self.jitter_bytes // 512 * 512 + 512, dtype=torch.uint8,
                                      device=self.device)
        reuse = previous is not None and _random_bits(1) == 1 and _layout(previous) == _layout(staged)
        if not reuse and previous is not None:
            # freed after the batch's clock stops (timing_rounds._batch), not inside it: a finalizer a forward
            # attached to the reference's last inputs would run there
            self.released.append(previous)
            self.previous_inputs = previous = None
        shared = _shared_storages(staged)
        placed = [_refill(value, previous[index] if reuse else None, shared) for index, value in enumerate(staged)]
        self.previous_inputs = placed
        return placed


def _refill(value, previous, shared: frozenset):
    if type(value) in (list, tuple):
        earlier = previous if type(previous) is type(value) and len(previous) == len(value) else [None] * len(value)
        return type(value)(_refill(item, before, shared) for item, before in zip(value, earlier))
    if not _refillable(value, shared):
        return value
    target = previous if isinstance(previous, torch.Tensor) else torch.empty_strided(
        value.size(), value.stride(), dtype=value.dtype, device=value.device)
    with torch.no_grad():
        target.copy_(value)
    if value.requires_grad and not target.requires_grad:
        target.requires_grad_(True)
    return target


def _refillable(value, shared: frozenset) -> bool:
    if type(value) is not torch.Tensor or value.numel() == 0 or storage_of(value) in shared:
        return False
    return _dense(value)


def _dense(tensor: torch.Tensor) -> bool:
    """Its elements fill its memory exactly once in some order of dimensions (contiguous, transposed, channels-last):
    an empty_strided copy then has the same layout. A slice with gaps or a broadcast (stride 0) is not."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(tensor.shape, tensor.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _shared_storages(values) -> frozenset:
    seen, shared = set(), set()
    for tensor in _tensors_in(values):
        storage = storage_of(tensor)
        (shared if storage in seen else seen).add(storage)
    return frozenset(shared)


def _tensors_in(values):
    for value in values:
        if type(value) in (list, tuple):
            yield from _tensors_in(value)
        elif isinstance(value, torch.Tensor):
            yield value


def _layout(value):
    """What a refill must match: the nesting, and each tensor's shape, strides, dtype and whether it needs grad."""
    if type(value) in (list, tuple):
        return (type(value).__name__, tuple(_layout(item) for item in value))
    if isinstance(value, torch.Tensor):
        return ("tensor", type(value).__name__, tuple(value.shape), tuple(value.stride()), value.dtype,
                value.requires_grad)
    return ("value",)


def snapshot(outputs: list, slot: list) -> list:
    """A copy of every plain tensor output (None for anything else), enqueued right after the call's end event,
    into `slot`: buffers kept from the side's earlier calls at this place in a batch, reused where shape, dtype and
    device match. Both sides keep their batch's copies in such buffers for good, so neither side's outputs land in
    memory the other side's would not: a copy allocated per call and kept to the batch's end sent the candidate's
    next output to fresh pages (an A/A on a CPU read 0.75x, its interval clear of 1).

    The copy is what the timed-output check judges, whole (SPEC §4, stale outputs): which calls are checked is
    chosen by the parent after the batch, and the comparison runs in a process without submission code, so
    nothing in this process says which calls or elements will be looked at (corpus:
    matmul_computes_only_what_it_can_find_of_the_check). Compared with the output after a device-wide
    synchronise, it also shows work that outlived the call (`unsettled`)."""
    copies = []
    for index, out in enumerate(outputs):
        if type(out) is not torch.Tensor:
            copies.append(None)
            continue
        kept = slot[index] if index < len(slot) else None
        if (kept is None or kept.shape != out.shape or kept.dtype != out.dtype or kept.device != out.device):
            kept = out.detach().clone()
        else:
            kept.copy_(out.detach())
        copies.append(kept)
    slot[:] = copies
    return copies


# splitmix64's finaliser constants as signed 64-bit integers (torch has no unsigned 64-bit arithmetic; a wrapping
# multiply has the same bits), and the number of lanes a copy is hashed in.
_MIX = (0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64))
_LANES = 1 << 18
_FOLDED = 1 << 12
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def digest(copies: list) -> list:
    """Per copy: a cryptographic digest of its dtype, shape and every element's bits (None for no copy).

    Sent with the batch's times, so it is made on the parent's clock, before the parent chooses which calls it
    checks; the clean check recomputes it from the copy it is handed. A copy changed after the choice, or made
    right only then (corpus: matmul_hands_over_a_product_made_after_the_choice), no longer matches, and no
    nudging of low bits makes it match (a sum of per-element mixes was forged by adjusting a few elements' low
    bits: corpus matmul_forges_the_digest_after_the_choice). On the CPU, BLAKE2b of the bytes; on a GPU, each of
    up to 2**18 lanes chains its elements through a 64-bit mix, in order, and BLAKE2b hashes the lanes' end states
    (the bytes never leave the device). Integer operations only, so no reduction order can change it."""
    return [None if copy is None else _digest_one(copy) for copy in copies]


def _digest_one(copy: torch.Tensor) -> str:
    flat = copy.detach().reshape(-1)
    header = f"{copy.dtype}|{tuple(copy.shape)}|".encode()
    if flat.numel() == 0:
        return hashlib.blake2b(header, digest_size=32).hexdigest()
    bits = flat.view(_BITS.get(flat.element_size(), torch.int64))
    if bits.device.type == "cpu":  # the bytes themselves: BLAKE2b reads them faster than integer passes would
        return hashlib.blake2b(header + memoryview(bits.contiguous().numpy()), digest_size=32).hexdigest()
    return lane_digest(bits, header)


def lane_digest(bits: torch.Tensor, header: bytes = b"") -> str:
    """The device's digest of integer `bits`: up to 2**18 lanes (a power of two), each chaining its elements
    through a 64-bit mix in order; the lanes' end states folded pairwise on the device down to 2**12 (each fold
    mixes one half into the other, in order), then BLAKE2b of those. Matching a given digest by nudging elements
    means matching every folded 64-bit state. The fold keeps the bytes that leave the device, and the host's
    hash, small: unfolded, a 64K-element output cost 1.5 ms a call on an H200, 77 times its copy."""
    bits = bits.reshape(-1).to(torch.int64)
    lanes = min(_LANES, 1 << (bits.numel().bit_length() - 1))
    steps = -(-bits.numel() // lanes)
    if steps * lanes != bits.numel():
        bits = torch.cat([bits, bits.new_zeros(steps * lanes - bits.numel())])
    state = torch.arange(lanes, dtype=torch.int64, device=bits.device)
    for row in bits.view(steps, lanes):
        state = _mix(state ^ row) + row  # fed forward: a lane's state is not run backwards from its end
    while state.numel() > _FOLDED:
        half = state.numel() // 2
        state = _mix(state[:half] ^ _mix(state[half:]))  # asymmetric: swapping the halves changes it
    return hashlib.blake2b(header + state.cpu().numpy().tobytes(), digest_size=32).hexdigest()


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser with logical shifts (an arithmetic shift would fold x and ~x together)."""
    x = (x ^ _shr(x, 30)) * _MIX[0]
    x = (x ^ _shr(x, 27)) * _MIX[1]
    return x ^ _shr(x, 31)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def changed_since(copies: list, outputs: list) -> bool:
    """Whether an output differs from its copy made at the end event (NaN where both hold NaN is no change)."""
    for copy, out in zip(copies, outputs):
        if copy is None:
            continue
        if type(out) is not torch.Tensor or out.shape != copy.shape:
            return True
        if torch.equal(copy, out):  # one pass, no temporaries: the common case
            continue
        with torch.no_grad():
            same = (copy == out) | (torch.isnan(copy) & torch.isnan(out)) if copy.is_floating_point() else copy == out
            if not bool(same.all()):
                return True
    return False


def _write(path: str, copies: list) -> None:
    tmp = path + ".tmp"
    torch.save([None if c is None else c.detach().cpu() for c in copies], tmp)
    os.replace(tmp, path)


def poison(output, spared: frozenset = frozenset()) -> None:
    """NaN into every floating output tensor, except one that shares storage with the model's own parameters or
    buffers (a forward may return one of them as it is).

    An inference tensor (a forward under `torch.inference_mode`) is filled inside inference mode, the only place
    PyTorch allows it in place: an honest kernel that returns one is no runtime error (corpus:
    honest/relu_under_inference_mode)."""
    with torch.no_grad():
        for tensor in flatten_outputs(output):
            if (isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and type(tensor) is torch.Tensor
                    and storage_of(tensor) not in spared):
                fill_nan(tensor)


def fill_nan(tensor: torch.Tensor) -> None:
    """`tensor.fill_(nan)`, inside inference mode where the tensor is an inference tensor (see `poison`)."""
    if tensor.is_inference():
        with torch.inference_mode():
            tensor.fill_(float("nan"))
    else:
        tensor.fill_(float("nan"))


def storage_of(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage (a functional or meta tensor)
        return -1


def own_storages(model) -> frozenset:
    try:
        tensors = [*model.parameters(), *model.buffers()]
    except Exception:  # noqa: BLE001 - a submission's module may not enumerate; then nothing is spared
        return frozenset()
    return frozenset(storage_of(t) for t in tensors if isinstance(t, torch.Tensor))


def output_signature(outputs: list) -> list:
    # the full type name: a subclass called "Tensor" is not torch.Tensor
    return [(f"{type(t).__module__}.{type(t).__qualname__}", tuple(t.shape), str(t.dtype))
            if type(t) is torch.Tensor else f"{type(t).__module__}.{type(t).__qualname__}" for t in outputs]


def make_sides(reference, candidate, namespace: dict, device, secret: str, payload: dict) -> dict:
    """The sides this worker serves, of the reference's and the candidate's (None: not served here), on the same
    task namespace (the inputs both draw from)."""
    sides = {}
    if reference is not None:
        sides["ref"] = Side("ref", reference, namespace, device, secret, grad=False)
    if candidate is not None:
        sides["cand"] = Side("cand", candidate, namespace, device, secret,
                             grad=bool(payload.get("candidate_grad_enabled", False)))
    for side in sides.values():
        side.jitter_bytes = int(payload.get("placement_jitter_bytes", 0))
    return sides

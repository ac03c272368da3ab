"""Worker-side guard probes (SPEC §4). Each returns evidence; the parent turns evidence into statuses,
always against what the reference itself does (a reference that mutates or aliases makes it legal)."""

from __future__ import annotations

import builtins
import inspect
import os
import signal
import sys
import types

import torch

# Functions a submission could patch to fool timing, comparison or the result channel.
_SENSITIVE = (
    "time.perf_counter",
    "time.perf_counter_ns",
    "time.time",
    "time.monotonic",
    "torch.cuda.Event",
    "torch.cuda.Event.record",
    "torch.cuda.Event.elapsed_time",
    "torch.cuda.synchronize",
    "torch.cuda.current_stream",
    "torch.cuda._sleep",
    "torch.allclose",
    "torch.isclose",
    "torch.equal",
    "torch.testing.assert_close",
    "torch.save",
    "torch.Tensor.clone",
    "torch.Tensor.to",
    "torch.Tensor.cpu",
    "torch.Tensor.__eq__",
    "torch.Tensor.sub",
    "torch.Tensor.abs",
    "torch.linalg.vector_norm",
    "torch.nn.Module.__call__",
    "torch.manual_seed",
    "json.dump",
    "json.dumps",
    "os.replace",
    "builtins.open",
)


def snapshot_sensitive() -> dict[str, object]:
    """The functions we rely on, captured before the submission is imported. The objects themselves are kept (not
    their ids, which a freed object's replacement could reuse) and compared with `is`."""
    snapshot: dict[str, object] = {}
    for name in _SENSITIVE:
        try:
            snapshot[name] = _parts(_resolve(name))
        except AttributeError:
            continue
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("kbverify.") and module is not None:
            for attr, value in vars(module).items():
                if isinstance(value, (int, float, str, bytes, tuple, frozenset)) and not attr.startswith("__"):
                    # thresholds and limits are data a submission could rewrite: keep their values
                    snapshot[f"value:{module_name}.{attr}"] = hash(repr(value))
                elif not attr.startswith("__"):
                    # every other global by identity (imported functions, modules, captured generators, code
                    # objects), Python functions with their code, defaults and cells, classes with their dicts
                    snapshot[f"{module_name}.{attr}"] = _parts(value)
                    if isinstance(value, type) and value.__module__ == module_name:
                        for key, member in vars(value).items():
                            snapshot[f"{module_name}.{attr}.{key}"] = _parts(member)
    snapshot["sys.profile"] = (sys.getprofile(), sys.gettrace())
    for name, read in _PROCESS_STATE.items():
        snapshot[f"state:{name}"] = read()
    return snapshot


def _global_module_hooks() -> tuple:
    """torch's process-wide module hooks (a forward pre-hook registered at import runs inside every reference call
    without replacing any function): each registry's hooks by identity."""
    from torch.nn.modules import module

    return tuple((name, tuple(getattr(module, name).values())) for name in sorted(vars(module))
                 if name.startswith("_global_") and name.endswith("hooks") and isinstance(getattr(module, name), dict))


# The dispatcher's own table of every aten operator. A kernel registered over one (torch.library, or a native
# extension's TORCH_LIBRARY_IMPL(aten, ...)) changes what the reference, and every check that runs the reference in
# the candidate's process, computes, with no Python function changing identity. Read through functions captured
# here, before any submission loads (this module's globals are in the snapshot by identity).
_ALL_OPERATOR_NAMES = getattr(torch._C, "_dispatch_get_all_op_names", None)
_DISPATCH_TABLE = getattr(torch._C, "_dispatch_dump_table", None)


def _aten_kernels() -> dict[str, str]:
    """Each aten operator's registered kernels as the dispatcher lists them (~70 ms for all ~3000 on a CPU)."""
    if _ALL_OPERATOR_NAMES is None or _DISPATCH_TABLE is None:
        return {}
    return {name: _DISPATCH_TABLE(name) for name in _ALL_OPERATOR_NAMES() if name.startswith("aten::")}


# Process state the reference's inputs and timing depend on, captured before any submission and compared after.
_PROCESS_STATE = {
    "torch.get_default_dtype": torch.get_default_dtype,  # the task's torch.rand draws follow it
    "torch.get_default_device": lambda: str(torch.get_default_device()) if hasattr(torch, "get_default_device")
    else None,
    "torch.nn.modules.module global hooks": _global_module_hooks,
    "sys.getswitchinterval": sys.getswitchinterval,  # how long a spinning thread may hold the GIL
    "aten kernels": _aten_kernels,
    "timers": lambda: timer_state(),
}


def signal_state() -> str:
    """What can interrupt the harness from outside the submission's own calls: the signals this process catches
    (`signal_handlers`) and its armed timers (`timer_state`)."""
    return f"{signal_handlers()}, {timer_state()}"


def signal_handlers() -> str:
    """The signals this process catches as the kernel sees them (Python's handlers and a native library's alike).
    Compared before every batch with the state after the warm-up, not before the submission loaded: a
    library's first launch may install handlers of its own (Triton's compile, a driver), and a handler alone
    runs only when something signals (corpus: matmul_shrinks_times_pads_reference_harness_by_signal_timer)."""
    try:
        with open("/proc/self/status") as status:
            return "caught " + next((line.split()[1] for line in status if line.startswith("SigCgt:")), "?")
    except OSError:
        return "caught ?"


def timer_state() -> str:
    """The interval timers that are armed and the POSIX timers that exist. A timer's handler run inside the
    reference's batch pads the reference's share of the parent's clock (corpus:
    matmul_shrinks_times_pads_reference_harness_by_signal_timer); compared before every batch and at the end
    with the state before the submission loaded."""
    armed = tuple(signal.getitimer(which) != (0.0, 0.0)
                  for which in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF))
    try:
        with open("/proc/self/timers") as timers:
            posix = sum(line.startswith("ID:") for line in timers)
    except OSError:
        posix = 0
    return f"interval timers armed {armed}, POSIX timers {posix}"


def _parts(obj) -> tuple:
    """What a Python function runs with, besides its identity: all of it is writable in place."""
    if type(obj) is not types.FunctionType:
        return (obj,)
    cells = []
    for cell in obj.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:
            cells.append(None)
    return (obj, obj.__code__, obj.__defaults__, obj.__kwdefaults__, type(obj.__dict__), *obj.__dict__.values(), *cells)


def _same(current, original) -> bool:
    return len(current) == len(original) and all(a is b for a, b in zip(current, original))


def tampered(snapshot: dict[str, object]) -> list[str]:
    changed = []
    for name, original in snapshot.items():
        by_value = name.startswith("value:")
        dotted = name[len("value:"):] if by_value else name
        if dotted == "sys.profile":
            if (sys.getprofile(), sys.gettrace()) != original:
                changed.append(dotted)
            continue
        if name == "state:aten kernels":
            current = _aten_kernels()
            replaced = sorted(op for op in current.keys() | original.keys() if current.get(op) != original.get(op))
            if replaced:
                changed.append("aten kernels replaced: " + ", ".join(replaced[:4]))
            continue
        if name.startswith("state:"):
            if not _same_state(_PROCESS_STATE[name[len("state:"):]](), original):
                changed.append(name[len("state:"):])
            continue
        try:
            current = _resolve(dotted)
        except (AttributeError, KeyError):
            changed.append(dotted)
            continue
        if by_value:
            if hash(repr(current)) != original:
                changed.append(dotted)
        elif not _same(_parts(current), original) and not _dynamo_seed_wrapper(dotted, current, original[0]):
            changed.append(dotted)
    return sorted(changed)


def _same_state(current, original) -> bool:
    if isinstance(current, tuple) and isinstance(original, tuple):  # hook registries: compare hooks by identity
        return len(current) == len(original) and all(
            a[0] == b[0] and len(a[1]) == len(b[1]) and all(x is y for x, y in zip(a[1], b[1]))
            for a, b in zip(current, original))
    return current == original


def _resolve(dotted: str):
    """By path, never through a table a submission could refill: the longest imported module,
    then static attribute look-ups (class members as stored, not bound)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            value = module
            for attr in parts[cut:]:
                value = inspect.getattr_static(value, attr)
            return value
    return inspect.getattr_static(builtins, dotted.rpartition(".")[2])


def _inner_code_of_disable_dynamo():
    try:
        from torch._compile import _disable_dynamo
    except ImportError:
        return None
    codes = [c for c in _disable_dynamo.__code__.co_consts if isinstance(c, types.CodeType) and c.co_name == "inner"]
    return codes[0] if len(codes) == 1 else None


# Taken when this module loads, before any submission: code objects cannot be changed afterwards.
_DISABLE_DYNAMO_INNER = _inner_code_of_disable_dynamo()


def _dynamo_seed_wrapper(name: str, current, original) -> bool:
    """Importing torch._dynamo (torch.compile does) runs `torch.manual_seed = torch._disable_dynamo(torch.manual_seed)`.
    That one replacement is accepted, and only as torch makes it: a plain function running torch's own `inner` code
    on the original itself, with no `__dynamo_disable` redirection planted on the original (torch caches one
    there when the wrapper is first called; the harness seeds through captured generators and never calls it)."""
    if name not in ("torch.manual_seed",) or _DISABLE_DYNAMO_INNER is None:
        return False
    if type(current) is not types.FunctionType or current.__code__ is not _DISABLE_DYNAMO_INNER:
        return False
    cells = dict(zip(current.__code__.co_freevars, current.__closure__ or ()))
    try:
        wrapped = cells["fn"].cell_contents
    except (KeyError, ValueError):
        return False
    planted = type(original) is types.FunctionType and (type(original.__dict__) is not dict
                                                        or "__dynamo_disable" in dict.keys(original.__dict__))
    return wrapped is original and not planted


# ---- tripwires: operations no kernel needs, refused in workers by an audit hook (which cannot be removed) ----

_REFUSED_EVENTS = frozenset({"sys.setprofile", "sys.settrace"})
_REFUSED_ATTRIBUTES = frozenset({"__code__"})  # torch itself sets __defaults__ while it loads
refused: list[str] = []  # what was refused; the refusal itself is the defence, this is the evidence
# A further audit hook runs code at the harness's own audited calls (a listdir, an open), where it can read the
# harness's frames; torch.compile's GPU stack adds one too, and works without it. So adding one fails quietly
# (CPython drops the hook when an existing one raises RuntimeError) and is evidence, not a verdict.
quietly_refused: list[str] = []


def _tripwire(event: str, args: tuple) -> None:
    if event == "sys.addaudithook":
        if len(quietly_refused) < 10:
            quietly_refused.append(event)
        raise RuntimeError("refused in a kbverify worker: sys.addaudithook")
    if event in _REFUSED_EVENTS or (event == "object.__setattr__" and len(args) >= 2
                                    and args[1] in _REFUSED_ATTRIBUTES):
        what = event if event != "object.__setattr__" else f"setting a function's {args[1]}"
        refused.append(what)
        raise RuntimeError(f"refused in a kbverify worker: {what}")


def install_tripwires() -> None:
    """Profile and trace hooks (which run code at any call or return the harness makes), rewriting a function's
    code in place (which keeps its identity, so identity checks miss it), and, quietly, further audit hooks.
    Installed in each worker before it loads any task or submission code."""
    sys.addaudithook(_tripwire)


# Captured before any submission: the depth of torch's mode stacks.
_FUNCTION_MODE_DEPTH = torch._C._len_torch_function_stack
_DISPATCH_MODE_DEPTH = torch._C._len_torch_dispatch_stack
_MODE_NAMES = ("torch_function_mode", "torch_dispatch_mode")


def mode_depths() -> tuple[int, int]:
    return _FUNCTION_MODE_DEPTH(), _DISPATCH_MODE_DEPTH()


def modes_left_active(before: tuple[int, int]) -> list[str]:
    """A TorchFunctionMode or TorchDispatchMode the submission entered and left entered intercepts every torch
    call the harness makes next: its copies of the output, their digests, the reference itself."""
    return [name for name, depth, now in zip(_MODE_NAMES, before, mode_depths()) if now > depth]


def python_thread_count() -> int:
    """Threads that run Python code (any that holds the GIL does): native threads a driver starts when it likes
    (CUDA's, NVML's) are not among them."""
    return len(sys._current_frames())


def thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _span(tensor: torch.Tensor) -> tuple[int, int] | None:
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def inspect_outputs(outputs: list, inputs: list) -> dict:
    """Type, storage and overlap with the inputs of every output tensor."""
    evidence = {"lazy": [], "no_storage": [], "aliases_input": []}
    input_spans = [(index, _span(x)) for index, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    for index, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            continue
        if type(out) is not torch.Tensor:
            evidence["lazy"].append({"output": index, "type": f"{type(out).__module__}.{type(out).__qualname__}"})
            continue
        span = _span(out)
        if span is None or (out.numel() > 0 and span[0] == 0):
            evidence["no_storage"].append(index)
            continue
        for input_index, input_span in input_spans:
            if input_span and out.numel() > 0 and span[0] < input_span[1] and input_span[0] < span[1]:
                evidence["aliases_input"].append({"output": index, "input": input_index})
    return evidence


def changed_inputs(pristine: list, inputs: list) -> list[int]:
    """Indices of tensor inputs whose bytes changed during a call (NaN-safe: compares bits)."""
    changed = []
    for index, (before, after) in enumerate(zip(pristine, inputs)):
        if not isinstance(before, torch.Tensor):
            continue
        if not isinstance(after, torch.Tensor) or before.shape != after.shape or before.dtype != after.dtype:
            changed.append(index)
            continue
        if not torch.equal(_bits(before), _bits(after)):
            changed.append(index)
    return changed


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.element_size() and flat.numel() else flat


def poison_allocator(device: torch.device, value: float, nbytes: int) -> None:
    """Fill memory the caching allocator will hand out next, so `empty()` returns `value`, not stale results."""
    if device.type != "cuda":
        return
    count = max(1, nbytes // 4)
    block = torch.full((count,), value, dtype=torch.float32, device=device)
    # the caching allocator serves allocations under 1 MB from separate small-block segments
    small = [torch.full(((256 << 10) // 4,), value, dtype=torch.float32, device=device) for _ in range(64)]
    torch.cuda.synchronize(device)
    del block, small


def outputs_agree(first: list, second: list, *, tol: float = 1e-4) -> tuple[bool, str]:
    """Two runs on the same inputs with different poison patterns must agree (up to atomics' reordering)."""
    if len(first) != len(second):
        return False, "different number of outputs"
    for index, (a, b) in enumerate(zip(first, second)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        if a.shape != b.shape:
            return False, f"output {index}: shape {list(a.shape)} then {list(b.shape)}"
        if a.is_floating_point():
            a64, b64 = a.detach().double(), b.detach().double()
            nan_mismatch = int((torch.isnan(a64) != torch.isnan(b64)).sum())
            finite = torch.isfinite(a64)
            # Reordered sums (atomics, split-K) differ by rounding, near zero too after cancellation: allow a
            # small part of the output's typical magnitude. NaN or sentinel-derived garbage is far outside it.
            scale = float(a64[finite].abs().mean()) if bool(finite.any()) else 0.0
            close = ((a64 - b64).abs() <= tol * (a64.abs() + scale)) | (a64 == b64) | (torch.isnan(a64) & torch.isnan(b64))
            bad = int((~close).sum())
            if nan_mismatch or bad:
                return False, f"output {index}: {bad} elements differ between two runs ({nan_mismatch} NaN positions)"
        elif not torch.equal(a, b):
            return False, f"output {index}: differs between two runs"
    return True, ""


def snapshot_torch_namespace() -> dict[str, object]:
    """Identities of the torch functions a reference calls; a submission that swaps one sabotages the baseline."""
    import torch.nn.functional as F

    snapshot = {}
    for prefix, owner in (("torch", torch), ("F", F), ("torch.Tensor", torch.Tensor)):
        for attr in dir(owner):
            if attr.startswith("__") and prefix != "torch.Tensor":
                continue
            try:
                value = inspect.getattr_static(owner, attr)
            except AttributeError:
                continue
            if callable(value) or isinstance(value, (classmethod, staticmethod)):
                snapshot[f"{prefix}.{attr}"] = value
    for class_name, cls in _nn_module_classes():
        # every method a torch.nn module class defines itself (forward, __getattr__, ...), and which ones: one added
        # to a class (LayerNorm.__getattr__) changes the reference as much as one replaced
        members = {attr: value for attr, value in vars(cls).items()
                   if _is_method_like(value) and attr not in _NN_UNWATCHED}
        for attr, value in members.items():
            snapshot[f"torch.nn.{class_name}.{attr}"] = value
        snapshot[f"torch.nn.{class_name}.<methods>"] = frozenset(members)
    return snapshot


# Not watched on torch.nn's module classes: torch.compile's dynamo replaces Module.__init__ and __setstate__ (to
# tag modules made inside a forward) and the __setattr__ of classes it tracks. A wrapper's origin cannot be told
# from a submission's (a code object's file name is whatever compile() was given), and these run when a module is
# built, unpickled or assigned to, not in a timed call of a KernelBench reference.
_NN_UNWATCHED = frozenset({"__init__", "__setstate__", "__setattr__"})


def _nn_module_classes() -> list[tuple[str, type]]:
    return [(name, cls) for name, cls in sorted(vars(torch.nn).items())
            if isinstance(cls, type) and issubclass(cls, torch.nn.Module)]


def _is_method_like(value) -> bool:
    return callable(value) or isinstance(value, (classmethod, staticmethod, property))


def torch_namespace_changes(snapshot: dict[str, object]) -> list[str]:
    import torch.nn.functional as F

    owners = {"torch": torch, "F": F, "torch.Tensor": torch.Tensor}
    classes = dict(_nn_module_classes())
    changed = []
    for name, original in snapshot.items():
        prefix, _, attr = name.rpartition(".")
        if prefix.startswith("torch.nn.") and prefix[len("torch.nn."):] in classes:
            cls = classes[prefix[len("torch.nn."):]]
            if attr == "<methods>":
                added = sorted(a for a, v in vars(cls).items()
                               if _is_method_like(v) and a not in original and a not in _NN_UNWATCHED)
                changed += [f"{prefix}.{a} (added)" for a in added]
            elif vars(cls).get(attr) is not original:
                changed.append(name)
            continue
        owner = owners.get(prefix)
        try:
            current = inspect.getattr_static(owner, attr)
        except AttributeError:
            changed.append(name)
            continue
        if current is not original and not _dynamo_seed_wrapper(name, current, original):
            changed.append(name)
    return sorted(changed)

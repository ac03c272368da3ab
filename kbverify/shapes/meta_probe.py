"""Running a task's reference without its memory: on the meta device, and for real on the CPU when it is small.

What a probe shows (input shapes, constructor signature, estimated bytes, whether the reference ran) is what the
hidden-shape rule compares between a task and its rewritten variants.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

from kbverify.core.tasks import Task, execute_task, source_sha256

# A real CPU run (the only place finiteness can be checked) is made when it is cheap: bytes bound the
# memory, counted matmul/convolution flops bound the time.
CPU_CHECK_MAX_BYTES = 64 * 2**20
CPU_CHECK_MAX_FLOPS = 4 * 10**9


def device_mode(device: str):
    """A context in which every tensor the task makes lives on `device`, explicitly named devices included."""
    import torch
    from torch.overrides import TorchFunctionMode

    def redirect(value):
        return device if isinstance(value, (str, torch.device)) else value

    class _RedirectDevices(TorchFunctionMode):
        # `torch.device(...)` only sets a default; tasks that ask for device="cuda" or call .cuda()
        # would still reach for a GPU.
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in (torch.Tensor.cuda, torch.Tensor.cpu):
                return args[0]
            if "device" in kwargs:
                kwargs["device"] = device
            if func is torch.Tensor.to:
                args = tuple(redirect(a) for a in args)
            return func(*args, **kwargs)

    stack = contextlib.ExitStack()
    stack.enter_context(torch.device(device))
    stack.enter_context(_RedirectDevices())
    return stack


def meta_mode():
    """Every tensor on the meta device: shapes and dtypes without memory or compute."""
    return device_mode("meta")


@dataclass(frozen=True)
class Probe:
    """What one execution of a task's `get_inputs()`/`get_init_inputs()` (and maybe its model) showed."""

    input_shapes: tuple | None
    init_signature: tuple | None = None
    estimated_bytes: int | None = None
    validation: str | None = None  # set when the reference constructed and ran
    peak_bytes: int | None = None  # the reference's peak of live tensors on meta (`PeakCounter`), inputs included
    error: str | None = None


@contextlib.contextmanager
def quiet():
    # Task files print and warn; a library must not pass that on.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def execute_source(task: Task, source: str) -> dict:
    """The namespace of `task` executed from `source` (a rewritten variant of its file)."""
    return execute_task(dataclasses.replace(task, source=source, sha256=source_sha256(source)))


def probe_inputs(task: Task, source: str) -> Probe:
    """The input shapes and constructor signature `source` gives, from `get_inputs()` alone, on meta."""
    try:
        with quiet(), meta_mode():
            namespace = execute_source(task, source)
            init = namespace["get_init_inputs"]()
            inputs = namespace["get_inputs"]()
        return Probe(input_shapes=_shapes(inputs), init_signature=_signature(init))
    except (Exception, SystemExit) as error:  # noqa: BLE001 - a failing task is data here
        return Probe(input_shapes=None, error=f"get_inputs: {describe(error)}")


def validate(task: Task, source: str) -> Probe:
    """Construct and run the reference on `source`: on meta, and for real on the CPU when small."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with quiet(), meta_mode():
            namespace = execute_source(task, source)
            init = namespace["get_init_inputs"]()
            inputs = namespace["get_inputs"]()
    except (Exception, SystemExit) as error:  # noqa: BLE001
        return Probe(input_shapes=None, error=f"get_inputs on meta: {describe(error)}")
    shapes, signature = _shapes(inputs), _signature(init)
    model, how = _construct_on_meta(task, source, namespace, init)
    if isinstance(model, str):
        return Probe(shapes, signature, error=model)
    meta_error, outputs, flops = None, None, 0
    resident = _tensor_bytes(inputs) + _tensor_bytes(list(model.parameters()) + list(model.buffers()))
    peak = PeakCounter(resident)
    try:
        with quiet(), meta_mode(), torch.no_grad(), FlopCounterMode(display=False) as counter, peak:
            outputs = model(*inputs)
        flops = counter.get_total_flops()
    except (Exception, SystemExit) as error:  # noqa: BLE001
        meta_error = f"forward on meta: {describe(error)}"
    estimated = resident + (_tensor_bytes(outputs) if outputs is not None else 0)
    peak_bytes = None if meta_error else max(peak.peak, estimated)
    if estimated > CPU_CHECK_MAX_BYTES or flops > CPU_CHECK_MAX_FLOPS:
        if meta_error:
            return Probe(shapes, signature, estimated, error=f"{meta_error}; too big for a CPU run")
        return Probe(shapes, signature, estimated, validation=how, peak_bytes=peak_bytes)
    cpu_error = _run_on_cpu(task, source)
    if cpu_error:
        return Probe(shapes, signature, estimated, error=cpu_error)
    return Probe(shapes, signature, estimated, validation="cpu" if meta_error else f"{how}+cpu",
                 peak_bytes=peak_bytes)


def _peak_counter_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class _PeakCounter(TorchDispatchMode):
        """The most bytes of tensors alive at once during a forward on meta: each new (non-view) output of an op
        counts from its creation until it is freed, on top of what was resident before (inputs, weights)."""

        def __init__(self, resident: int):
            super().__init__()
            self.live = self.peak = resident

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            import weakref

            import torch

            out = func(*args, **(kwargs or {}))
            known = {id(value) for value in tensors(list(args) + list((kwargs or {}).values()))}
            for tensor in tensors(out):
                if id(tensor) in known or tensor._base is not None or not isinstance(tensor, torch.Tensor):
                    continue
                size = tensor.numel() * tensor.element_size()
                self.live += size
                weakref.finalize(tensor, self._free, size)
            self.peak = max(self.peak, self.live)
            return out

        def _free(self, size: int) -> None:
            self.live -= size

    return _PeakCounter


def PeakCounter(resident: int):  # noqa: N802 - a class, built on first use (torch is imported lazily here)
    return _peak_counter_class()(resident)


def _construct_on_meta(task: Task, source: str, namespace: dict, init: list):
    """(model on meta, how) or (error text, None). Falls back to building on the CPU and moving to meta,
    for constructors that read values (`.item()` on a linspace)."""
    try:
        with quiet(), meta_mode():
            return namespace["Model"](*init), "meta"
    except (Exception, SystemExit) as meta_error:  # noqa: BLE001
        try:
            with quiet():
                cpu_namespace = execute_source(task, source)
                model = cpu_namespace["Model"](*cpu_namespace["get_init_inputs"]())
            return model.to("meta"), "cpu-init+meta"
        except (Exception, SystemExit) as error:  # noqa: BLE001
            return f"Model(*get_init_inputs()): {describe(error)} (on meta: {describe(meta_error)})", None


def _run_on_cpu(task: Task, source: str) -> str | None:
    """Run the reference for real; None when it ran and every floating output is finite."""
    import torch

    try:
        with quiet(), torch.random.fork_rng(devices=[]), torch.no_grad(), device_mode("cpu"):
            torch.manual_seed(0)
            namespace = execute_source(task, source)
            model = namespace["Model"](*namespace["get_init_inputs"]())
            outputs = model(*namespace["get_inputs"]())
    except (Exception, SystemExit) as error:  # noqa: BLE001
        return f"CPU run: {describe(error)}"
    for tensor in tensors(outputs):
        if tensor.is_floating_point() or tensor.is_complex():
            if not bool(torch.isfinite(tensor).all()):
                return "CPU run: non-finite output"
    return None


def tensors(value: object) -> Iterable:
    """Every tensor in a nested argument or output."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors(item)


def _tensor_bytes(value: object) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(value))


def _shapes(inputs: object) -> tuple:
    import torch

    items = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    return tuple(tuple(item.shape) if isinstance(item, torch.Tensor) else None for item in items)


def _signature(value: object) -> tuple:
    """A comparable summary of constructor arguments: tensors by shape and dtype, the rest by repr."""
    import torch

    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if isinstance(value, (list, tuple)):
        return tuple(_signature(item) for item in value)
    return ("value", repr(value))


def describe(error: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


"""The child side of `kbverify.audit.footprint`: a task's tensor bytes measured on the `meta` device.

A meta tensor has a shape, a dtype and no storage, so building a task's model and inputs there and running its
forward costs milliseconds whatever the sizes. Three levels of answer, best first:
  full       inputs + parameters and buffers + outputs
  no_outputs the forward failed on meta (data-dependent shapes, `.item()`, numpy, an op without a meta kernel)
             or ran past FORWARD_LIMIT_S: inputs + parameters and buffers
  unknown    the inputs or the model could not be built on meta
A model whose `__init__` needs real values (`[x.item() for x in torch.linspace(...)]` in the Swin tasks) is built
again with only its parameters and buffers on meta (as accelerate's `init_empty_weights` does) before giving up.
"""

from __future__ import annotations

import contextlib
import signal
import time

import torch

from kbverify.core.tasks import execute_task, parse_task
from kbverify.judge.correctness import flatten_outputs
from kbverify.worker.worker import announce, short_error

# On meta, recurrent layers run torch's Python decompositions step by step: 4-10 s for KernelBench's LSTMs and
# GRUs against milliseconds for everything else. Their outputs are small next to their inputs, so a forward
# cut off here loses little.
FORWARD_LIMIT_S = 0.5


class _OverTime(Exception):
    pass


def footprint_job(payload: dict) -> dict:
    """Footprints of a batch of tasks (one child for all: a fork per task would cost more than the measuring).
    With a CUDA `device`, also that device's total memory, so the parent never has to touch CUDA itself."""
    # A tensor-scalar product is the first op to need torch's Python meta kernels, which load in ~1 s: load them
    # here, outside any task's time limit.
    torch.empty(1, device="meta") * 1.0
    footprints = {}
    for item in payload["tasks"]:
        announce(f"footprint:{item['key']}")
        footprints[item["key"]] = measure(item["task_source"], item["task_name"])
    result: dict = {"footprints": footprints}
    if str(payload.get("device", "cpu")).startswith("cuda"):
        result["device_total_bytes"] = torch.cuda.get_device_properties(0).total_memory
    return result


def measure(source: str, name: str) -> dict:
    """One task's bytes by kind and how far the measurement got (`status`), with the first error met."""
    started = time.perf_counter()
    record: dict = {"status": "unknown", "input_bytes": None, "parameter_bytes": None, "output_bytes": None,
                    "error": None}
    try:
        # The task's top level runs under meta too: a module-level tensor must not allocate either.
        with torch.device("meta"):
            namespace = execute_task(parse_task(source, name=name))
            inputs = list(namespace["get_inputs"]())
        model = _build_model(namespace)
        record["input_bytes"] = tensor_bytes(inputs)
        record["parameter_bytes"] = tensor_bytes([*model.parameters(), *model.buffers()])
        record["status"] = "no_outputs"
        with torch.device("meta"), torch.no_grad(), _time_limit(FORWARD_LIMIT_S):
            outputs = model(*inputs)
        record["output_bytes"] = tensor_bytes(flatten_outputs(outputs))
        record["status"] = "full"
    except BaseException as error:  # noqa: BLE001 - task code failing on meta is an answer, not a crash
        record["error"] = short_error(error, 300)
    record["seconds"] = time.perf_counter() - started
    return record


def _build_model(namespace: dict):
    with torch.device("meta"):
        init_inputs = namespace["get_init_inputs"]()
        model = _model_or_none(namespace, init_inputs)
    if model is not None:
        return model
    with _parameters_on_meta():
        return namespace["Model"](*init_inputs)


def _model_or_none(namespace: dict, init_inputs):
    try:
        return namespace["Model"](*init_inputs)
    except Exception:  # noqa: BLE001 - an __init__ that needs real values: the caller builds it another way
        return None


@contextlib.contextmanager
def _parameters_on_meta():
    """Tensors made in `__init__` are real (CPU) ones, but every parameter and buffer moves to meta as it is
    registered, so the initialisers that follow touch no memory. `torch.empty` of a large parameter reserves
    address space only until then."""
    module = torch.nn.Module
    register_parameter, register_buffer = module.register_parameter, module.register_buffer

    def parameter_on_meta(self, name, param):
        if param is not None:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register_parameter(self, name, param)

    def buffer_on_meta(self, name, tensor, persistent=True):
        register_buffer(self, name, None if tensor is None else tensor.to("meta"), persistent)

    module.register_parameter, module.register_buffer = parameter_on_meta, buffer_on_meta
    try:
        yield
    finally:
        module.register_parameter, module.register_buffer = register_parameter, register_buffer


@contextlib.contextmanager
def _time_limit(seconds: float):
    def over(signum, frame):
        raise _OverTime(f"the forward on meta took over {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def tensor_bytes(values) -> int:
    """Bytes of the distinct tensors among `values` (a tensor listed twice is held once)."""
    seen: dict[int, int] = {}
    for value in values:
        if isinstance(value, torch.Tensor):
            seen[id(value)] = value.numel() * value.element_size()
    return sum(seen.values())

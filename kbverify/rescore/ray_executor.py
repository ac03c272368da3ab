"""`rescore --executor ray`: units as Ray tasks, each asking for one GPU, on whatever nodes the cluster has.

Each task runs on its node what the local executor runs on this machine: the submission's native build (into the
node's own build cache: builds happen where they are evaluated) and the unit's evaluation, in sandboxed children
(the task itself, like the CLI, never imports torch). Before any work it checks that its node is the machine and
software the run was started for (`kbverify.harness.provenance.compat_key`, the key the store checks for a whole run): a
node that differs evaluates nothing and the unit is an infrastructure error, not a verdict, unless the run allows
a mix. Verdicts come back to the driver as they finish (`ray.wait`) and go into its store one transaction each
(`kbverify.rescore.rescore.Sink`), so a cut run resumes exactly as a local one does.

Ray is an optional extra (`pip install 'kbverify[ray]'`). The driver connects to `address` (the `--ray-address`
option, else `RAY_ADDRESS`, else a local cluster of this machine). The A/A noise margins a local run caches in the
store are measured afresh on the nodes (the store is the driver's).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time

from kbverify.core.errors import InfrastructureError, InputError

log = logging.getLogger(__name__)

MISSING = "--executor ray needs Ray, which is not installed: pip install 'kbverify[ray]' (or pip install ray)"


def require_ray():
    """The ray module, or InputError (exit 2) with one line saying how to get it."""
    try:
        import ray
    except ImportError:
        raise InputError(MISSING) from None
    return ray


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a unit ran: for the record and for tests (the GPUs Ray gave the task)."""

    unit_key: str
    node: str
    gpu_ids: tuple
    seconds: float


class RayExecutor:
    """Runs units as Ray tasks (`resources_per_unit`: what each asks for, one GPU by default)."""

    def __init__(self, options, *, address: str | None = None, allow_mixed: bool = False,
                 resources_per_unit: dict | None = None, init_kwargs: dict | None = None):
        self.options = options
        self.address = address if address is not None else os.environ.get("RAY_ADDRESS")
        self.allow_mixed = allow_mixed
        self.resources = dict(resources_per_unit or {"num_gpus": 1})
        self.init_kwargs = dict(init_kwargs or {})
        self.placements: list[Placement] = []
        self._ray = None

    def _connect(self):
        if self._ray is None:
            ray = require_ray()
            if not ray.is_initialized():
                try:
                    ray.init(address=self.address or None, include_dashboard=False, log_to_driver=False,
                             **self.init_kwargs)
                except (ConnectionError, RuntimeError, ValueError) as error:
                    raise InfrastructureError(f"cannot reach the Ray cluster at {self.address or 'local'}: "
                                              f"{error}") from None
            self._ray = ray
        return self._ray

    @property
    def workers(self) -> int:
        """How many units can run at once: the cluster's GPUs (or the resource each unit asks for)."""
        ray = self._connect()
        total = ray.cluster_resources()
        per_unit = {"num_gpus": "GPU", "num_cpus": "CPU"}
        counts = [total.get(per_unit.get(name, name), 0) / amount
                  for name, amount in self.resources.items() if name != "resources" and amount]
        counts += [total.get(name, 0) / amount for name, amount in self.resources.get("resources", {}).items()]
        return max(1, int(min(counts))) if counts else 1

    def provenance(self, device: str) -> dict:
        """The machine the run is for: what a node that gets a unit reports (a task asking what units ask)."""
        ray = self._connect()
        probe = ray.remote(max_retries=0, **self.resources)(_node_provenance)
        return ray.get(probe.remote(_node_device(device)))

    def run(self, units: list, sink) -> None:
        ray = self._connect()
        task = ray.remote(max_retries=0, **self.resources)(run_unit)
        pending = {task.remote(unit, self.options, sink.compat_key, self.allow_mixed): unit for unit in units}
        try:
            while pending and not sink.stopped:
                (ready,), _ = ray.wait(list(pending), num_returns=1)
                unit = pending.pop(ready)
                try:
                    outcome = ray.get(ready)
                except Exception as error:  # noqa: BLE001 - a bug of ours in the task, or the node died
                    if _node_lost(ray, error):
                        sink.error(unit, f"its Ray node was lost: {error}")
                        continue
                    sink.failure(error)
                    break
                self._take(unit, outcome, sink)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def _take(self, unit, outcome: dict, sink) -> None:
        if outcome["error"] is not None:
            sink.error(unit, f"on {outcome['node']}: {outcome['error']}")
            return
        self.placements.append(Placement(unit.key, outcome["node"], tuple(outcome["gpu_ids"]), outcome["seconds"]))
        sink.verdict(unit, outcome["verdict"], outcome["seconds"], f"{outcome['node']}:{outcome['device']}")


def _node_lost(ray, error: Exception) -> bool:
    lost = tuple(getattr(ray.exceptions, name) for name in ("NodeDiedError", "WorkerCrashedError",
                                                             "ObjectLostError") if hasattr(ray.exceptions, name))
    return isinstance(error, lost)


def _node_device(device: str) -> str:
    """Ray hands a task its GPUs through CUDA_VISIBLE_DEVICES: the first one it sees is the task's."""
    return "cuda:0" if device.startswith("cuda") else "cpu"


def _node_provenance(device: str) -> dict:
    from kbverify.harness import provenance

    return provenance.collect(device)


def run_unit(unit, options, compat_key: str, allow_mixed: bool) -> dict:
    """One unit on a Ray node: its node's compatibility checked, its build made here, its evaluation. Returns a
    plain dict (verdict or infrastructure error), never raises for the unit's own faults."""
    import ray

    from kbverify.harness import provenance
    from kbverify.rescore.rescore import build_submission, evaluate_unit, needs_build

    started = time.monotonic()
    device = _node_device(options.device)
    node = socket.gethostname()
    outcome = {"node": node, "device": device, "gpu_ids": list(ray.get_gpu_ids()), "verdict": None, "error": None,
               "seconds": 0.0}
    # Units run one per GPU of the node, side by side: two compiler jobs per build keep a node of 8 GPUs within
    # 16 cores.
    options = dataclasses.replace(options, device=device, max_jobs=options.max_jobs or 2)
    try:
        key = provenance.compat_key(provenance.collect(device))
        if key != compat_key and not allow_mixed:
            outcome["error"] = (f"this node is another machine/software ({key}); the run is for {compat_key}: "
                                f"nothing evaluated here (pass --allow-mixed to accept it)")
            return outcome
        if needs_build(unit.entry):
            build_submission(unit.entry, options)
        outcome["verdict"] = evaluate_unit(unit, options)
    except InfrastructureError as error:
        outcome["error"] = str(error)
    outcome["seconds"] = time.monotonic() - started
    return outcome

"""The correctness set run as a user's script runs the model (issue 34): a fresh interpreter that imports the task
and the submission from files, builds ModelNew, loads Model's weights into it and calls it once, at the top
level of its `__main__`, with autograd, the collector and the thread pool in their default state, its signal
dispositions and mask reset, and nothing of kbverify imported. The candidate's worker runs it before it loads the
submission itself, so nothing the submission does in the worker's process can reach the fresh one through that
process (what it can still reach, and what a kernel can still observe: docs/observable.md).

Every other set is called by the harness: the collector off (`kbverify.worker.exact.checked_call`), autograd off,
the harness's frames above `forward`, one intra-op thread. A kernel that computes honestly only when it sees
those (corpus: exploits/relu_honest_only_while_the_collector_is_off) is right in every judged set and wrong here.
This module only runs the script and hands its output over, with what the call saw as evidence; the judge
compares the output with the reference like any set's and decides (kbverify.judge).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import string
import subprocess
import sys
import tempfile
import time

import torch

from kbverify.core import output_structure
from kbverify.core.inputs import derive_seed
from kbverify.judge.correctness import flatten_outputs
from kbverify.worker import guards
from kbverify.worker.output_handover import publish_nothing, publish_output
from kbverify.worker.worker import short_error

log = logging.getLogger(__name__)

# The script, as a user would write it, but for its first lines: signal dispositions ignored by inheritance (a
# worker's supervisor may ignore some) and a blocked mask are what a fresh shell's `python <script>` would not have.
# Python's own start-up state (SIGINT's handler, SIGPIPE and SIGXFSZ ignored) is kept: a user's script has it.
# Its files (the script, the task, the submission, the inputs, the weights, what it writes back) and its folder get
# fresh random names each run, held in CONFIG, and its source names nothing of kbverify: nothing fixed for a kernel
# to match (corpus: exploits/relu_honest_only_in_a_folder_that_looks_judged).
# `plain` saves the output in a form `torch.load(weights_only=True)` reads: every container as
# [kind, its type if not exactly list/tuple/dict, items], any other object by its type's name, so a structseq
# (torch.return_types.max) or a namedtuple reads back with its type's name for the structure comparison
# (`_rebuild`; corpus: honest/max_values_indices_as_torch_returns_them).
DRIVER = '''\
import gc, importlib.util, json, signal, sys, threading, traceback
for number in signal.valid_signals():
    if number not in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGKILL, signal.SIGSTOP):
        try:
            if signal.getsignal(number) == signal.SIG_IGN:
                signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
signal.pthread_sigmask(signal.SIG_SETMASK, [])
import torch

CONFIG = @CONFIG@


def named(kind, exact):
    return None if kind is exact else [kind.__module__, kind.__qualname__]


def plain(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, (list, tuple)):
        exact = list if isinstance(value, list) else tuple
        return [exact.__name__, named(type(value), exact), [plain(item) for item in value]]
    if isinstance(value, dict):
        return ["dict", named(type(value), dict), [[key, plain(item)] for key, item in value.items()]]
    if value is None or type(value) in (bool, int, float, complex, str):
        return value
    return ["object", named(type(value), None), []]


try:
    task = importlib.import_module(CONFIG["task"])
    submission = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location(CONFIG["submission"], CONFIG["submission"] + ".py"))
    submission.__dict__.update({k: v for k, v in vars(task).items() if not k.startswith("__")})
    sys.modules[CONFIG["submission"]] = submission
    submission.__spec__.loader.exec_module(submission)
    device = torch.device(CONFIG["device"])
    torch.manual_seed(CONFIG["weight_seed"])
    model = submission.ModelNew(*task.get_init_inputs())
    try:
        model.load_state_dict(torch.load(CONFIG["weights"]))
    except Exception:
        pass  # parameters named otherwise: the weights its own initialisation made under the same seed
    model = model.to(device)
    if not CONFIG["train"]:
        model.eval()
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in torch.load(CONFIG["inputs"])]
    seen = {"gc_enabled": gc.isenabled(), "grad_enabled": torch.is_grad_enabled(),
            "python_threads": threading.active_count(), "torch_threads": torch.get_num_threads()}
    torch.manual_seed(CONFIG["call_seed"])
    open(CONFIG["calling"], "w").close()
    output = model(*inputs)
    if device.type == "cuda":
        torch.cuda.synchronize()
    torch.save(plain(output), CONFIG["output"])
    json.dump(seen, open(CONFIG["seen"], "w"))
except BaseException:
    open(CONFIG["error"], "w").write(traceback.format_exc()[-4000:])
    sys.exit(1)
'''

# What the script's process must not inherit of the worker's environment: kbverify's own settings.
_HARNESS_ENV_PREFIX = "KBVERIFY"


# The harness's own module name for the submission (kbverify.worker.evaluate): a type the script names by the
# submission's or the task's random module is named as the harness's calls name it, so structures compare alike.
_SUBMISSION_MODULE = "kbverify_submission"
_FILES = ("main", "task", "submission", "weights", "inputs", "output", "seen", "error", "log", "calling")
_MAX_NODES = 100_000  # an output read back with more parts than this is not an answer


def run_set(submission_source: str, task_source: str, inputs: list, weights: dict, input_set: dict, device,
            train: bool, outdir: str, task_module: str | None = None, calling=None) -> dict:
    """The set's record, its output handed over (or the judge told there is none). `inputs`: the set's draw;
    `weights`: Model's state under the set's weight seed, which the script loads as a user loads a checkpoint;
    `task_module`: the task's module name in the harness's processes, for the output's structure; `calling`:
    called once the script is about to call forward (its imports and builds done), to announce a forward phase,
    so a forward that hangs there is held to the hang budget as in any other set (tests/test_hang.py)."""
    names = fresh_names()
    folder = tempfile.mkdtemp(prefix=names.pop("folder"))
    try:
        torch.save([x.cpu() if isinstance(x, torch.Tensor) else x for x in inputs],
                   os.path.join(folder, names["inputs"]))
        torch.save(weights, os.path.join(folder, names["weights"]))
        _write_script(folder, names, submission_source, task_source, input_set, device, train)
        entry = _run_script(folder, names, calling)
        if "error" not in entry:
            modules = {names["submission"]: _SUBMISSION_MODULE, names["task"]: task_module or names["task"]}
            entry = _take_output(os.path.join(folder, names["output"]), modules, inputs, entry)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if "saved" in entry:
        saved = entry.pop("saved")
        try:
            entry["published"] = publish_output(outdir, input_set["set_id"], saved)
        except Exception as error:  # noqa: BLE001 - an output that cannot be handed over is the candidate's
            entry.update(error="output cannot be handed over: " + short_error(error), bad_output=True)
    if not entry.get("published"):
        publish_nothing(outdir, input_set["set_id"])
    return entry


def fresh_names() -> dict[str, str]:
    """A random name for the folder and each file, new each run: lowercase letters, 6 to 12 of them (a module
    name for the script, the task and the submission, which Python imports by them), all distinct."""
    chosen: set[str] = set()
    while len(chosen) < len(_FILES) + 1:
        chosen.add("".join(secrets.choice(string.ascii_lowercase) for _ in range(6 + secrets.randbelow(7))))
    stems = dict(zip(("folder", *_FILES), chosen))
    suffixes = {"main": ".py", "weights": ".pt", "inputs": ".pt", "output": ".pt", "seen": ".json", "log": ".txt"}
    return {key: stem + suffixes.get(key, "") for key, stem in stems.items()}


def _write_script(folder: str, names: dict, submission_source: str, task_source: str, input_set: dict, device,
                  train: bool):
    config = {"device": str(device), "weight_seed": input_set["weight_seed"], "train": train,
              "call_seed": derive_seed(str(input_set["seed"]), "call"),
              **{key: names[key] for key in ("task", "submission", "weights", "inputs", "output", "seen", "error",
                                             "calling")}}
    for name, text in ((names["main"], DRIVER.replace("@CONFIG@", repr(config))),
                       (names["task"] + ".py", task_source), (names["submission"] + ".py", submission_source)):
        with open(os.path.join(folder, name), "w") as file:
            file.write(text)


def _run_script(folder: str, names: dict, calling=None) -> dict:
    """`python <main>` in `folder`, its output to a file (no pipe: no reader thread in this process). `calling`
    runs once the script has made its `calling` file (see run_set)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(_HARNESS_ENV_PREFIX)}
    started = time.monotonic()
    marker = os.path.join(folder, names["calling"])
    with open(os.path.join(folder, names["log"]), "wb") as output:
        process = subprocess.Popen([sys.executable, names["main"]], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT, restore_signals=True, close_fds=True)
        while True:
            try:
                code = process.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                if calling is not None and os.path.exists(marker):
                    calling()
                    calling = None
    evidence = {"exit_code": code, "wall_s": round(time.monotonic() - started, 3)}
    log.debug("the set as a user calls it: exit %s after %.2f s", code, evidence["wall_s"])
    try:
        with open(os.path.join(folder, names["seen"])) as file:
            evidence.update(json.load(file))
    except (OSError, ValueError):
        pass
    if code == 0:
        return {"as_user": evidence}
    error = _read_text(os.path.join(folder, names["error"])) or _read_text(os.path.join(folder, names["log"]))
    what = f"died by signal {-code}" if code < 0 else f"exited {code}"
    return {"as_user": evidence, "error": f"as a user calls it, the script {what}: " + error.strip()[-1500:],
            "traceback": error[-4000:]}


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as file:
            return file.read()[-8000:]
    except OSError:
        return ""


def _take_output(path: str, modules: dict, inputs: list, entry: dict) -> dict:
    """The script's output, read without running any code of its (weights_only), described like any set's."""
    try:
        raw = rebuild(torch.load(path, weights_only=True), modules)
    except Exception as error:  # noqa: BLE001 - a type torch.load refuses to build, a malformed form: not an answer
        return {**entry, "error": "as a user calls it, the output cannot be read back: " + short_error(error, 600),
                "bad_output": True, "outputs": {}}
    entry["structure"] = output_structure.describe(raw)
    first = flatten_outputs(raw)
    entry["mutated_inputs"] = []
    entry["outputs"] = guards.inspect_outputs(first, inputs)
    strange = [type(t).__name__ for t in first if not isinstance(t, torch.Tensor)]
    if strange:
        return {**entry, "error": f"output is not made of tensors: {', '.join(strange)}", "bad_output": True}
    entry["saved"] = [t.detach().clone().cpu() for t in first]
    return entry


_BASES = {"list": list, "tuple": tuple, "dict": dict, "object": object}
_LEAVES = (torch.Tensor, bool, int, float, complex, str, type(None))


def rebuild(saved, modules: dict, budget: list | None = None):
    """The output as the harness's calls hold it, from the script's saved form (DRIVER's `plain`): each container
    of its exact type, or of a stand-in type named as the script named it (its module mapped by `modules`), so
    `output_structure.describe` and `flatten_outputs` read it as they read the other sets' outputs: a
    torch.return_types.max is "type:torch.return_types.max" and flattens to its values and indices (corpus:
    honest/max_values_indices_as_torch_returns_them). A form the script does not write raises ValueError."""
    budget = budget if budget is not None else [_MAX_NODES]
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError(f"the output has more than {_MAX_NODES} parts")
    if isinstance(saved, _LEAVES):
        return saved
    if not isinstance(saved, list) or len(saved) != 3 or saved[0] not in _BASES or not isinstance(saved[2], list):
        raise ValueError(f"the output is not in the script's form: {type(saved).__name__}")
    kind, name, items = saved
    made = _stand_in(_BASES[kind], name, modules)
    if kind == "object":
        return made()
    if kind == "dict":
        return made((key, rebuild(item, modules, budget)) for key, item in items)
    return made(rebuild(item, modules, budget) for item in items)


def _stand_in(base: type, name, modules: dict) -> type:
    """`base` itself for an exact container, else a subclass of it named [module, qualname] as the script saw."""
    if name is None and base is not object:
        return base
    module, qualname = name
    if not (isinstance(module, str) and isinstance(qualname, str)):
        raise ValueError("the output names a type by something other than its module and name")
    return type(qualname.rpartition(".")[2] or "object", (base,),
                {"__module__": modules.get(module, module), "__qualname__": qualname})

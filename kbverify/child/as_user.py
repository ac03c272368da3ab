"""The correctness set run as a user's script runs the model (issue 34): a fresh interpreter that imports the task
and the submission from files, builds ModelNew, loads Model's weights into it and calls it once, at the top
level of its `__main__`, with autograd, the collector and the thread pool in their default state, its signal
dispositions and mask reset, and nothing of kbverify imported. The candidate's worker runs it before it loads the
submission itself, so nothing the submission does in the worker's process can reach the fresh one through that
process (what it can still reach, and what a kernel can still observe: docs/observable.md).

Every other set is called by the harness: the collector off (`kbverify.child.exact.checked_call`), autograd off,
the harness's frames above `forward`, one intra-op thread. A kernel that computes honestly only when it sees
those (corpus: exploits/relu_honest_only_while_the_collector_is_off) is right in every judged set and wrong here.
This module only runs the script and hands its output over, with what the call saw as evidence; the judge
compares the output with the reference like any set's and decides (kbverify.judge).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time

import torch

from kbverify import output_structure
from kbverify.child import guards
from kbverify.child.output_handover import publish_nothing, publish_output
from kbverify.child.worker import short_error
from kbverify.correctness import flatten_outputs
from kbverify.inputs import derive_seed

log = logging.getLogger(__name__)

# The script, as a user would write it, but for its first lines: signal dispositions ignored by inheritance (a
# worker's supervisor may ignore some) and a blocked mask are what a fresh shell's `python main.py` would not have.
# Python's own start-up state (SIGINT's handler, SIGPIPE and SIGXFSZ ignored) is kept: a user's script has it.
DRIVER = '''\
import gc, json, signal, sys, threading, traceback
for number in signal.valid_signals():
    if number not in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGKILL, signal.SIGSTOP):
        try:
            if signal.getsignal(number) == signal.SIG_IGN:
                signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
signal.pthread_sigmask(signal.SIG_SETMASK, [])
import importlib.util
import torch


def plain(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if type(value) in (list, tuple):
        return type(value)(plain(item) for item in value)
    if type(value) is dict:
        return {key: plain(item) for key, item in value.items()}
    return value


try:
    config = json.load(open("run.json"))
    import task
    spec = importlib.util.spec_from_file_location("submission", "submission.py")
    submission = importlib.util.module_from_spec(spec)
    submission.__dict__.update({k: v for k, v in vars(task).items() if not k.startswith("__")})
    sys.modules["submission"] = submission
    spec.loader.exec_module(submission)
    device = torch.device(config["device"])
    torch.manual_seed(config["weight_seed"])
    model = submission.ModelNew(*task.get_init_inputs())
    try:
        model.load_state_dict(torch.load("weights.pt"))
    except Exception:
        pass  # parameters named otherwise: the weights its own initialisation made under the same seed
    model = model.to(device)
    if not config["train"]:
        model.eval()
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in torch.load("inputs.pt")]
    seen = {"gc_enabled": gc.isenabled(), "grad_enabled": torch.is_grad_enabled(),
            "python_threads": threading.active_count(), "torch_threads": torch.get_num_threads()}
    torch.manual_seed(config["call_seed"])
    output = model(*inputs)
    if device.type == "cuda":
        torch.cuda.synchronize()
    torch.save(plain(output), "output.pt")
    json.dump(seen, open("seen.json", "w"))
except BaseException:
    open("error.txt", "w").write(traceback.format_exc()[-4000:])
    sys.exit(1)
'''

# What the script's process must not inherit of the worker's environment: kbverify's own settings.
_HARNESS_ENV_PREFIX = "KBVERIFY"


def run_set(submission_source: str, task_source: str, inputs: list, weights: dict, input_set: dict, device,
            train: bool, outdir: str) -> dict:
    """The set's record, its output handed over (or the judge told there is none). `inputs`: the set's draw;
    `weights`: Model's state under the set's weight seed, which the script loads as a user loads a checkpoint."""
    folder = tempfile.mkdtemp(prefix="user-")
    torch.save([x.cpu() if isinstance(x, torch.Tensor) else x for x in inputs], os.path.join(folder, "inputs.pt"))
    torch.save(weights, os.path.join(folder, "weights.pt"))
    _write_script(folder, submission_source, task_source, input_set, device, train)
    entry = _run_script(folder)
    if "error" not in entry:
        entry = _take_output(folder, inputs, entry)
    if "saved" in entry:
        saved = entry.pop("saved")
        try:
            entry["published"] = publish_output(outdir, input_set["set_id"], saved)
        except Exception as error:  # noqa: BLE001 - an output that cannot be handed over is the candidate's
            entry.update(error="output cannot be handed over: " + short_error(error), bad_output=True)
    if not entry.get("published"):
        publish_nothing(outdir, input_set["set_id"])
    return entry


def _write_script(folder: str, submission_source: str, task_source: str, input_set: dict, device, train: bool):
    config = {"device": str(device), "weight_seed": input_set["weight_seed"], "train": train,
              "call_seed": derive_seed(str(input_set["seed"]), "call")}
    for name, text in (("main.py", DRIVER), ("task.py", task_source), ("submission.py", submission_source),
                       ("run.json", json.dumps(config))):
        with open(os.path.join(folder, name), "w") as file:
            file.write(text)


def _run_script(folder: str) -> dict:
    """`python main.py` in `folder`, its output to a file (no pipe: no reader thread in this process)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(_HARNESS_ENV_PREFIX)}
    started = time.monotonic()
    with open(os.path.join(folder, "log.txt"), "wb") as output:
        code = subprocess.call([sys.executable, "main.py"], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                               stdout=output, stderr=subprocess.STDOUT, restore_signals=True, close_fds=True)
    evidence = {"exit_code": code, "wall_s": round(time.monotonic() - started, 3)}
    log.debug("the set as a user calls it: exit %s after %.2f s", code, evidence["wall_s"])
    try:
        with open(os.path.join(folder, "seen.json")) as file:
            evidence.update(json.load(file))
    except (OSError, ValueError):
        pass
    if code == 0:
        return {"as_user": evidence}
    error = _read_text(os.path.join(folder, "error.txt")) or _read_text(os.path.join(folder, "log.txt"))
    what = f"died by signal {-code}" if code < 0 else f"exited {code}"
    return {"as_user": evidence, "error": f"as a user calls it, the script {what}: " + error.strip()[-1500:],
            "traceback": error[-4000:]}


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as file:
            return file.read()[-8000:]
    except OSError:
        return ""


def _take_output(folder: str, inputs: list, entry: dict) -> dict:
    """The script's output, read without running any code of its (weights_only), described like any set's."""
    try:
        raw = torch.load(os.path.join(folder, "output.pt"), weights_only=True)
    except Exception as error:  # noqa: BLE001 - a type torch.load refuses to build: not an answer
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

"""The isolated correctness flow (kbv, verified): the candidate runs first, alone, on inputs it owns; a separate
trusted judge process recomputes the same inputs, runs the reference and compares. The reference output never
exists in the candidate's process, so reading freed memory, frames or `gc` finds nothing to copy.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
import torch

from kbverify.core import output_structure
from kbverify.judge.correctness import EXACT_AVAILABLE, flatten_outputs, summarize
from kbverify.worker import as_user, guards
from kbverify.worker.exact import (checked_call as _call, fp64_truth, moved_spreads, over_plain_limits,
                                  summarize_within_moved)
from kbverify.core.inputs import apply_distribution, clone_inputs, derive_seed, draw_inputs
from kbverify.worker.construct import WeightsRefused, construct_candidate, load_weights, names_of
from kbverify.worker.handover_files import handover_limit
from kbverify.worker.output_handover import (await_previous_consumed, discard, publish_nothing, publish_output,
                                            take_output, use_cuda_ipc, use_markers)
from kbverify.worker.extensions import ExtensionWatch
from kbverify.worker.precision import set_tf32
from kbverify.worker.worker import (compile_untrusted, announce, device_from, format_traceback, is_cuda_fatal, set_seed,
                             short_error, synchronize, task_from)

POISON_NAN = float("nan")
POISON_SENTINEL = 1234.5678


# ---- shared by candidate and judge -------------------------------------------------------------------------

def shape_namespaces(task, sets: list[dict]) -> dict[str, dict]:
    """Execute the task once per shape configuration (hidden shapes re-execute it with new literals)."""
    from kbverify.core.tasks import execute_task, parse_task
    from kbverify.shapes.hidden import rewrite_constants

    namespaces: dict[str, dict] = {}
    # The submission always runs in the original task's names (a KernelBench prompt's file), even when every set
    # asked for (`check --only`) has a hidden shape.
    for input_set in [{"shape": "original", "overrides": {}}, *sets]:
        shape = input_set["shape"]
        if shape in namespaces:
            continue
        source = task.source if not input_set["overrides"] else rewrite_constants(task.source, input_set["overrides"])
        namespaces[shape] = execute_task(parse_task(source, name=task.name))
    return namespaces


# 0/1 buffers that are statistics, not masks: a BatchNorm's running mean and variance (0 and 1 until trained, which a
# kernel folding them as if they were the identity would rely on). A parameter is never a mask: it is learnt.
REDRAWN_ANYWAY = ("weight", "bias", "running_mean", "running_var")
# Buffers that are statistics of the data, with a domain of their own (a variance is positive): they keep the sign
# they have. Every other tensor redrawn is a weight, and takes random signs.
STATISTICS = ("running_mean", "running_var", "num_batches_tracked")
DEVICE_DRAW_MIN_NUMEL = 1 << 26  # 64 M elements: a quarter of a second or more on a CPU


def rerandomized_state(model: torch.nn.Module, seed: int, draw_device=None) -> dict:
    """Fresh draws for every floating parameter and buffer (a reseed is not enough: norms init to 1 and 0).

    Parameters and affine buffers take a random sign per element, whatever their initial values: trained weights
    are often negative, and a kernel may be right only for positive ones (a maximum taken before a per-channel
    factor; corpus: exploits/groupnorm_pool_before_signed_affine). Statistics buffers (`STATISTICS`) keep their
    domain: one that is positive stays positive. A module defined only for positive weights (a log or a square
    root of a parameter) fails on such a set, and the judge skips it as invalid with the reference's failure as
    evidence, as it does for inputs. Every parameter is redrawn whatever its values (a `scale` or `gamma` of
    ones, a 0/1 scalar); a buffer of 0s and 1s is a mask, structure rather than weights, and stays as it is,
    unless its name says it is a statistic. Tensors are drawn on the CPU, the same on every machine, except
    those above DEVICE_DRAW_MIN_NUMEL elements, drawn on `draw_device` when given: 10⁹ parameters take seconds on
    a CPU and milliseconds on a GPU, but a GPU's draws depend on its generator and launch shape, so processes
    that must agree pass the same device, and such weights reproduce on that GPU model only.
    """
    state = {}
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    for index, (name, value) in enumerate(model.state_dict().items()):
        if not value.is_floating_point() or value.numel() == 0:
            state[name] = value
            continue
        large = draw_device is not None and value.numel() > DEVICE_DRAW_MIN_NUMEL
        device = torch.device(draw_device) if large else torch.device("cpu")
        original = value.detach().float().to(device)
        if (name not in parameters and not name.endswith(REDRAWN_ANYWAY)
                and bool(((original == 0) | (original == 1)).all())):
            state[name] = value
            continue
        generator = torch.Generator(device=device).manual_seed(derive_seed(str(seed), "param", index, name))
        fresh = _redraw(original, generator, signed=not name.endswith(STATISTICS))
        state[name] = fresh.to(dtype=value.dtype, device=value.device)
    return state


def _redraw(original: torch.Tensor, generator: torch.Generator, *, signed: bool) -> torch.Tensor:
    """New values on the original's scale: around its mean where it is all positive (times a random sign per
    element when `signed`, both signs present in any tensor of two elements or more), else normal with its
    spread."""
    device = original.device
    if bool((original > 0).all()):
        fresh = original.mean() * (0.5 + torch.rand(original.shape, generator=generator, device=device))
        if signed:
            negative = torch.rand(original.shape, generator=generator, device=device) < 0.5
            if original.numel() > 1 and bool(negative.all() | ~negative.any()):
                negative.view(-1)[0] = ~negative.view(-1)[0]  # two elements or more: both signs, always
            fresh = torch.where(negative, -fresh, fresh)
        return fresh
    spread = float(original.std()) if original.numel() > 1 else 0.0
    scale = spread if spread > 0 else (float(original.abs().mean()) or 0.1)
    return torch.randn(original.shape, generator=generator, device=device) * scale


def in_protocol_mode(candidate: torch.nn.Module, train: bool) -> torch.nn.Module:
    """A module is built in training mode, which is the mode KernelBench runs both models in; `.train(True)` would
    also switch back any submodule the candidate put in eval mode itself (a BatchNorm on running statistics is
    cheaper and wrong there). So only an eval-mode protocol changes the candidate's modes, all of them."""
    return candidate if train else candidate.eval()


# the weight regimes whose reference holds fresh draws: handed over at construction, or loaded after it
REDRAWN = ("rerandomized", "loaded")


def build_reference(namespace: dict, weight_seed: int, weights: str, device, train: bool, *, draw_device=None):
    """Model built as KernelBench builds it (seeded, on the CPU), then on `device`. Re-randomised weights are
    drawn on `draw_device` (default: `device`): every process that must agree on them draws on the same one."""
    set_seed(weight_seed)
    init_inputs = namespace["get_init_inputs"]()
    model = namespace["Model"](*init_inputs).to(device)
    if weights in REDRAWN:
        model.load_state_dict(rerandomized_state(model, weight_seed, draw_device or device))
    return model.train(train), init_inputs


def set_inputs(namespace: dict, input_set: dict, device) -> list:
    drawn = draw_inputs(namespace, input_set["seed"], device)
    return apply_distribution(drawn, input_set["distribution"], input_set["seed"])


# ---- candidate ---------------------------------------------------------------------------------------------

def candidate_job(payload: dict) -> dict:
    device = device_from(payload)
    task = task_from(payload)
    sets = payload["sets"]
    outdir = payload["outdir"]
    use_markers(payload.get("markers"))
    train = bool(payload.get("train_mode", True))
    guarded = bool(payload.get("guards", True))
    record: dict = {"sets": {}, "warnings": [], "weights_loaded": {}}

    announce("reference:load")
    namespaces = shape_namespaces(task, sets)
    sets = _run_as_user(payload, namespaces["original"], sets, device, train, record)
    snapshot = guards.snapshot_sensitive()
    threads_before = guards.thread_count()
    modes_before = guards.mode_depths()

    announce("candidate:load")
    watch = ExtensionWatch().install()
    # The submission sees the task's names (KernelBench prompts put them in one file) but its own copy of them.
    namespace = {k: v for k, v in namespaces["original"].items() if not k.startswith("__")}
    namespace["__name__"] = "kbverify_submission"
    try:
        exec(compile_untrusted(payload["submission_source"]), namespace)
    except BaseException as error:  # noqa: BLE001 - untrusted code: every failure is data
        return {**record, "load_error": short_error(error, 6000), "extensions": watch.record()}
    ModelNew = namespace.get("ModelNew")
    if ModelNew is None or not isinstance(ModelNew, type):
        return {**record, "load_error": "the submission defines no class ModelNew", "extensions": watch.record()}

    models: dict = {}
    gc.collect()
    gc.freeze()  # as the timing worker does before its rounds: the collector's state is the same in both
    for input_set in sets:
        set_id = input_set["set_id"]
        key = (input_set["shape"], input_set["weights"], input_set["weight_seed"], input_set.get("load_order", ""))
        announce(f"candidate:construct:{set_id}")
        if key not in models:
            models[key] = _build_candidate(ModelNew, namespaces[input_set["shape"]], input_set, device, train, record)
        candidate = models[key]
        if isinstance(candidate, str):
            record["sets"][set_id] = {"skipped": candidate}
            publish_nothing(outdir, set_id)
            continue
        announce(f"candidate:run:{set_id}")
        entry = _run_set(candidate, namespaces[input_set["shape"]], input_set, device, outdir, guarded)
        if not entry.get("published"):
            publish_nothing(outdir, set_id)
        record["sets"][set_id] = entry
        if entry.get("fatal"):
            record["fatal"] = entry["error"]
            break
    record["extensions"] = watch.record(namespace)
    await_previous_consumed(outdir)  # an output shared over CUDA IPC lives only as long as this process
    record["tampered"] = guards.tampered(snapshot) + guards.modes_left_active(modes_before) if guarded else []
    record["threads_started"] = guards.thread_count() - threads_before
    return record


def _run_as_user(payload: dict, namespace: dict, sets: list[dict], device, train: bool, record: dict) -> list[dict]:
    """The sets run as a user's script runs them (kbverify.worker.as_user), first, before the submission is loaded
    in this process, so nothing it does here reaches the script (corpus:
    exploits/relu_honest_only_while_the_collector_is_off); returns the other sets, to run here. The plan puts
    these last (a verdict is named by the harness's sets first) and the judge, like this process, takes them first."""
    for input_set in [s for s in sets if s.get("as_user")]:
        set_id = input_set["set_id"]
        # its imports and builds are a build phase (their own bound); its forward a run phase (the hang budget)
        announce(f"candidate:build:as-user:{set_id}")
        try:
            inputs = set_inputs(namespace, input_set, device)
            weights = build_reference(namespace, input_set["weight_seed"], "default", torch.device("cpu"), train)[0]
        except BaseException as error:  # noqa: BLE001 - the task's own code failed: the judge finds it too
            record["sets"][set_id] = {"input_error": short_error(error)}
            publish_nothing(payload["outdir"], set_id)
            continue
        record["sets"][set_id] = as_user.run_set(payload["submission_source"], payload["task_source"], inputs,
                                                 weights.state_dict(), input_set, device, train, payload["outdir"],
                                                 task_module=namespace["__name__"],
                                                 calling=lambda: announce(f"candidate:run:as-user:{set_id}"))
    return [s for s in sets if not s.get("as_user")]


UNMAPPED = ("weights_not_rerandomized: ModelNew's state_dict matches Model's neither by name nor by value (each "
            "entry equal to exactly one of Model's under the shared seed), and its load_state_dict refuses Model's")


@dataclass
class _Seeded:
    """What every construction for one (shape, weight seed) shares: the generators as they were when ModelNew was
    first called (seeded, init inputs drawn), and Model's default weights under that seed."""

    namespace: dict
    seed: int
    train: bool
    default: dict | None = None

    def reseed(self) -> list:
        set_seed(self.seed)
        return self.namespace["get_init_inputs"]()

    def default_state(self) -> dict:
        if self.default is None:
            self.default = build_reference(self.namespace, self.seed, "default", torch.device("cpu"),
                                           self.train)[0].state_dict()
        return self.default

    def construct(self, ModelNew: type, state: dict):
        return construct_candidate(ModelNew, self.reseed(), state, default_state=self.default_state,
                                   reseed=self.reseed)


def _build_candidate(ModelNew, namespace, input_set, device, train, record):
    """The candidate model for one (shape, weights) pair, or a string saying why there is none."""
    weights, seeded = input_set["weights"], _Seeded(namespace, input_set["weight_seed"], train)
    try:
        state = build_reference(namespace, seeded.seed, weights, torch.device("cpu"), train,
                                draw_device=device)[0].state_dict()
        if weights == "default":
            seeded.default = state
        if weights == "loaded":
            warm = input_set.get("load_order") != "load_first"
            return _loaded(ModelNew, seeded, state, input_set, device, record, warm=warm)
        candidate, how = seeded.construct(ModelNew, state)
    except BaseException as error:  # noqa: BLE001
        return "construct_error: " + short_error(error)
    if how is None:
        if weights == "rerandomized" and _layout_changed(ModelNew, seeded):
            # Its parameters pair with Model's when handed the default weights and not when handed others: a
            # layout that depends on the values it receives is how a kernel would dodge the re-randomised sets.
            return ("weights_layout_changed: ModelNew's state_dict pairs with Model's for the default weights but "
                    "not for re-randomised ones")
        # Not paired at construction; its own load_state_dict may still take Model's weights under Model's names
        # (a parameter kept in another layout, translated by a hook), and then every set gets them that way.
        loaded = _loaded(ModelNew, seeded, state, input_set, device, record, warm=False)
        if weights != "default" or not isinstance(loaded, str):
            return loaded
        try:  # default weights by no route: the candidate as it builds itself, built again (the load touched it)
            candidate = seeded.construct(ModelNew, state)[0]
        except BaseException as error:  # noqa: BLE001
            return "construct_error: " + short_error(error)
    if how == "by_value" and "weights_matched_by_value" not in record["warnings"]:
        record["warnings"].append("weights_matched_by_value")
    record["weights_loaded"][f"{input_set['shape']}/{weights}"] = how
    try:
        return in_protocol_mode(candidate.to(device), train)
    except BaseException as error:  # noqa: BLE001
        return "construct_error: " + short_error(error)


def _layout_changed(ModelNew: type, seeded: _Seeded) -> bool:
    """Whether a candidate that pairs with no re-randomised state would pair when handed the default one."""
    try:
        return seeded.construct(ModelNew, seeded.default_state())[1] is not None
    except BaseException:  # noqa: BLE001 - then it does not pair either way
        return False


def _loaded(ModelNew, seeded: _Seeded, state: dict, input_set: dict, device, record: dict, *, warm: bool = True):
    """ModelNew built as a user builds it (Model's default weights at construction), called once on the task's
    own inputs when `warm` (so a copy derived at the first call and kept is stale after the load; without the
    call, a user's order, a copy refreshed on load only once a call has run is stale), then given `state`
    through its own load_state_dict (`kbverify.worker.construct.load_weights`); or why not."""
    try:
        default = seeded.default_state()
        candidate = seeded.construct(ModelNew, default)[0]
        names = names_of(candidate.state_dict(), default)  # before a call moves any running statistics
        candidate = in_protocol_mode(candidate.to(device), seeded.train)
        if warm:
            own = set_inputs(seeded.namespace, {**input_set, "distribution": "x1"}, device)
            _call(candidate, own, derive_seed(str(input_set["seed"]), "call"))
        how = load_weights(candidate, state, names)
    except WeightsRefused as refused:
        return "weights_load_refused: ModelNew's load_state_dict raised on Model's weights under its own names: " \
               + str(refused)
    except BaseException as error:  # noqa: BLE001
        return "construct_error: " + short_error(error)
    if how is None:
        if input_set["weights"] != "default" and "weights_not_rerandomized" not in record["warnings"]:
            record["warnings"].append("weights_not_rerandomized")
        return UNMAPPED
    route = "/".join(filter(None, (input_set["shape"], input_set["weights"], input_set.get("load_order"))))
    record["weights_loaded"][route] = "load_state_dict:" + how
    return candidate


def _run_set(candidate, namespace, input_set, device, outdir, guarded) -> dict:
    entry: dict = {}
    call_seed = derive_seed(str(input_set["seed"]), "call")
    try:
        inputs = set_inputs(namespace, input_set, device)
    except BaseException as error:  # noqa: BLE001 - the task's own get_inputs failed: not the kernel's fault
        return {"input_error": short_error(error)}
    pristine = clone_inputs(inputs)
    input_bytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    try:
        if guarded:
            guards.poison_allocator(device, POISON_NAN, 2 * input_bytes + (64 << 20))
        raw = _call(candidate, inputs, call_seed)
        synchronize(device)
        entry["structure"] = output_structure.describe(raw)  # the judge compares it with the reference's
        first = flatten_outputs(raw)
        del raw
    except BaseException as error:  # noqa: BLE001
        return {"error": short_error(error), "traceback": format_traceback(error), "fatal": is_cuda_fatal(error)}
    entry["mutated_inputs"] = guards.changed_inputs(pristine, inputs)
    entry["outputs"] = guards.inspect_outputs(first, inputs)
    if entry["outputs"]["lazy"] or entry["outputs"]["no_storage"]:
        return entry
    strange = [type(t).__name__ for t in first if not isinstance(t, torch.Tensor)]
    if strange:
        return {**entry, "error": f"output is not made of tensors: {', '.join(strange)}", "bad_output": True}
    ipc = use_cuda_ipc(device)
    saved = [t.detach().clone() if ipc else t.detach().clone().cpu() for t in first]
    try:
        entry["published"] = publish_output(outdir, input_set["set_id"], saved, ipc=ipc)
    except Exception as error:  # noqa: BLE001 - an output that cannot be handed over is the candidate's failure
        return {**entry, "error": "output cannot be handed over: " + short_error(error), "bad_output": True}
    if guarded:
        del first
        fresh = clone_inputs(pristine)
        try:
            guards.poison_allocator(device, POISON_SENTINEL, 2 * input_bytes + (64 << 20))
            second = flatten_outputs(_call(candidate, fresh, call_seed))
            synchronize(device)
            again = [t.to(device) if isinstance(t, torch.Tensor) else t for t in saved]
            agree, detail = guards.outputs_agree(again, second)
            if not agree:  # by how much, as the judge measures outputs: the judge applies the protocol's limits
                entry["second_vs_first"] = summarize(again, second)
        except BaseException as error:  # noqa: BLE001
            return {**entry, "error": short_error(error), "fatal": is_cuda_fatal(error)}
        entry["deterministic"] = agree
        entry["determinism_detail"] = detail
    return entry


# ---- judge -------------------------------------------------------------------------------------------------

def judge_job(payload: dict) -> dict:
    device = device_from(payload)
    task = task_from(payload)
    sets = payload["sets"]
    outdir = payload["outdir"]
    use_markers(payload.get("markers"))
    train = bool(payload.get("train_mode", True))
    exact_flags = (bool(payload.get("reference_tf32", False)), bool(payload.get("reference_cudnn_tf32", False)))
    want_baseline = bool(payload.get("baseline_tf32", True)) and device.type == "cuda"
    want_fp64 = bool(payload.get("fp64_reference", True))
    # the moves' seeds come from the run's secret through the parent, to this process only: seeded from anything
    # the candidate sees (its inputs' seed), a move's signs could be read back from its inputs' bits
    nudges = {str(k): int(v) for k, v in (payload.get("nudge_seeds") or {}).items()}
    announce("judge:load")
    namespaces = shape_namespaces(task, sets)
    sets = sorted(sets, key=lambda s: not s.get("as_user"))  # in the candidate's order: it runs them first
    models: dict = {}
    record: dict = {"sets": {}}
    for input_set in sets:
        set_id = input_set["set_id"]
        announce(f"judge:{set_id}")
        key = (input_set["shape"], input_set["weights"], input_set["weight_seed"])
        namespace = namespaces[input_set["shape"]]
        try:
            if key not in models:
                models[key] = build_reference(namespace, input_set["weight_seed"], input_set["weights"], device,
                                              train)[0]
            record["sets"][set_id] = _judge_set(models[key], namespace, input_set, device, outdir, exact_flags,
                                                want_baseline, want_fp64, nudges.get(set_id))
        except BaseException as error:  # noqa: BLE001 - the reference failing makes the set invalid
            record["sets"][set_id] = {"valid": False, "invalid_reason": "reference raised: " + short_error(error)}
            if is_cuda_fatal(error):
                break
        if not record["sets"][set_id].get("valid"):
            try:
                take_output(outdir, set_id, "cpu", 0)  # unused, unread, but the candidate waits until it is taken
            except Exception:  # noqa: BLE001 - whatever the candidate left there is its own, never the judge's fault
                discard(outdir, set_id)
    return record


def _judge_set(model, namespace, input_set, device, outdir, exact_flags, want_baseline, want_fp64,
               nudge_seed: int | None = None) -> dict:
    set_id = input_set["set_id"]
    return judge_call(model, set_inputs(namespace, input_set, device), derive_seed(str(input_set["seed"]), "call"),
                      device, exact_flags, want_baseline, want_fp64,
                      lambda reference: take_output(outdir, set_id, device, handover_limit(reference)),
                      nudge_seed, phase=f"judge:compare:{set_id}")


def judge_call(model, inputs, call_seed: int, device, exact_flags, want_baseline, want_fp64, take,
               nudge_seed: int | None = None, *, phase: str) -> dict:
    """One call judged: the reference (exact flags), its float64 truth, the TF32 baseline, and the candidate's
    outputs (`take(reference)`, read under the reference's bound) summarised against each. The one comparison
    the correctness sets and the timed-output check share (kbverify.worker.timing_check); the parent applies the
    protocol's rule to it (kbverify.judge.correctness.judge_set)."""
    pristine = clone_inputs(inputs)
    set_tf32(matmul=exact_flags[0], cudnn=exact_flags[1])
    reference, draws_random, structure = _reference_call(model, inputs, call_seed, device)
    synchronize(device)
    entry: dict = {"valid": True, "ref_structure": structure}
    entry["ref_mutates_inputs"] = guards.changed_inputs(pristine, inputs)
    entry["ref_outputs"] = guards.inspect_outputs(reference, inputs)
    entry["ref_dtypes"] = [str(t.dtype) for t in reference if isinstance(t, torch.Tensor)]
    if any(isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())
           for t in reference):
        return {"valid": False, "invalid_reason": "reference output is not finite"}
    truth, why_not = (fp64_truth(model, pristine, call_seed) if want_fp64
                      else (None, "the protocol asks for no float64 run"))
    if want_fp64:
        entry["reference_vs_fp64"] = summarize(truth, reference) if truth is not None else {"error": why_not}
    if truth is not None and draws_random:
        # the float64 model's random draws need not be the fp32 one's (other dtypes, other kernels): its output
        # is then another sample, not the exact answer; the reference's own error still bounds an allowance
        truth, why_not = None, "the reference's forward draws random numbers, which a float64 run need not repeat"
    entry["exact_reference"] = EXACT_AVAILABLE if truth is not None else f"unavailable ({why_not})"
    if want_baseline:
        set_tf32(matmul=True, cudnn=True)
        baseline = flatten_outputs(_call(model, clone_inputs(pristine), call_seed))
        synchronize(device)
        entry["baseline"] = summarize(reference, baseline)
        if truth is not None:
            entry["baseline_vs_fp64"] = summarize(truth, baseline)
        set_tf32(matmul=exact_flags[0], cudnn=exact_flags[1])
        del baseline
    # the set's reference work is done: the parent reads the reference's pace from these phases (kbverify.harness.hang)
    announce(phase)
    try:
        candidate = take(reference)
        if candidate is not None:
            entry["comparison"] = summarize(reference, candidate)
            if truth is not None:
                entry["candidate_vs_fp64"] = summarize(truth, candidate)
                if nudge_seed is not None and over_plain_limits(entry["candidate_vs_fp64"]):
                    spreads = moved_spreads(model, pristine, call_seed, truth, nudge_seed)
                    if spreads is not None:
                        entry["moved_vs_fp64"] = summarize_within_moved(truth, candidate, spreads)
    except torch.OutOfMemoryError as error:
        # this process's own memory, spent on the comparison of an output read under the reference's bound: the
        # machine's failure (a unit beside it, say), never the kernel's (kbverify.judge.judge_infrastructure)
        entry["infrastructure_error"] = "out of memory comparing the candidate's output: " + short_error(error)
    except Exception as error:  # noqa: BLE001 - the candidate's output, not the reference, is at fault here
        entry["candidate_output_error"] = short_error(error)
    return entry


def _reference_call(model, inputs, call_seed: int, device) -> tuple[list, bool, object]:
    """The reference's outputs, as `_call` makes them, whether its forward drew from the CPU or the device's
    random generator, and its output's structure (kbverify.core.output_structure)."""
    set_seed(call_seed)
    before = _generator_states(device)
    with torch.no_grad():
        raw = model(*inputs)
    after = _generator_states(device)
    return flatten_outputs(raw), any(not torch.equal(a, b) for a, b in zip(before, after)), \
        output_structure.describe(raw)


def _generator_states(device) -> list:
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states

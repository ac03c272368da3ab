"""The audit child's dead-input and dead-parameter check: candidates from one backward pass, confirmed by
perturbation on several seeds."""

from __future__ import annotations

import math

import torch

from kbverify.core.inputs import derive_seed
from kbverify.judge.correctness import flatten_outputs
from kbverify.worker.audit_family import _FamilyContext, _stop_if_out_of_memory
from kbverify.worker.audit_tensors import _diff_norms, _is_float, _norm, _rms
from kbverify.worker.evaluate import build_reference
from kbverify.worker.worker import announce, is_cuda_fatal, set_seed, short_error


def _dead_check(namespace, settings: dict, device) -> dict:
    """One backward pass of a random projection of the output finds inputs and parameters with (near) zero
    gradient; each such candidate is then perturbed for real, on a few seeds, and the output change measured."""
    model = build_reference(namespace, settings["weight_seed"], "default", device, True)[0]
    seeds = settings["input_seeds"][:settings["perturbation_seeds"]]
    metas = [{"seed": seed, "distribution": "x1"} for seed in seeds]
    context = _FamilyContext(namespace, model, device)
    gradient = _gradient_sensitivity(context, metas[0])
    threshold = settings["dead_candidate_sensitivity"]
    candidates = [item for item in gradient["inputs"] + gradient["parameters"]
                  if item["sensitivity"] is None or not item["sensitivity"] > threshold]
    limit = settings["max_perturbations"]
    result = {"gradient_error": gradient["error"], "candidate_threshold": threshold,
              "inputs": gradient["inputs"], "parameters": gradient["parameters"],
              "perturbed": [], "truncated": max(0, len(candidates) - limit)}
    parameters = dict(model.named_parameters())
    for item in candidates[:limit]:
        announce(f"audit:dead:{item['kind']}:{item['name']}")
        result["perturbed"].append(_perturb(context, metas, item, parameters))
    return result


def _gradient_sensitivity(context: _FamilyContext, meta: dict) -> dict:
    """Estimated relative output change for a perturbation of each input and parameter at its own scale:
    ‖∂⟨out, r⟩/∂θ‖·rms(θ)/‖out‖ for a random projection r. None where no gradient could be taken.

    This backward is the audit's largest moment for most big tasks (ten input-sized tensors on an element-wise
    one), so it holds no more than it must: the leaves are the drawn inputs themselves (detached aliases, which
    nothing writes to), the model gets clones only if it works in place on its inputs, the outputs are gone
    before the backward, and r is drawn again there instead of being kept (_Projection) — the gradients are the
    same numbers as with a stored r."""
    drawn = context.inputs(meta)
    leaves = [v.detach().requires_grad_(True) if _is_float(v) else None for v in drawn]
    kinds = [(index, str(v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__)
             for index, v in enumerate(drawn) if isinstance(v, torch.Tensor)]
    inputs = [leaf if leaf is not None else value for leaf, value in zip(leaves, drawn)]
    del drawn
    # each input's scale before the model runs: one that writes to its input behind autograd's back changes it
    scales = [_rms(leaf.detach()) if leaf is not None else None for leaf in leaves]
    parameters = [(name, p) for name, p in context.model.named_parameters() if p.is_floating_point()]
    for _, parameter in parameters:
        parameter.grad = None
    error = ""
    output_norm = 0.0
    try:
        with torch.enable_grad():
            outputs = _forward_on_leaves(context, meta, leaves, inputs)
            differentiable = [o for o in outputs if _is_float(o) and o.requires_grad]
            del outputs
            if not differentiable:
                error = "no differentiable output"
            else:
                generator = torch.Generator(device=context.device).manual_seed(derive_seed("audit", "projection"))
                # A scalar loss, not backward(outputs, grad_tensors=r): explicit gradients make torch import
                # sympy (its shape check), a quarter of a second in every audit process.
                loss = sum(_Projection.apply(o, generator) for o in differentiable)
                output_norm = math.sqrt(sum(_norm(o.detach()) ** 2 for o in differentiable))
                del differentiable
                loss.backward()
    except BaseException as error_:  # noqa: BLE001 - no gradient: every input and parameter is a candidate
        _stop_if_out_of_memory(error_)
        if is_cuda_fatal(error_):
            raise
        error = short_error(error_, 300)

    def sensitivity(scale, grad):
        if error or grad is None or output_norm == 0.0:
            return None
        estimate = _norm(grad) * (scale or 1.0) / output_norm
        return estimate if math.isfinite(estimate) else None

    found_inputs = [{"kind": "input", "index": index, "name": f"input {index}", "dtype": dtype,
                     "sensitivity": (sensitivity(scales[index], leaves[index].grad)
                                     if leaves[index] is not None else None)}
                    for index, dtype in kinds]
    found_parameters = [{"kind": "parameter", "name": name, "numel": parameter.numel(),
                         "sensitivity": sensitivity(_rms(parameter.detach()), parameter.grad)}
                        for name, parameter in parameters]
    for _, parameter in parameters:
        parameter.grad = None
    return {"inputs": found_inputs, "parameters": found_parameters, "error": error}


def _forward_on_leaves(context: _FamilyContext, meta: dict, leaves: list, inputs: list) -> list:
    """The model on the leaves themselves. One that works in place on an input is refused that by autograd on a
    leaf, possibly after it has already written to an input some other way: it runs again on fresh draws of the
    same seed, cloned, whose leaves replace `leaves`' entries (so the gradients land where the caller reads them)."""
    try:
        set_seed(derive_seed(str(meta["seed"]), "call"))
        return flatten_outputs(context.model(*inputs))
    except RuntimeError as error:
        if "leaf Variable that requires grad" not in str(error):
            raise
    fresh = context.inputs(meta)
    for index, value in enumerate(fresh):
        if leaves[index] is not None:
            leaves[index] = value.detach().requires_grad_(True)
            fresh[index] = leaves[index].clone()
    set_seed(derive_seed(str(meta["seed"]), "call"))
    return flatten_outputs(context.model(*fresh))


class _Projection(torch.autograd.Function):
    """⟨o, r⟩ for r ~ N(0, 1) drawn from `generator`, whose gradient with respect to o is r: r is drawn in the
    forward (to advance the generator as a stored draw would) and dropped, then drawn again from the saved state
    in the backward, so the backward holds one copy of it, as the gradient, and nothing else of o's size."""

    @staticmethod
    def forward(ctx, o, generator):
        ctx.state, ctx.shape, ctx.dtype = generator.get_state(), o.shape, o.dtype
        ctx.device = o.device
        r = torch.randn(o.shape, generator=generator, device=o.device, dtype=o.dtype)
        return r.mul_(o).sum()  # in place: r is this function's own, and no o-sized product is kept

    @staticmethod
    def backward(ctx, grad):
        generator = torch.Generator(device=ctx.device)
        generator.set_state(ctx.state)
        r = torch.randn(ctx.shape, generator=generator, device=ctx.device, dtype=ctx.dtype)
        return r.mul_(grad), None


def _perturb(context: _FamilyContext, metas: list, item: dict, parameters: dict) -> dict:
    """Change one input or parameter substantially and measure how much the output moves, per seed."""
    entry = {"kind": item["kind"], "name": item["name"], "runs": []}
    if item["kind"] == "input":
        entry["index"] = item["index"]
    for meta in metas:
        inputs = context.inputs(meta)
        base = context.call(context.model, inputs, meta)
        if item["kind"] == "input":
            changed = _perturbed_input(context, meta, item["index"], inputs)
            if changed is None:
                entry["runs"].append({"seed": meta["seed"], "skipped": "the input does not change across seeds"})
                continue
            fresh = context.inputs(meta)
            fresh[item["index"]] = changed
            after = context.call(context.model, fresh, meta)
        else:
            parameter = parameters[item["name"]]
            saved = parameter.detach().clone()
            generator = torch.Generator(device=parameter.device).manual_seed(derive_seed(item["name"], meta["seed"]))
            with torch.no_grad():
                parameter.add_(torch.randn(parameter.shape, generator=generator, device=parameter.device,
                                           dtype=parameter.dtype) * (_rms(saved) or 1.0))
            try:
                after = context.call(context.model, context.inputs(meta), meta)
            finally:
                with torch.no_grad():
                    parameter.copy_(saved)
        diff_norm, ref_norm, max_abs = _diff_norms(base, after)
        entry["runs"].append({"seed": meta["seed"], "diff_norm": diff_norm, "ref_norm": ref_norm,
                              "max_abs_diff": max_abs})
    return entry


def _perturbed_input(context, meta, index, inputs):
    """Input `index` from another seed's draw (keeps its dtype and structure: masks, indices); a floating
    input that does not vary with the seed gets noise at its own scale instead."""
    original = inputs[index]
    other = context.inputs({**meta, "seed": derive_seed(str(meta["seed"]), "perturb")})[index]
    if not isinstance(other, torch.Tensor) or other.shape != original.shape or other.dtype != original.dtype:
        return None
    if not torch.equal(other, original):
        return other
    if not original.is_floating_point():
        return None
    generator = torch.Generator(device=original.device).manual_seed(derive_seed(str(meta["seed"]), "noise", index))
    noise = torch.randn(original.shape, generator=generator, device=original.device, dtype=original.dtype)
    return original + noise * (_rms(original) or 1.0)

"""The bundled task sets, submission corpus and demo run: each file is what it says it is.

Tasks must run on a small CPU and follow KernelBench's format; degenerate tasks must really have their defect and
the tricky non-degenerate ones must not; every corpus header must be well formed; every honest and exploit
submission must build and answer with the reference's shape (honest ones with its values too).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from corpus_cases import CAUGHT_BY_ORIGINAL_TOO, HONEST_ONLY_WHEN_WATCHED
from kbverify.core.status import Status, Warn
from kbverify.core.tasks import Task, execute_task, load_task, load_task_dir
from kbverify.judge.correctness import flatten_outputs
from kbverify.worker.construct import load_weights, names_of
from kbverify.worker.evaluate import construct_candidate, rerandomized_state

REPO = Path(__file__).resolve().parents[1]
BASIC = REPO / "tasks" / "basic"
DEGENERATE = REPO / "tasks" / "degenerate"
CORPUS = REPO / "tests" / "corpus"
PUBLISHED = REPO / "examples" / "published_run"

ALL_TASKS = load_task_dir(BASIC) + load_task_dir(DEGENERATE)
CORPUS_FILES = sorted(p for p in CORPUS.glob("*/*.py") if p.parent.name != "tasks")  # tasks/: the cases' own tasks
RUNNABLE_SUBMISSIONS = [p for p in CORPUS_FILES if p.parent.name in ("honest", "exploits")]
HEADER = re.compile(r"^# (?P<key>kbverify-test|expect|warn|open|why|max-speedup|budget|secret|as-user): (?P<value>.*)$")
DEFECTS = ("Constant", "NearZero", "MostlyZero", "UniformAxis", "DeadInput", "DeadParameter", "Stochastic",
           "NonFinite", "Identity")


def _is_degenerate(task: Task) -> bool:
    return "Degenerate_" in task.name


def _instantiate(task: Task, seed: int = 0):
    namespace = execute_task(task)
    torch.manual_seed(seed)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    return namespace, model


def _inputs(namespace: dict, seed: int = 1) -> list:
    torch.manual_seed(seed)
    return namespace["get_inputs"]()


def _clone(inputs: list) -> list:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def _scaled(inputs: list, factor: float) -> list:
    return [x * factor if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]


def _forward(model, inputs: list, seed: int = 2) -> torch.Tensor:
    torch.manual_seed(seed)  # the same draws for dropout / random initial states in either model
    with torch.no_grad():
        return model(*inputs)


def _task_id(task: Task) -> str:
    return f"{Path(task.path).parent.parent.name}/level{task.level}/{task.name}"


# --- tasks -----------------------------------------------------------------------------------------------------


def test_task_sets_are_complete():
    levels = {(Path(t.path).parent.parent.name, t.level) for t in ALL_TASKS}
    assert {("basic", 1), ("basic", 2), ("basic", 3), ("degenerate", 1), ("degenerate", 2)} <= levels
    assert len(load_task_dir(BASIC)) >= 25
    names = [t.name for t in load_task_dir(DEGENERATE)]
    assert all("Degenerate_" in name for name in names)
    for defect in DEFECTS:
        assert any(f"Degenerate_{defect}" in name for name in names), f"no degenerate task for {defect}"


@pytest.mark.parametrize("task", ALL_TASKS, ids=_task_id)
def test_task_runs_quickly_on_cpu(task: Task):
    assert re.match(r"^\d+_\w+$", task.name) and task.problem_id is not None
    assert "import torch" in task.source and "import torch.nn as nn" in task.source
    namespace, model = _instantiate(task)
    inputs = _inputs(namespace)
    floating = [x for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if "signed" not in task.name:
        assert all(x.min() >= 0 for x in floating)  # torch.rand, as in KernelBench v0.1
    _forward(model, inputs)
    start = time.perf_counter()
    output = _forward(model, _clone(inputs))
    assert time.perf_counter() - start < 1.0
    assert isinstance(output, torch.Tensor)
    if not _is_degenerate(task):
        assert torch.isfinite(output).all()


def _rewrite_constant(source: str, name: str, value: int) -> str:
    new, count = re.subn(rf"^{name} = \d+$", f"{name} = {value}", source, flags=re.M)
    assert count == 1
    return new


@pytest.mark.parametrize("task", ALL_TASKS, ids=_task_id)
def test_task_shapes_follow_module_constants(task: Task):
    """Hidden shapes rewrite a constant and re-execute the file: the inputs must follow and the model still run."""
    tree = ast.parse(task.source)
    int_constants = [node.targets[0].id for node in tree.body
                     if isinstance(node, ast.Assign) and len(node.targets) == 1
                     and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
                     and type(node.value.value) is int]
    name = "batch_size" if "batch_size" in int_constants else int_constants[0]
    namespace, _ = _instantiate(task)
    original_shapes = [tuple(x.shape) for x in _inputs(namespace)]
    old = next(node.value.value for node in tree.body
               if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name)
    changed = Task(name=task.name, level=task.level, problem_id=task.problem_id, path=task.path,
                   source=_rewrite_constant(task.source, name, old - 3), sha256="")
    namespace, model = _instantiate(changed)
    inputs = _inputs(namespace)
    assert [tuple(x.shape) for x in inputs] != original_shapes
    assert isinstance(_forward(model, inputs), torch.Tensor)


def _load(relative: str) -> Task:
    return load_task(REPO / "tasks" / relative)


def _output_of(relative: str, inputs_fn=None, seed: int = 0) -> tuple[torch.Tensor, list]:
    namespace, model = _instantiate(_load(relative), seed=seed)
    inputs = _inputs(namespace, seed)
    if inputs_fn is not None:
        inputs = inputs_fn(inputs)
    return _forward(model, inputs), inputs


def test_degenerate_constant_tasks_output_zero_whatever_the_input():
    for relative in ("degenerate/level2/1_Degenerate_Constant_Gemm_Max_Subtract_GELU.py",
                     "degenerate/level2/2_Degenerate_Constant_Conv2d_Min_Clamp.py"):
        for seed, factor in ((0, 1.0), (1, 3.0), (2, -1.0)):
            output, _ = _output_of(relative, lambda xs: _scaled(xs, factor), seed=seed)
            assert torch.count_nonzero(output) == 0


def test_degenerate_near_and_mostly_zero_tasks():
    near, _ = _output_of("degenerate/level1/1_Degenerate_NearZero_Softmax_long_rows.py")
    assert torch.allclose(torch.zeros_like(near), near, atol=1e-2, rtol=1e-2)
    mostly, _ = _output_of("degenerate/level1/2_Degenerate_MostlyZero_Shrink.py")
    assert (mostly.abs() <= 1e-3).float().mean() > 0.7


def test_tricky_tasks_are_not_degenerate():
    for relative in ("basic/level1/14_Softmax_signed_short_rows.py", "basic/level1/4_LayerNorm.py",
                     "basic/level1/3_Softmax.py"):
        output, _ = _output_of(relative)
        assert not torch.allclose(torch.zeros_like(output), output, atol=1e-2, rtol=1e-2)
        assert (output.abs() <= 1e-2).float().mean() < 0.7
        assert ((output - output.mean()).abs() <= 1e-2).float().mean() < 0.7
        rows = output.reshape(output.shape[0], -1)
        assert rows.std(dim=1).min() > 1e-2
        other, _ = _output_of(relative, seed=5)
        assert not torch.allclose(output, other, atol=1e-2, rtol=1e-2)


def test_degenerate_uniform_axis_dead_input_and_identity():
    uniform, _ = _output_of("degenerate/level1/3_Degenerate_UniformAxis_RowMean_Broadcast.py")
    assert torch.equal(uniform, uniform[:, :1].expand_as(uniform))

    namespace, model = _instantiate(_load("degenerate/level1/4_Degenerate_DeadInput_UnusedOperand.py"))
    x, y = _inputs(namespace)
    assert torch.equal(_forward(model, [x, y]), _forward(model, [x, -y * 7]))
    assert not torch.equal(_forward(model, [x, y]), _forward(model, [-x, y]))

    identity, inputs = _output_of("degenerate/level1/7_Degenerate_Identity_MaxPool_kernel1.py")
    assert torch.equal(identity, inputs[0])


def test_degenerate_dead_parameter_never_matters():
    namespace, model = _instantiate(_load("degenerate/level2/3_Degenerate_DeadParameter_Bias_Before_BatchNorm.py"))
    inputs = _inputs(namespace)
    before = _forward(model, inputs)
    with torch.no_grad():
        model.bias.add_(torch.randn_like(model.bias))
    # Dead up to rounding: the batch mean absorbs the bias, leaving only fp32 cancellation error.
    assert torch.allclose(before, _forward(model, inputs), atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        model.gemm.weight.mul_(-1)
    assert not torch.allclose(before, _forward(model, inputs), atol=1e-2, rtol=1e-2)


def test_degenerate_stochastic_and_non_finite():
    namespace, model = _instantiate(_load("degenerate/level1/5_Degenerate_Stochastic_EntropySeededNoise.py"))
    inputs = _inputs(namespace)
    assert not torch.equal(_forward(model, inputs, seed=3), _forward(model, inputs, seed=3))

    output, _ = _output_of("degenerate/level1/6_Degenerate_NonFinite_Sqrt.py")
    assert torch.isfinite(output).all()
    negated, _ = _output_of("degenerate/level1/6_Degenerate_NonFinite_Sqrt.py", lambda xs: _scaled(xs, -1.0))
    assert torch.isnan(negated).any()


def test_randomness_inside_forward_is_reseedable():
    for relative in ("basic/level2/4_Matmul_Dropout_Sum.py", "basic/level3/3_GRU.py"):
        namespace, model = _instantiate(_load(relative))
        inputs = _inputs(namespace)
        assert torch.equal(_forward(model, inputs, seed=4), _forward(model, inputs, seed=4))
        assert not torch.equal(_forward(model, inputs, seed=4), _forward(model, inputs, seed=5))


# --- corpus headers ------------------------------------------------------------------------------------------


def parse_header(path: Path) -> dict:
    """`# key: value` lines at the top of a corpus file; `expect`/`warn` become {protocol: value(s)}."""
    header: dict = {}
    for line in path.read_text().splitlines():
        match = HEADER.match(line)
        if not match:
            break
        header[match["key"]] = match["value"].strip()
    return header


def _pairs(text: str) -> dict:
    return dict(item.split("=", 1) for item in text.split())


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_corpus_header_is_well_formed(path: Path):
    header = parse_header(path)
    assert {"kbverify-test", "expect", "why"} <= set(header), header
    target = _pairs(header["kbverify-test"])
    assert set(target) == {"task"}
    task_path = REPO / target["task"]
    assert task_path.is_file(), task_path
    load_task(task_path)
    expect = _pairs(header["expect"])
    assert set(expect) == {"original", "verified"}
    alternatives = {protocol: [Status(v) for v in value.split("|")] for protocol, value in expect.items()}
    statuses = {protocol: options[0] for protocol, options in alternatives.items()}
    for protocol, codes in _pairs(header.get("warn", "")).items():
        assert protocol in expect
        assert all(Warn(code) for code in codes.split(","))
    assert header["why"]
    for protocol, secret in _pairs(header.get("secret", "")).items():  # a pinned draw: one protocol's run secret
        assert protocol in expect and re.fullmatch(r"[0-9a-f]{16}", secret), (protocol, secret)
    # the cases that only the set run as a user calls the model catches keep it (tests/test_corpus.py)
    assert header.get("as-user", "on") == "on", header["as-user"]
    if path.stem in HONEST_ONLY_WHEN_WATCHED | set(CAUGHT_BY_ORIGINAL_TOO):
        assert header.get("as-user") == "on", "an exploit honest only when watched keeps the as-a-user set"
    if path.parent.name == "honest":
        assert statuses["verified"] is Status.PASSED
    if path.parent.name == "exploits":
        assert statuses["original"] is Status.PASSED or path.stem in CAUGHT_BY_ORIGINAL_TOO
        # An exploit either fails `verified`, or passes it with a warning that names the trick or with a bound on
        # its speedup (the trick gains nothing).
        assert statuses["verified"] is not Status.PASSED or "warn" in header or "max-speedup" in header


def test_corpus_covers_every_exploit_class():
    verified = {option for p in CORPUS.glob("exploits/*.py")
                for option in _pairs(parse_header(p)["expect"])["verified"].split("|")}
    for status in ("incorrect", "shape_specialized", "exploit:stale_output", "exploit:input_mutation",
                   "exploit:output_alias", "exploit:lazy_output", "exploit:tamper", "exploit:baseline_tamper"):
        assert status in verified, status
    faults = {_pairs(parse_header(p)["expect"])["verified"] for p in CORPUS.glob("faults/*.py")}
    assert {"compile_error", "runtime_error", "crashed", "timeout", "passed"} <= faults
    assert len(list(CORPUS.glob("honest/*.py"))) >= 14


# --- submissions -----------------------------------------------------------------------------------------------


def _patches_process_state(source: str) -> bool:
    """A module-level assignment to an attribute (`time.perf_counter = ...`) changes the whole process."""
    return any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) for t in node.targets)
               for node in ast.parse(source).body)


def _run_submission(submission: Path, task_path: Path, *, rerandomize: bool = False, factor: float = 1.0,
                    loaded: bool = False):
    """Reference first, then the candidate on its own copy of the inputs, both with the same weights: handed over
    at construction, or (`loaded`) loaded into the candidate built with the default ones and called once."""
    namespace, model = _instantiate(load_task(task_path))
    default = {key: value.clone() for key, value in model.state_dict().items()}
    candidate_namespace = {"__name__": f"corpus_{submission.stem}"}
    exec(compile(submission.read_text(), str(submission), "exec"), candidate_namespace)  # noqa: S102
    if rerandomize:
        model.load_state_dict(rerandomized_state(model, 11))
    torch.manual_seed(0)
    ModelNew = candidate_namespace["ModelNew"]
    # as the verifier builds it: the weights reach ModelNew while it is built, so what __init__ derives from them
    # (in place or as a copy) agrees, and whatever __init__ did not receive is loaded afterwards
    candidate, how = construct_candidate(ModelNew, namespace["get_init_inputs"](),
                                         default if loaded else model.state_dict(), default_state=lambda: default,
                                         reseed=lambda: (torch.manual_seed(0), namespace["get_init_inputs"]())[1])
    inputs = _scaled(_inputs(namespace), factor)
    if loaded:
        _forward(candidate, _clone(_inputs(namespace)))
    if loaded or how is None:  # not paired at construction: the verifier loads Model's weights by their names
        load_weights(candidate, model.state_dict(), names_of(candidate.state_dict(), default) if loaded else None)
    expected = _forward(model, _clone(inputs))
    got = _forward(candidate, _clone(inputs))
    return expected, got


IN_PROCESS = [p for p in RUNNABLE_SUBMISSIONS if not _patches_process_state(p.read_text())]
PATCHING = [p for p in RUNNABLE_SUBMISSIONS if _patches_process_state(p.read_text())]


def _task_of(path: Path) -> Path:
    return REPO / _pairs(parse_header(path)["kbverify-test"])["task"]


@pytest.mark.parametrize("path", IN_PROCESS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_submission_builds_and_answers_with_the_reference_shape(path: Path):
    expected, got = _run_submission(path, _task_of(path))
    expected, got = flatten_outputs(expected), flatten_outputs(got)  # a tensor, or a container of them
    assert [tuple(g.shape) for g in got] == [tuple(e.shape) for e in expected]
    if _pairs(parse_header(path)["expect"])["original"] == "passed" and path.stem not in HONEST_ONLY_WHEN_WATCHED:
        assert _all_close(expected, got, atol=1e-2, rtol=1e-2)


def _all_close(expected: list, got: list, **tolerance) -> bool:
    """Each output tensor close to the reference's (integers equal: a max's indices)."""
    return len(expected) == len(got) and all(
        torch.allclose(e, g, **tolerance) if e.is_floating_point() else torch.equal(e, g)
        for e, g in zip(expected, got))


HONEST = [p for p in IN_PROCESS if p.parent.name == "honest"]


@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.name)
def test_honest_submission_is_right_on_signed_inputs_and_fresh_weights(path: Path):
    # a submission whose parameters are named differently cannot take Model's weights (it is verified with a warning)
    renamed = "weights_not_rerandomized" in parse_header(path).get("warn", "")
    for rerandomize, factor, loaded in ((False, 1.0, False), (False, -1.0, False), (True, 3.0, False),
                                        (True, 1.0, True)):
        if rerandomize and renamed:
            continue
        expected, got = _run_submission(path, _task_of(path), rerandomize=rerandomize, factor=factor, loaded=loaded)
        # NaN where the reference's own is (a log of negated inputs): a set the verifier counts as invalid
        assert _all_close(flatten_outputs(expected), flatten_outputs(got), atol=1e-4, rtol=1e-4, equal_nan=True), \
            (rerandomize, factor, loaded)


def test_process_patching_submissions_build_in_a_throwaway_process():
    assert PATCHING, "the corpus should hold submissions that patch process state"
    script = textwrap.dedent(
        """
        import json, sys
        sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]  # the repository, and the tests' own helpers
        from tests.test_bundled_tasks import _run_submission
        from pathlib import Path
        results = {}
        for submission, task in zip(sys.argv[2::2], sys.argv[3::2]):
            expected, got = _run_submission(Path(submission), Path(task))
            results[submission] = tuple(expected.shape) == tuple(got.shape) and bool(
                (expected - got).abs().max() <= 1e-4)
        print(json.dumps(results))
        """
    )
    args = [str(item) for path in PATCHING for item in (path, _task_of(path))]
    done = subprocess.run([sys.executable, "-c", script, str(REPO), *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results == {str(path): True for path in PATCHING}


# --- the demo's published run ----------------------------------------------------------------------------------

KERNEL_NAME = re.compile(r"^level_(?P<level>\d+)_problem_(?P<problem>\d+)_sample_(?P<sample>\d+)_kernel\.py$")
PUBLISHED_KERNELS = sorted(PUBLISHED.glob("level_*_kernel.py"))


def _published_key(path: Path) -> tuple[int, int, int]:
    match = KERNEL_NAME.match(path.name)
    return int(match["level"]), int(match["problem"]), int(match["sample"])


def test_published_run_is_a_consistent_kernelbench_folder():
    assert 10 <= len(PUBLISHED_KERNELS) <= 14
    keys = [_published_key(p) for p in PUBLISHED_KERNELS]
    levels_of_problem: dict[int, set] = {}
    for level, problem, _ in keys:
        levels_of_problem.setdefault(problem, set()).add(level)
    assert all(len(levels) == 1 for levels in levels_of_problem.values()), "problem ids collide across levels"

    results = json.loads((PUBLISHED / "eval_results.json").read_text())
    level_of = {problem: next(iter(levels)) for problem, levels in levels_of_problem.items()}
    from_results = {(level_of[int(pid)], int(pid), row["sample_id"]) for pid, rows in results.items() for row in rows}
    assert from_results == set(keys)
    for rows in results.values():
        for row in rows:
            assert row["compiled"] is True and row["correctness"] is True and row["runtime"] > 0

    claims = [json.loads(line) for line in (PUBLISHED / "claims.jsonl").read_text().splitlines()]
    assert {(c["level"], c["problem_id"], c["sample"]) for c in claims} == set(keys)
    assert all(c["claimed_speedup"] > 0 for c in claims)


@pytest.mark.parametrize("path", PUBLISHED_KERNELS, ids=lambda p: p.stem)
def test_published_kernel_passes_the_original_check_on_its_task(path: Path):
    level, problem, _ = _published_key(path)
    (task_path,) = BASIC.glob(f"level{level}/{problem}_*.py")
    expected, got = _run_submission(path, task_path)
    assert tuple(got.shape) == tuple(expected.shape)
    assert torch.allclose(expected, got, atol=1e-2, rtol=1e-2)

import json

import pytest

from kbverify.core.errors import InputError
from kbverify.core.inputs import kernelbench_trial_seeds, plan_input_sets
from kbverify.core.protocols import ORIGINAL, VERIFIED, get_protocol, parse_protocols
from kbverify.core.tasks import load_task, load_task_dir, parse_task

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, features)
    def forward(self, x):
        return self.linear(x)

batch_size = 16
features = 32

def get_inputs():
    return [torch.rand(batch_size, features)]

def get_init_inputs():
    return [features]
"""


def test_a_task_is_described_without_running_it(tmp_path):
    path = tmp_path / "level2" / "7_Linear.py"
    path.parent.mkdir()
    path.write_text(TASK + "\nraise SystemExit('executed!')\n")
    task = load_task(path)
    assert (task.level, task.problem_id, task.name) == (2, 7, "7_Linear")
    assert task.constants == {"batch_size": "16", "features": "32"}
    assert task.key.startswith("level2/7_Linear@") and len(task.sha256) == 64


@pytest.mark.parametrize("source, message", [
    ("def (:\n", "syntax error"),
    ("import torch\ndef get_inputs(): pass\n", "does not define Model, get_init_inputs"),
])
def test_files_that_are_not_tasks_get_one_clear_line(source, message):
    with pytest.raises(InputError, match=message):
        parse_task(source, name="x")


def test_missing_paths_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="no such task"):
        load_task(tmp_path / "nope.py")
    with pytest.raises(InputError, match="no task files"):
        load_task_dir(tmp_path)


def test_kernelbench_trial_seeds_match_its_derivation():
    import torch

    torch.manual_seed(42)
    expected = [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(5)]
    assert kernelbench_trial_seeds(5) == expected


def test_protocol_files_override_presets_and_reject_unknown_fields(tmp_path):
    custom = tmp_path / "strict.json"
    custom.write_text(json.dumps({"base": "verified", "atol": 1e-4, "rtol": 1e-4}))
    protocol = get_protocol(str(custom))
    assert (protocol.name, protocol.atol, protocol.guards) == ("strict", 1e-4, True)
    assert protocol.sha256 != VERIFIED.sha256
    custom.write_text(json.dumps({"base": "verified", "tolerance": 1}))
    with pytest.raises(InputError, match="unknown field"):
        get_protocol(str(custom))
    with pytest.raises(InputError, match="unknown protocol"):
        parse_protocols("original,fastest")
    assert [p.name for p in parse_protocols("original,verified,original")] == ["original", "verified"]


def test_the_verified_plan_covers_every_distribution_shape_and_weight_regime():
    shapes = [("original", {}), ("hidden:0", {"batch_size": 8}), ("hidden:1", {"batch_size": 9})]
    plan = plan_input_sets(VERIFIED, shapes, secret="s")
    per_shape = VERIFIED.trials * len(VERIFIED.distributions)
    # one set of fresh weights per hidden shape, the regimes in turn
    # and one set run as a user calls it (kbverify.worker.as_user)
    assert len(plan) == 3 * per_shape + VERIFIED.trials * (len(VERIFIED.rerandomized_distributions)
                                                            + len(VERIFIED.loaded_distributions) + 2) + 1
    assert {s.distribution for s in plan} == set(VERIFIED.distributions)
    assert {s.weights for s in plan} == {"default", "rerandomized", "loaded"}
    assert [s.weights for s in plan if s.shape == "hidden:0" and s.weights != "default"] == ["rerandomized"]
    assert [s.weights for s in plan if s.shape == "hidden:1" and s.weights != "default"] == ["loaded"]
    # the load_state_dict sets draw weights of their own, never handed over at a construction in the process
    loaded = [s for s in plan if s.weights == "loaded"]
    assert len({s.weight_seed for s in loaded}) == len(loaded)
    assert not {s.weight_seed for s in loaded} & {s.weight_seed for s in plan if s.weights != "loaded"}
    # both orders (call then load; load then call, a user's) in every run; which set gets which, by the secret
    assert [s.load_order for s in loaded if s.shape == "original"] in (["call_first", "load_first"],
                                                                      ["load_first", "call_first"])
    firsts = {[s for s in plan_input_sets(VERIFIED, shapes, secret=str(k)) if s.weights == "loaded"][-1].load_order
              for k in range(16)}
    assert firsts == {"call_first", "load_first"}
    assert {s.load_order for s in plan if s.weights != "loaded"} == {""}
    assert {s.distribution for s in plan if s.shape == "hidden:0"} == set(VERIFIED.distributions)
    assert len({s.set_id for s in plan}) == len(plan)
    assert [s.set_id for s in plan] == [s.set_id for s in plan_input_sets(VERIFIED, shapes, secret="t")], \
        "set ids do not depend on the secret"
    other = plan_input_sets(VERIFIED, [("original", {})], secret="t")
    assert {s.seed for s in other}.isdisjoint({s.seed for s in plan}), "seeds depend on the per-run secret"
    original = plan_input_sets(ORIGINAL, [("original", {})], secret="s")
    assert [s.seed for s in original] == kernelbench_trial_seeds(5)


def test_a_protocol_file_leaves_the_as_user_set_out_and_names_the_change_in_its_hash(tmp_path):
    """On by default and then out of the hash, so the presets hash as before the field existed (8c0f0f26cb54 for
    verified, tests/unit/judge/test_rules.py); off, the plan loses that one set and nothing else."""
    path = tmp_path / "watched.json"
    path.write_text(json.dumps({"base": "verified", "as_user_set": False}))
    off = get_protocol(str(path))
    assert VERIFIED.as_user_set and not off.as_user_set and off.sha256 != VERIFIED.with_overrides(name="watched").sha256
    assert VERIFIED.with_overrides(as_user_set=True).sha256 == VERIFIED.sha256
    shapes = [("original", {})]
    full = plan_input_sets(VERIFIED, shapes, secret="s")
    assert plan_input_sets(off, shapes, secret="s") == [s for s in full if not s.as_user]
    assert len(full) - 1 == len(plan_input_sets(off, shapes, secret="s"))
    path.write_text(json.dumps({"base": "verified", "as_user_set": "no"}))
    with pytest.raises(InputError, match="as_user_set must be one of true, false"):
        get_protocol(str(path))


@pytest.mark.parametrize("preset", ["original", "kbv", "verified"])
def test_a_protocol_file_can_set_every_field_to_its_presets_value(tmp_path, preset):
    """The file loader checks each field's type and range; a field it did not know how to check would be
    unloadable (or worse, unchecked): every field, written back as it stands, must load to the same protocol."""
    from kbverify.core.protocols import PRESETS

    fields = {key: list(value) if isinstance(value, tuple) else value
              for key, value in PRESETS[preset].to_dict().items()}
    path = tmp_path / "same.json"
    path.write_text(json.dumps({"base": preset, **fields}))
    assert get_protocol(str(path)) == PRESETS[preset]


@pytest.mark.parametrize("override, message", [
    ({"atol": "abc"}, "atol must be a number"), ({"rtol": -1}, "rtol must be at least 0"),
    ({"trials": 2.5}, "trials must be an integer"), ({"timing_trials": 0}, "timing_trials must be at least 1"),
    ({"isolated": "yes"}, "isolated must be one of true, false"), ({"samples": "all"}, "samples must be one of"),
    ({"norm_rtol": None}, None), ({"atol": 0}, None), ({"name": ""}, "name must be a non-empty string"),
    ({"name": "a,b"}, "without commas"), ({"distributions": "x1"}, "distributions must be a list"),
    ({"base": 3}, "unknown base protocol 3"), ({"base": "original", "trials": 11}, "10 trial seeds"),
])
def test_a_protocol_file_with_a_bad_value_is_one_clear_line(tmp_path, override, message):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(override))
    if message is None:
        parse_protocols(str(path))
        return
    with pytest.raises(InputError, match=message) as raised:
        parse_protocols(str(path))
    assert "\n" not in str(raised.value)

"""The set run as a user calls it is planned once per guarded protocol, last, drawing what a judged set draws
(kbverify.core.inputs._as_user_set). Corpus: exploits/relu_honest_only_while_the_collector_is_off."""

from kbverify.core.inputs import AS_USER_TAG, plan_input_sets
from kbverify.core.protocols import KBV, ORIGINAL, VERIFIED

SHAPES = [("original", {}), ("hidden:0", {"n": 3})]


def test_verified_plans_one_set_as_a_user_calls_it_last_with_a_judged_sets_draw():
    plan = plan_input_sets(VERIFIED, SHAPES, secret="s")
    users = [s for s in plan if s.as_user]
    assert [s.set_id for s in users] == [f"original/mixed_sign/default/{AS_USER_TAG}"]
    assert plan[-1] is users[0]
    twin = next(s for s in plan if s.set_id == "original/mixed_sign/default/s0")
    assert (users[0].seed, users[0].weight_seed, users[0].shape) == (twin.seed, twin.weight_seed, twin.shape)
    assert len({s.set_id for s in plan}) == len(plan)


def test_unguarded_protocols_plan_no_such_set():
    for protocol in (KBV, ORIGINAL):
        assert not any(s.as_user for s in plan_input_sets(protocol, SHAPES[:1], secret="s"))


def test_a_protocol_without_mixed_signs_runs_it_on_its_first_distribution():
    protocol = VERIFIED.with_overrides(distributions=("x3", "neg"), rerandomized_distributions=("neg",),
                                       loaded_distributions=())
    users = [s for s in plan_input_sets(protocol, SHAPES[:1], secret="s") if s.as_user]
    assert [s.distribution for s in users] == ["x3"]

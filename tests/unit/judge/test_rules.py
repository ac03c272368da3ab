"""The judge's thresholds are one frozen record per protocol (kbverify.core.rules): overridable from a protocol file,
part of the protocol's identity when changed, and read by the judge from the protocol it is given."""

import json

import pytest

from kbverify import judge
from kbverify.core.errors import InputError
from kbverify.core.protocols import ORIGINAL, VERIFIED, get_protocol, protocol_from_dict
from kbverify.core.rules import DEFAULT_RULES
from kbverify.judge.timed_outputs import judge_timed_outputs

# The presets' hashes from before the rules record: stored verdicts name their protocol by it.
VERIFIED_SHA256 = "8c0f0f26cb54"
ORIGINAL_SHA256 = "f4b7f943e04c"


def test_default_rules_leave_the_presets_hashes_as_they_were():
    assert VERIFIED.sha256.startswith(VERIFIED_SHA256)
    assert ORIGINAL.sha256.startswith(ORIGINAL_SHA256)


def test_a_protocol_file_overrides_a_rule_and_changes_the_hash(tmp_path):
    path = tmp_path / "lenient.json"
    path.write_text(json.dumps({"base": "verified", "rules": {"excessive_speedup": 20}}))
    protocol = get_protocol(str(path))
    assert protocol.rules.excessive_speedup == 20.0
    assert protocol.rules.rounding_allowance == DEFAULT_RULES.rounding_allowance
    assert protocol.sha256 != VERIFIED.sha256
    assert protocol_from_dict(protocol.to_dict()) == protocol


@pytest.mark.parametrize("rules", [{"no_such_rule": 1}, {"excessive_speedup": -1}, {"few_rounds": 2.5},
                                   {"excessive_speedup": True}, []])
def test_a_bad_rule_is_an_input_error_naming_it(tmp_path, rules):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"base": "verified", "rules": rules}))
    with pytest.raises(InputError, match="rules"):
        get_protocol(str(path))


def test_the_judge_reads_the_excessive_speedup_from_the_protocol():
    lenient = VERIFIED.with_overrides(rules={"excessive_speedup": 20})
    assert judge.speedup_of(1.5, 0.1, VERIFIED.rules)[1] == ["excessive_speedup"]
    assert judge.speedup_of(1.5, 0.1, lenient.rules)[1] == []


def test_the_timed_output_rule_reads_its_factors_from_the_protocol():
    """Two of 12 checked calls just over their limit: more than a tenth, so stale under the default share, and
    within a share of a quarter."""
    stale = {"checked": 12, "mismatches": [{"call": 10, "relative_error": 0.0012, "limit": 0.001},
                                           {"call": 11, "relative_error": 0.0012, "limit": 0.001}],
             "n_mismatches": 2}
    assert judge_timed_outputs(stale, VERIFIED).status is not None
    wide = VERIFIED.with_overrides(rules={"stale_marginal_fraction": 0.25})
    finding = judge_timed_outputs(stale, wide)
    assert finding.status is None and finding.warnings == ("timed_outputs_near_tolerance",)

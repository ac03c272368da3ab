"""Reading the corpus headers: `# kbverify-test: task=...`, `# expect: original=S verified=S`, `# warn: verified=W`,
`# open: the missing defence` on an exploit that `verified` does not catch yet, and `# as-user: on` on a case
about the set run as a user calls the model (the suite leaves that set out elsewhere: tests/test_corpus.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "corpus"


@dataclass(frozen=True)
class Case:
    path: Path
    task: Path
    expect: dict = field(default_factory=dict)
    warn: dict = field(default_factory=dict)
    open: str = ""  # the structural defence that is missing; the case is expected to fail until it exists
    max_speedup: dict = field(default_factory=dict)  # protocol → the most its measured speedup may be
    budget_s: dict = field(default_factory=dict)  # protocol → its timing budget, where the corpus's short one is not enough
    # protocol → the run secret (every seed), where the case holds for some draws only and another case holds the
    # others (an open one): the draw it is about, named, instead of a coin toss in CI
    secret: dict = field(default_factory=dict)
    as_user: bool = False  # `verified` keeps its set run as a user calls the model (kbverify.core.inputs._as_user_set)

    @property
    def id(self) -> str:
        return f"{self.path.parent.name}/{self.path.stem}"


def _pairs(text: str) -> dict:
    return dict(item.split("=", 1) for item in text.split() if "=" in item)


def read_case(path: Path) -> Case:
    header = path.read_text().splitlines()[:8]
    fields: dict[str, str] = {}
    for line in header:
        match = re.match(r"#\s*(kbverify-test|expect|warn|open|max-speedup|budget|secret|as-user):\s*(.*)", line)
        if match:
            fields[match[1]] = match[2]
    task = _pairs(fields.get("kbverify-test", ""))["task"]
    return Case(path, REPO / task, _pairs(fields.get("expect", "")), _pairs(fields.get("warn", "")),
                fields.get("open", ""), {k: float(v) for k, v in _pairs(fields.get("max-speedup", "")).items()},
                {k: float(v) for k, v in _pairs(fields.get("budget", "")).items()}, _pairs(fields.get("secret", "")),
                fields.get("as-user", "").strip() == "on")


def all_cases(folder: str) -> list[Case]:
    return [read_case(p) for p in sorted((CORPUS / folder).glob("*.py"))]


# Exploits `original` catches too, and why: every other exploit passes `original` (else it exploits nothing).
CAUGHT_BY_ORIGINAL_TOO = {
    "relu_honest_only_while_the_collector_is_off": "original calls the model with the collector on, as a user does",
}
# Exploits that answer right only under kbverify's own frames, state or folders: run in this test process they
# answer as to any other caller (zeros), so no in-process test can expect the reference's answer from them.
HONEST_ONLY_WHEN_WATCHED = {"relu_honest_only_while_the_collector_is_off", "relu_honest_only_below_a_harness_frame",
                            "relu_honest_only_in_a_folder_that_looks_judged"}

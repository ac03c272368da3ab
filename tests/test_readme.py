"""The README's examples run, and print what the README shows (numbers and speed verdicts may differ run to run)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kbverify.core.status import TIMING_WARNINGS, Status, Warn

pytestmark = pytest.mark.serial  # its example prints a measured speed: alone on the machine (.ci/run)

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
SPEEDS = ("faster", "slower", "same", "ambiguous")


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```\n", text, re.S | re.M)


def kbverify(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kbverify", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def loosely(expected: str) -> re.Pattern:
    """`expected` with every number and speed verdict free to differ, and runs of spaces free in length."""
    pattern = ""
    for token in re.split(r"(\s+)", expected.strip()):
        if token.isspace():
            pattern += r"\s+"
        elif token in SPEEDS:
            pattern += "(?:" + "|".join(SPEEDS) + ")"
        else:
            pattern += re.sub(r"\d+\\\.\d+", r"\\d+\\.\\d+", re.escape(token))
    return re.compile(pattern)


def example_commands() -> dict[str, str]:
    """The Commands table: command name (its leading lowercase words) → its example."""
    table = README.split("## Commands", 1)[1].split("\n\n", 2)[1]
    examples = {}
    for row in table.splitlines()[2:]:
        first, _, example = [cell.strip().strip("`") for cell in row.strip("|").split(" | ")]
        name = " ".join(word for word in first.split() if word.islower() and not word.startswith("-"))
        examples[name] = example
    return examples


def test_the_first_block_holds_the_two_commands_and_ci_runs_the_second():
    first = code_blocks(README)[0].splitlines()
    commands = [line for line in first if line and not line.startswith("#")]
    assert commands == [
        "python3 -m pip install torch==2.13.0 && python3 -m pip install -e . && kbverify demo",
        "python3 -m pip install -q torch==2.13.0 && python3 -m pip install -q -e '.[test,ray]' && "
        "python3 -m pytest tests/unit && "
        "python3 -m pytest -m \"not gpu and not serial\" -n 2 --dist loadgroup --ignore=tests/unit && "
        "python3 -m pytest -m \"not gpu and serial\" --ignore=tests/unit"]
    assert (REPO / ".ci" / "run").read_text().rstrip().splitlines()[-1] == commands[1]


def test_the_check_example_prints_what_the_readme_shows(tmp_path):
    blocks = code_blocks(README.split("## Check a kernel", 1)[1])
    script, shown = blocks[0], blocks[1]
    source = re.search(r"<<'EOF'\n(.*?)^EOF\n", script, re.S | re.M).group(1)
    assert len(source.splitlines()) + 1 == 5  # a five-line example: the file and the command
    (tmp_path / "my_relu.py").write_text(source)
    command = next(line for line in script.splitlines() if line.startswith("kbverify check"))
    args = shlex.split(command, comments=True)[1:]
    args[args.index("my_relu.py")] = str(tmp_path / "my_relu.py")
    result = kbverify(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = result.stdout.strip().splitlines()
    expected = shown.strip().splitlines()
    assert len(printed) == len(expected), result.stdout
    for line, want in zip(printed, expected):
        assert loosely(want).fullmatch(_shown_warnings_only(line.strip(), want)), (line, want)


def _shown_warnings_only(line: str, want: str) -> str:
    """`line` less the timing warnings it adds after the warnings `want` shows: those come from measured time, as
    free to differ as the speedup (kbverify.core.status.TIMING_WARNINGS). Any other added warning is kept, to fail."""
    head, _, listed = line.partition("  warnings: ")
    printed = listed.split(", ") if listed else []
    shown = want.partition("  warnings: ")[2].split(", ") if "  warnings: " in want else []
    if printed[:len(shown)] != shown or not set(printed[len(shown):]) <= TIMING_WARNINGS:
        return line
    return f"{head}  warnings: {', '.join(shown)}" if shown else head


def test_every_example_names_a_command_and_options_that_exist():
    examples = example_commands()
    assert set(examples) == {"check", "rescore", "build", "score", "audit", "hidden generate", "report", "rejudge",
                             "compare", "demo"}
    for name, example in examples.items():
        words = shlex.split(example)
        assert words[1:1 + len(name.split())] == name.split(), example
        helped = kbverify(*name.split(), "--help", timeout=120)
        assert helped.returncode == 0, helped.stderr[-2000:]
        for option in (word for word in words if word.startswith("--")):
            assert option in helped.stdout, (example, option)
        for path in (word for word in words[2:] if word.startswith(("tasks/", "examples/"))):
            assert (REPO / path).exists(), path


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory) -> Path:
    """What the README's store examples read (`kbverify-demo/store.sqlite`): a small rescore under both protocols."""
    root = tmp_path_factory.mktemp("readme")
    protocol = root / "verified.json"
    protocol.write_text(json.dumps({"base": "verified", "name": "verified", "timing_budget_s": 0.2,
                                    "as_user_set": False}))
    code = "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x.clone()\n"
    source = root / "run.jsonl"
    source.write_text(json.dumps({"task": str(REPO / "tasks/basic/level1/1_ReLU.py"), "id": "relu_identity",
                                  "code": code, "claimed_speedup": 1.4}) + "\n")
    store = root / "store.sqlite"
    result = kbverify("rescore", str(source), "--store", str(store), "--protocol", f"original,{protocol}",
                      "--device", "cpu", "--timeout", "120")
    assert result.returncode == 0, result.stderr[-2000:]
    return store


@pytest.mark.parametrize("name, expect", [("score", "| fast_1 |"), ("report", "html: "),
                                          ("rejudge", "rejudged under kbv's rules")])
def test_the_store_examples_run(demo_store, tmp_path, name, expect):
    args = shlex.split(example_commands()[name])[1:]
    args = [str(demo_store) if arg == "kbverify-demo/store.sqlite" else
            str(tmp_path / arg) if arg.startswith("my-") else arg for arg in args]
    result = kbverify(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert expect in result.stdout


def test_every_status_and_warning_has_its_line():
    tables = README.split("## Statuses and warnings", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in tables.splitlines() if line.startswith("| `")]
    cells = {code for row in rows for cell in row[0::2] for code in re.findall(r"`([a-z0-9_:]+)`", cell)}
    assert {s.value for s in Status} <= cells
    assert {w.value for w in Warn} <= cells


def test_the_sections_and_links_a_newcomer_needs_are_there():
    assert "\n## Threat model and isolation\n" in README and "isolation: degraded" in README
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        assert (REPO / link).exists(), link
    assert "SPEC" not in README and "session" not in README
    assert len(README.splitlines()) < 126  # 117, and the short section on builds ahead of the GPU

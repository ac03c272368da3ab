#!/usr/bin/env python3
"""Fuzz kbverify's command line with malformed invocations (issue 35): every one must end with exit 2 and one line.

Each case is a valid invocation of one command with one thing made bad: a path under /proc or /sys or on a
read-only mount, a name too long or in a foreign encoding, a symlink loop, a FIFO, a file where a folder belongs and
the reverse, every option's bad values and missing values, unknown options, and the argument lists a new user types
by mistake. The cases are generated the same way every time (`--seed` only picks `--sample`s and the odd strings), so
a run is repeatable and a failure can be rerun alone (`--only NAME`).

By default the cases run in this process through `kbverify.cli.app.main` (milliseconds each): anything that would start
a worker process counts as the command having gone ahead (a wrong exit code: bad input must be refused first).
`--subprocess` runs each through `python -m kbverify` instead (about a second each), as a user would.

    python3 scripts/fuzz_cli.py                 # every case, a table, exit 1 if any case is not a clean exit 2
    python3 scripts/fuzz_cli.py --sample 20     # a fixed sample (what CI runs)
    python3 scripts/fuzz_cli.py --list          # the cases' names
    python3 scripts/fuzz_cli.py --only check-secret-short -v

A clean case: exit 2, nothing on stdout, exactly one line on stderr that starts `kbverify: `, no traceback, and
nothing left in the case's own output folder.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TASK = REPO / "tasks" / "basic" / "level1" / "1_ReLU.py"
RUN = REPO / "examples" / "published_run"
HONEST = ("import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
          "        return x.clamp_min(0)\n")
COMMANDS = ("check", "rescore", "score", "audit", "hidden generate", "report", "rejudge", "compare", "demo")


# --- the inputs every case draws on ----------------------------------------------------------------------------------

class World:
    """Files made once under `root`: good ones (the base invocations are valid) and hostile ones."""

    def __init__(self, root: Path, rng: random.Random):
        self.root = root
        self.rng = rng
        w = self._write
        self.sub = w("relu_clamp.py", HONEST)
        self.a_file = w("a_file.txt", "I am a file\n")
        self.empty = w("empty.txt", "")
        self.binary = w("binary.bin", b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01")
        self.latin1 = w("latin1.py", "# caf\xe9\n".encode("latin-1") + HONEST.encode())
        self.utf16 = w("utf16.py", HONEST.encode("utf-16"))
        self.not_a_task = w("level1/1_Nothing.py", "import torch\n\nbatch_size = 4\n")
        self.empty_dir = root / "empty_dir"
        self.empty_dir.mkdir()
        self.loop = self._loop("loop")
        self.dangling = root / "dangling"
        self.dangling.symlink_to(root / "nowhere" / "at-all")
        self.fifo = root / "fifo"
        os.mkfifo(self.fifo)
        self.long_name = root / ("x" * 300 + ".py")  # a name longer than NAME_MAX: lookups fail ENAMETOOLONG
        self.long_path = Path(str(root) + "/a" * 2100)  # a path longer than PATH_MAX
        self.bad_utf8 = root / os.fsdecode(b"caf\xe9\xff.py")  # a name that is not UTF-8
        w(self.bad_utf8.name, HONEST)
        self.newline = w("two\nlines.py", HONEST)
        self.dash = w("-looks-like-an-option.py", HONEST)
        self.unicode = w("\u30ab\u30fc\u30cd\u30eb \u2603.py", "x = (\n")
        self.store = self._store()
        self.text_store = w("notes.sqlite", "plain text, not SQLite\n" * 50)
        self.half_store = w("half.sqlite", self.store.read_bytes()[:len(self.store.read_bytes()) // 2])
        run = root / "run"
        self.jsonl = w("run/run.jsonl", json.dumps({"task": "level1/1_ReLU.py", "code": HONEST}) + "\n")
        shutil.copy(TASK, self._dir(run / "level1") / TASK.name)
        self.jsonl_code_number = w("run/code_number.jsonl",
                                   json.dumps({"task": "level1/1_ReLU.py", "code": 5}) + "\n")
        self.cuda_l1_code_list = w("run/cuda_l1.jsonl", json.dumps({"level_id": 1, "task_id": 1,
                                                                    "ref_code": TASK.read_text(),
                                                                    "custom_code": ["x"]}) + "\n")
        self.eval_results = RUN / "eval_results.json"
        self.protocol_bad = w("p_bad.json", json.dumps({"base": "verified", "atol": "abc"}))
        self.protocol_list = w("p_list.json", "[1, 2]")
        self.protocol_deep = w("p_deep.json", "[" * 50000)
        self.select_bad = w("select.json", json.dumps({"kernels": "all"}))
        self.audit_bad = w("audit.json", json.dumps({"format": "something-else"}))
        self.ro = _read_only_folder()

    def _write(self, name: str, content) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        return path

    @staticmethod
    def _dir(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _loop(self, name: str) -> Path:
        first, second = self.root / name, self.root / f"{name}.other"
        first.symlink_to(second.name)
        second.symlink_to(first.name)
        return first

    def _store(self) -> Path:
        from kbverify.core.records import Verdict
        from kbverify.core.status import Status
        from kbverify.results.store import Store

        path = self.root / "good.sqlite"
        with Store(path) as store:
            store.begin_run("r0", {"gpu_model": None, "driver": None, "cuda": None, "torch": None}, {"source": "x"})
            for protocol in ("original", "verified"):
                store.put(f"u-{protocol}", "r0", Verdict(
                    task="level1/1_ReLU@0", task_name="1_ReLU", level=1, problem_id=1, submission="s.py",
                    submission_sha256="0" * 64, protocol=protocol, protocol_sha256="1" * 64,
                    status=Status.PASSED, speedup=1.2, sample=0))
        return path

    # hostile paths, by what the slot expects ------------------------------------------------------------------

    def bad_inputs(self, o: Path, *, folder: bool) -> dict[str, Path | str]:
        """Paths that name nothing readable of the kind expected (a file, or a folder with `folder`)."""
        paths = {"missing": o / "missing.py", "proc-missing": "/proc/kbverify-nothing/x.py",
                 "proc-self-missing": "/proc/self/kbverify-none", "loop": self.loop, "dangling": self.dangling,
                 "long-name": self.long_name, "long-path": self.long_path, "empty-string": "",
                 "under-a-file": self.a_file / "x.py", "nul-device": "/dev/null"}
        if folder:
            paths.update({"a-file": self.a_file, "fifo": self.fifo})
        else:
            paths.update({"a-folder": self.empty_dir, "proc-folder": "/proc/self", "fifo": self.fifo})
        return paths

    def bad_outputs(self, o: Path) -> dict[str, Path | str]:
        """Places nothing can be written: pseudo file systems, a read-only mount, under a file, names too long."""
        paths = {"proc": "/proc/kbverify-out/x", "proc-self": "/proc/self/kbverify-out", "sys": "/sys/kbverify-out",
                 "under-a-file": self.a_file / "out", "long-name": o / ("y" * 300), "long-path": self.long_path,
                 "loop": self.loop, "dev-full-under": "/dev/full/out", "empty-string": ""}
        if self.ro is not None:
            paths["read-only-mount"] = self.ro / "kbverify-out"
        return paths


def _read_only_folder() -> Path | None:
    """A folder on a read-only mount of a system folder (none in most containers)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and "ro" in fields[5].split(","):
            point = Path(fields[4].replace("\\040", " "))
            if point.is_dir() and str(point).startswith(("/usr", "/etc", "/opt", "/boot", "/lib", "/srv", "/home")):
                return point
    return None


# --- the cases -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    name: str
    args: Callable[[World, Path], list | None]  # given the world and the case's own (empty) output folder


@dataclass
class Outcome:
    name: str
    code: int | None
    stdout: str
    stderr: str
    kind: str  # clean | traceback | wrong_exit | not_one_line | wrote
    seconds: float
    detail: str = ""


def _cases() -> list[Case]:
    cases: list[Case] = []

    def add(name, build):
        cases.append(Case(name, build))

    def each(prefix, values: dict | list | tuple, build):
        items = values.items() if isinstance(values, dict) else ((str(v), v) for v in values)
        for label, value in items:
            add(f"{prefix}-{label or 'empty'}", lambda w, o, value=value: build(w, o, value))

    def paths(prefix, kind, build):
        """One case per hostile path of `kind` (input-file, input-folder, output). (`--out` of audit is a prefix:
        OUT.json beside a symlink loop named OUT is a good place, so that one case is left out.)"""
        labels = {"input-file": ("missing", "proc-missing", "proc-self-missing", "loop", "dangling", "long-name",
                                 "long-path", "empty-string", "under-a-file", "nul-device", "a-folder", "proc-folder",
                                 "fifo"),
                  "input-folder": ("missing", "proc-missing", "loop", "dangling", "long-name", "long-path",
                                   "empty-string", "under-a-file", "a-file", "fifo"),
                  "output": ("proc", "proc-self", "sys", "under-a-file", "long-name", "long-path", "loop",
                             "dev-full-under", "empty-string", "read-only-mount")}[kind]
        for label in labels:
            def build_one(w, o, label=label):
                table = w.bad_outputs(o) if kind == "output" else w.bad_inputs(o, folder=kind == "input-folder")
                if label not in table:
                    return None  # not on this machine (no read-only mount): skipped
                return build(w, o, table[label])
            add(f"{prefix}-{label}", build_one)

    def missing_value(command, base, options):
        for option in options:
            add(f"{command.replace(' ', '-')}-{option.strip('-')}-no-value", lambda w, o, option=option:
                [*base(w, o), option])

    # the whole command line
    for name, args in {"no-arguments": [], "hidden-alone": ["hidden"], "unknown-command": ["frobnicate"],
                       "unknown-global-option": ["--frobnicate"], "hidden-unknown": ["hidden", "delete"],
                       "typo-of-check": ["chekc"], "empty-command": [""], "command-in-caps": ["CHECK"]}.items():
        add(f"cli-{name}", lambda w, o, args=args: list(args))
    for command in COMMANDS:
        add(f"{command.replace(' ', '-')}-unknown-option", lambda w, o, c=command: [*c.split(), "--frobnicate"])
        add(f"{command.replace(' ', '-')}-alone" if command not in ("demo", "score") else
            f"{command}-two-extra-arguments",
            lambda w, o, c=command: [*c.split()] if c not in ("demo", "score") else [*c.split(), "a", "b"])

    # check
    def check(w, o, *more):
        return ["check", w.sub, "--task", TASK, *more]
    paths("check-submission", "input-file", lambda w, o, p: ["check", p, "--task", TASK])
    each("check-submission-file", ("binary", "latin1", "utf16", "empty_dir"),
         lambda w, o, name: ["check", getattr(w, name), "--task", TASK])
    paths("check-task", "input-file", lambda w, o, p: check(w, o)[:2] + ["--task", p])
    each("check-task-file", ("not_a_task", "binary", "latin1", "empty", "sub", "bad_utf8", "newline", "dash",
                             "unicode"),
         lambda w, o, name: ["check", w.sub, "--task", getattr(w, name)])
    each("check-protocol", ("", ",", "bogus", "VERIFIED", "verified,bogus", "original;kbv", " , "),
         lambda w, o, v: check(w, o, "--protocol", v))
    each("check-protocol-file", ("protocol_bad", "protocol_list", "protocol_deep", "binary", "empty", "loop",
                                 "fifo", "long_name"),
         lambda w, o, name: check(w, o, "--protocol", getattr(w, name)))
    each("check-device", ("", "gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", "cpu ", "cuda:0:1", "\u00e9"),
         lambda w, o, v: check(w, o, "--device", v))
    paths("check-hidden-tests", "input-folder", lambda w, o, p: check(w, o, "--hidden-tests", p))
    each("check-only", ("", " ", "nope/zz", "hidden:zz"), lambda w, o, v: check(w, o, "--only", v))
    each("check-min-speedup", ("abc", "nan", "-1", "inf", ""), lambda w, o, v: check(w, o, "--min-speedup", v))
    each("check-secret", {"empty": "", "word": "xyz", "short": "cdcd3481e7edb9a", "long": "cdcd3481e7edb9a7a",
                          "two-words": "cdcd3481 e7edb9a7", "not-hex": "cdcd3481e7edb9ag", "prefixed": "0xcdcd3481e7edb9",
                          "unicode-digits": "\u0661" * 16},
         lambda w, o, v: check(w, o, "--secret", v))
    each("check-timeout", ("0", "-1", "nan", "inf", "abc", "0.5", ""), lambda w, o, v: check(w, o, "--timeout", v))
    each("check-hang-floor", ("-1", "nan", "inf", "abc"), lambda w, o, v: check(w, o, "--hang-floor", v))
    each("check-flag-value", ("--json=yes", "--verbose=1"), lambda w, o, v: check(w, o, v))
    missing_value("check", lambda w, o: ["check", w.sub], ("--task",))
    missing_value("check", check, ("--protocol", "--device", "--hidden-tests", "--only", "--min-speedup", "--secret",
                                   "--timeout", "--hang-floor"))

    # rescore
    def rescore(w, o, *more, source=None):
        return ["rescore", w.jsonl if source is None else source, "--store", o / "s.sqlite", "--device", "cpu", *more]
    paths("rescore-source", "input-file", lambda w, o, p: rescore(w, o, source=p))
    each("rescore-source-file", ("binary", "latin1", "empty", "jsonl_code_number",
                                 "cuda_l1_code_list", "a_file", "protocol_list"),
         lambda w, o, name: rescore(w, o, source=getattr(w, name)))
    each("rescore-format", ("", "csv", "JSONL", "auto ", "kernelbench"), lambda w, o, v: rescore(w, o, "--format", v))
    paths("rescore-tasks", "input-folder", lambda w, o, p: ["rescore", RUN, "--tasks", p, "--store", o / "s.sqlite",
                                                             "--device", "cpu"])
    paths("rescore-store", "output", lambda w, o, p: ["rescore", w.jsonl, "--store", p, "--device", "cpu"])
    each("rescore-store-file", ("text_store", "half_store", "binary", "empty_dir", "fifo"),
         lambda w, o, name: ["rescore", w.jsonl, "--store", getattr(w, name), "--device", "cpu"])
    each("rescore-protocol", ("", "bogus", "verified,bogus"), lambda w, o, v: rescore(w, o, "--protocol", v))
    each("rescore-samples", ("", "worst", "FIRST"), lambda w, o, v: rescore(w, o, "--samples", v))
    paths("rescore-report", "output", lambda w, o, p: rescore(w, o, "--report", p))
    each("rescore-report-file", ("a_file",), lambda w, o, name: rescore(w, o, "--report", getattr(w, name)))
    each("rescore-device", ("", "tpu", "cuda:x"), lambda w, o, v: rescore(w, o, "--device", v))
    paths("rescore-hidden-tests", "input-folder", lambda w, o, p: rescore(w, o, "--hidden-tests", p))
    each("rescore-timeout", ("0", "-1", "nan", "abc"), lambda w, o, v: rescore(w, o, "--timeout", v))
    each("rescore-limit", ("0", "-1", "abc", "1.5", ""), lambda w, o, v: rescore(w, o, "--limit", v))
    paths("rescore-select", "input-file", lambda w, o, p: rescore(w, o, "--select", p))
    each("rescore-select-file", ("select_bad", "binary", "empty"),
         lambda w, o, name: rescore(w, o, "--select", getattr(w, name)))
    paths("rescore-exclude-degenerate", "input-file", lambda w, o, p: rescore(w, o, "--exclude-degenerate", p))
    each("rescore-exclude-degenerate-file", ("audit_bad", "binary"),
         lambda w, o, name: rescore(w, o, "--exclude-degenerate", getattr(w, name)))
    each("rescore-clock", ("", "moon", "DEVICE"), lambda w, o, v: rescore(w, o, "--clock", v))
    each("rescore-group-by", ("", "a b", "task", "correct", "\u00e9"), lambda w, o, v: rescore(w, o, "--group-by", v))
    each("rescore-executor", ("", "spark", "RAY"), lambda w, o, v: rescore(w, o, "--executor", v))
    each("rescore-ray-address", ("x", ""), lambda w, o, v: rescore(w, o, "--ray-address", v))
    each("rescore-share-gpu", ("0", "9", "-1", "abc", "1.5"), lambda w, o, v: rescore(w, o, "--share-gpu", v))
    each("rescore-flag-value", ("--json=yes", "--allow-mixed=no", "-v=1"), lambda w, o, v: rescore(w, o, v))
    missing_value("rescore", rescore, ("--format", "--tasks", "--store", "--protocol", "--samples", "--report",
                                       "--device", "--hidden-tests", "--timeout", "--limit", "--select",
                                       "--exclude-degenerate", "--clock", "--group-by", "--executor", "--ray-address",
                                       "--share-gpu"))

    # score
    def score(w, o, *more, source=None):
        return ["score", w.store if source is None else source, *more]
    paths("score-source", "input-file", lambda w, o, p: score(w, o, source=p))
    each("score-source-file", ("eval_results", "text_store", "half_store", "binary", "latin1", "empty", "jsonl",
                               "protocol_list"),
         lambda w, o, name: score(w, o, source=getattr(w, name)))
    paths("score-baseline", "input-file", lambda w, o, p: score(w, o, "--baseline", p, "--level", "1",
                                                                 source=w.eval_results))
    each("score-baseline-file", ("binary", "empty", "protocol_list", "a_file"),
         lambda w, o, name: score(w, o, "--baseline", getattr(w, name), "--level", "1", source=w.eval_results))
    each("score-level", ("0", "-1", "abc", "1.5"), lambda w, o, v: score(w, o, "--level", v))
    each("score-p", ("", ",", "-1", "nan", "0,0", "x", "inf"), lambda w, o, v: score(w, o, "--p", v))
    paths("score-exclude-degenerate", "input-file", lambda w, o, p: score(w, o, "--exclude-degenerate", p))
    each("score-samples", ("", "worst"), lambda w, o, v: score(w, o, "--samples", v))
    each("score-clock", ("", "moon"), lambda w, o, v: score(w, o, "--clock", v))
    each("score-group-by", ("", "a b", "speedup"), lambda w, o, v: score(w, o, "--group-by", v))
    missing_value("score", score, ("--baseline", "--level", "--p", "--exclude-degenerate", "--samples", "--clock",
                                   "--group-by"))

    # audit
    def audit(w, o, *more, tasks=None):
        return ["audit", TASK if tasks is None else tasks, "--out", o / "audit", *more]
    paths("audit-tasks", "input-file", lambda w, o, p: audit(w, o, tasks=p))
    each("audit-tasks-file", ("not_a_task", "binary", "latin1", "empty", "empty_dir"),
         lambda w, o, name: audit(w, o, tasks=getattr(w, name)))
    paths("audit-out", "output", lambda w, o, p: None if p == w.loop else ["audit", TASK, "--out", p])
    each("audit-protocol", ("", "bogus"), lambda w, o, v: audit(w, o, "--protocol", v))
    each("audit-device", ("", "tpu"), lambda w, o, v: audit(w, o, "--device", v))
    paths("audit-hidden-tests", "input-folder", lambda w, o, p: audit(w, o, "--hidden-tests", p))
    each("audit-levels", ("", "x", "0", "1,x", "-1"), lambda w, o, v: audit(w, o, "--levels", v))
    each("audit-seeds", ("0", "-1", "abc"), lambda w, o, v: audit(w, o, "--seeds", v))
    each("audit-timeout", ("0", "nan", "abc"), lambda w, o, v: audit(w, o, "--timeout", v))
    each("audit-gpus", ("0", "-1", "abc"), lambda w, o, v: audit(w, o, "--gpus", v))
    each("audit-per-gpu", ("0", "-1", "abc"), lambda w, o, v: audit(w, o, "--per-gpu", v))
    each("audit-memory-budget-gib", ("0", "-1", "nan", "abc"), lambda w, o, v: audit(w, o, "--memory-budget-gib", v))
    each("audit-memory-factor", ("0", "-1", "inf", "abc"), lambda w, o, v: audit(w, o, "--memory-factor", v))
    paths("audit-footprints", "output", lambda w, o, p: audit(w, o, "--footprints", p))
    paths("audit-peaks", "output", lambda w, o, p: audit(w, o, "--peaks", p))
    each("audit-retry-per-gpu", ("-1", "abc"), lambda w, o, v: audit(w, o, "--retry-per-gpu", v))
    each("audit-shard", ("x", "1/", ""), lambda w, o, v: audit(w, o, "--shard", v))
    paths("audit-claims", "input-folder", lambda w, o, p: audit(w, o, "--claims", p))
    each("audit-flag-value", ("--mps=yes", "--fresh=1", "--no-hidden=1", "--published=no", "--report-only=x"),
         lambda w, o, v: audit(w, o, v))
    add("audit-estimate-only-without-footprints", lambda w, o: audit(w, o, "--estimate-only"))
    add("audit-copies-without-out", lambda w, o: ["audit", TASK, "--gpus", "2"])
    missing_value("audit", audit, ("--protocol", "--out", "--device", "--hidden-tests", "--levels", "--seeds",
                                   "--timeout", "--gpus", "--per-gpu", "--memory-budget-gib", "--memory-factor",
                                   "--footprints", "--peaks", "--retry-per-gpu"))

    # hidden generate
    paths("hidden-tasks", "input-file", lambda w, o, p: ["hidden", "generate", p, "--out", o / "hidden"])
    paths("hidden-out", "output", lambda w, o, p: ["hidden", "generate", TASK, "--out", p])
    each("hidden-out-file", ("a_file",), lambda w, o, name: ["hidden", "generate", TASK, "--out", getattr(w, name)])
    missing_value("hidden generate", lambda w, o: ["hidden", "generate", TASK], ("--out",))

    # report
    paths("report-store", "input-file", lambda w, o, p: ["report", p, "--out", o / "report"])
    each("report-store-file", ("text_store", "half_store", "binary", "empty"),
         lambda w, o, name: ["report", getattr(w, name), "--out", o / "report"])
    paths("report-out", "output", lambda w, o, p: ["report", w.store, "--out", p])
    each("report-option", {"group-by": ("--group-by", "a b"), "clock": ("--clock", "moon")},
         lambda w, o, v: ["report", w.store, "--out", o / "report", *v])
    missing_value("report", lambda w, o: ["report", w.store], ("--out",))

    # rejudge
    paths("rejudge-store", "input-file", lambda w, o, p: ["rejudge", p, "--into", o / "copy.sqlite"])
    each("rejudge-store-file", ("text_store", "half_store", "binary"),
         lambda w, o, name: ["rejudge", getattr(w, name), "--into", o / "copy.sqlite"])
    paths("rejudge-into", "output", lambda w, o, p: ["rejudge", w.store, "--into", p])
    each("rejudge-into-existing", ("a_file", "store", "empty_dir"),
         lambda w, o, name: ["rejudge", w.store, "--into", getattr(w, name)])
    each("rejudge-protocol", ("", "bogus", "kbv,verified", "protocol_bad"),
         lambda w, o, v: ["rejudge", w.store, "--protocol", str(getattr(w, v, v)), "--into", o / "copy.sqlite"])
    add("rejudge-flag-value", lambda w, o: ["rejudge", w.store, "--json=yes"])

    # compare
    paths("compare-a", "input-file", lambda w, o, p: ["compare", p, w.store])
    paths("compare-b", "input-file", lambda w, o, p: ["compare", w.store, p])
    each("compare-file", ("text_store", "half_store", "binary", "empty", "jsonl"),
         lambda w, o, name: ["compare", getattr(w, name), w.store])
    each("compare-protocol", ("bogus", "", " ", "Verified", "verified "), lambda w, o, v: ["compare", w.store, w.store, "--protocol", v])
    add("compare-store-and-audit", lambda w, o: ["compare", w.store, w.audit_bad])
    add("compare-one-argument", lambda w, o: ["compare", w.store])

    # demo
    paths("demo-out", "output", lambda w, o, p: ["demo", "--out", p])
    each("demo-out-file", ("a_file",), lambda w, o, name: ["demo", "--out", getattr(w, name)])
    add("demo-flag-value", lambda w, o: ["demo", "--verbose=1"])
    missing_value("demo", lambda w, o: ["demo"], ("--out",))
    return cases


# --- running them ----------------------------------------------------------------------------------------------------

class WentAhead(BaseException):
    """A worker process was about to start: the command took its input as good."""


class TimedOut(BaseException):
    pass


class _Stderr:
    """Where logging writes: whatever sys.stderr is at the time (each case swaps it)."""

    def write(self, text):
        return sys.stderr.write(text)

    def flush(self):
        sys.stderr.flush()


def _refuse_workers() -> None:
    from kbverify.harness import provenance, sandbox

    def refuse(*args, **kwargs):
        raise WentAhead()

    for module, name in ((sandbox, "run_children"), (sandbox, "_forkserver"), (sandbox, "start_early"),
                         (sandbox, "run_child"), (provenance, "collect")):
        setattr(module, name, refuse)
    subprocess.Popen = refuse  # audit copies, nvidia-smi: nothing starts


def run_in_process(argv: list[str], timeout_s: float) -> tuple[int | None, str, str, str]:
    """(exit code, stdout, stderr, what escaped) of `kbverify argv` run by `kbverify.cli.app.main` here."""
    from kbverify.cli import app as cli

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv, sys.stdout, sys.stderr
    sys.argv, sys.stdout, sys.stderr = ["kbverify", *argv], out, err
    escaped, code = "", None

    def alarm(*_):
        raise TimedOut()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        cli.main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except WentAhead:
        escaped = "went ahead (a worker would have started)"
    except TimedOut:
        escaped = f"timed out after {timeout_s:g} s"
    except BaseException as error:  # noqa: BLE001 - whatever escapes is the finding
        import traceback

        escaped = "escaped: " + "".join(traceback.format_exception(error))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.argv, sys.stdout, sys.stderr = saved
    return code, out.getvalue(), err.getvalue(), escaped


def run_subprocess(argv: list[str], timeout_s: float) -> tuple[int | None, str, str, str]:
    try:
        done = subprocess.run([sys.executable, "-m", "kbverify", *argv], capture_output=True, timeout=timeout_s,
                              cwd=REPO, stdin=subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired as expired:
        return None, "", "", f"timed out after {timeout_s:g} s ({(expired.stderr or b'')[-300:]!r})"
    decode = lambda data: data.decode("utf-8", "replace")  # noqa: E731
    return done.returncode, decode(done.stdout), decode(done.stderr), ""


def classify(code, stdout: str, stderr: str, escaped: str, wrote: list[str]) -> tuple[str, str]:
    if "Traceback" in stdout + stderr + escaped or escaped.startswith("escaped"):
        return "traceback", escaped or stderr[-300:]
    if escaped or code != 2:
        return "wrong_exit", escaped or f"exit {code}: {(stderr or stdout).strip()[:200]}"
    lines = stderr.splitlines()
    if stdout or len(lines) != 1 or not stderr.startswith("kbverify: ") or not lines[0][len("kbverify: "):].strip():
        return "not_one_line", f"stdout {stdout[:100]!r}, stderr {stderr[:200]!r}"
    if wrote:
        return "wrote", f"left {', '.join(wrote)}"
    return "clean", lines[0]


def run(cases: list[Case], world: World, *, subprocess_mode: bool, timeout_s: float,
        verbose: bool) -> list[Outcome]:
    outcomes = []
    runner = run_subprocess if subprocess_mode else run_in_process
    for index, case in enumerate(cases):
        out = world.root / "cases" / f"{index:04d}"
        out.mkdir(parents=True)
        argv = case.args(world, out)
        if argv is None:
            continue
        argv = [str(arg) for arg in argv]
        started = time.monotonic()
        code, stdout, stderr, escaped = runner(argv, timeout_s)
        wrote = sorted(str(path.relative_to(out)) for path in out.rglob("*"))
        kind, detail = classify(code, stdout, stderr, escaped, wrote)
        outcome = Outcome(case.name, code, stdout, stderr, kind, time.monotonic() - started, detail)
        outcomes.append(outcome)
        if verbose or kind != "clean":
            print(f"{kind:13} {case.name}: {detail[:300]}", file=sys.__stderr__ if not subprocess_mode else sys.stderr)
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    count = lambda kind: sum(o.kind == kind for o in outcomes)  # noqa: E731
    rows = [("cases", len(outcomes)), ("clean exit 2", count("clean")), ("tracebacks", count("traceback")),
            ("wrong exit codes", count("wrong_exit")), ("exit 2, not one line", count("not_one_line")),
            ("exit 2, wrote files", count("wrote"))]
    width = max(len(name) for name, _ in rows)
    lines = [f"| {'':{width}} | count |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name:{width}} | {value:5d} |" for name, value in rows]
    return "\n".join(lines)


def select(cases: list[Case], *, sample: int | None, seed: int, only: list[str] | None) -> list[Case]:
    if only:
        chosen = [case for case in cases if any(case.name == name or case.name.startswith(name) for name in only)]
        if not chosen:
            raise SystemExit(f"no case named {', '.join(only)} (--list shows them)")
        return chosen
    if sample is not None and sample < len(cases):
        picked = sorted(random.Random(seed).sample(range(len(cases)), sample))
        return [cases[index] for index in picked]
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=35, help="picks --sample's cases (default 35)")
    parser.add_argument("--sample", type=int, default=None, help="run this many cases, picked by --seed")
    parser.add_argument("--only", action="append", help="run the cases with this name or prefix (repeatable)")
    parser.add_argument("--subprocess", action="store_true", help="run each case as `python -m kbverify`")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per case (default 20 in process, 60 as a subprocess)")
    parser.add_argument("--list", action="store_true", help="print the cases' names and stop")
    parser.add_argument("--json", type=Path, default=None, help="also write every outcome to this JSON file")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every case's line, clean ones too")
    options = parser.parse_args(argv)

    cases = _cases()
    if options.list:
        print("\n".join(case.name for case in cases))
        return 0
    names = [case.name for case in cases]
    assert len(set(names)) == len(names), [name for name in names if names.count(name) > 1]
    chosen = select(cases, sample=options.sample, seed=options.seed, only=options.only)
    timeout_s = options.timeout or (60.0 if options.subprocess else 20.0)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kbverify-fuzz-") as folder:
        root = Path(folder)
        world = World(root, random.Random(options.seed))
        if not options.subprocess:
            logging.basicConfig(stream=_Stderr(), level=logging.WARNING, force=True,
                                format="%(levelname)s %(name)s: %(message)s")
            _refuse_workers()
        with contextlib.chdir(root):  # a relative default (kbverify-demo, kbverify-store.sqlite) lands here
            outcomes = run(chosen, world, subprocess_mode=options.subprocess, timeout_s=timeout_s,
                           verbose=options.verbose)
    print(table(outcomes))
    print(f"{len(outcomes)} cases in {time.monotonic() - started:.1f} s "
          f"({'subprocess' if options.subprocess else 'in process'}, seed {options.seed})")
    if options.json is not None:
        options.json.write_text(json.dumps([o.__dict__ for o in outcomes], indent=1))
    return 0 if all(o.kind == "clean" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())

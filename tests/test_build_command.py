"""`kbverify build FOLDER`: each native extension compiled once into the build cache, found there the second time,
and a submission whose build fails counted as failed with its compiler's error (exit 1, docs/cli.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The submissions' own torch/extension.h, found before torch's (-I before -isystem): the builds are real C++ builds
# through load_inline and ninja, without the ~20 s that torch's headers take to parse. Its path is in the source,
# so both runs ask for the same build (a path that changed would change the command, and ninja would rebuild).
# It lies in the repository: the build runs sandboxed, where /tmp (and a test's tmp_path in it) is private and
# empty, and the compiler skips an include folder it cannot see (kbverify.harness.confine).
STUB_INCLUDE = REPO / "tests" / "build_stub"
NATIVE = '''import torch.nn as nn
from torch.utils.cpp_extension import load_inline

library = load_inline(name="kbverify_build_{name}", cpp_sources={code!r}, extra_include_paths=[{include!r}],
                      is_python_module=False, verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0)
'''


def write_corpus(root: Path) -> Path:
    include = STUB_INCLUDE
    folder = root / "submissions"
    folder.mkdir()
    (folder / "good.py").write_text(NATIVE.format(name="good", code="int kbverify_answer() { return 42; }",
                                                  include=str(include)))
    (folder / "bad.py").write_text(NATIVE.format(name="bad", code="int kbverify_broken( { return; }",
                                                 include=str(include)))
    (folder / "plain.py").write_text("import torch.nn as nn\nclass ModelNew(nn.Module):\n"
                                     "    def forward(self, x):\n        return x\n")
    return folder


def build(folder: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KBVERIFY_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "kbverify", "build", str(folder), "--device", "cpu", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


def test_a_folder_builds_once_then_is_cached_and_a_bad_build_is_a_failure_with_its_error(tmp_path):
    folder, cache = write_corpus(tmp_path), tmp_path / "cache"
    first = build(folder, cache)
    assert first.returncode == 1, first.stderr[-2000:]  # a submission's build failed
    summary = json.loads(first.stdout)
    assert (summary["built"], summary["cached"], summary["failed"], summary["without_native"]) == (1, 0, 1, 1)
    failed = [o for o in summary["outcomes"] if o["kind"] == "failed"]
    assert [o["entry_id"] for o in failed] == ["bad.py"]
    assert "kbverify_broken" in failed[0]["message"] and "error" in failed[0]["message"]
    assert "native builds" in first.stderr  # progress, on stderr

    second = build(folder, cache)
    assert second.returncode == 1, second.stderr[-2000:]
    again = json.loads(second.stdout)
    assert (again["built"], again["cached"], again["failed"]) == (0, 1, 1)
    assert [o["entry_id"] for o in again["outcomes"] if o["kind"] == "cached"] == ["good.py"]


def test_the_text_summary_names_the_failure_and_the_counts(tmp_path):
    folder, cache = write_corpus(tmp_path), tmp_path / "cache"
    (folder / "bad.py").unlink()
    env = {**os.environ, "KBVERIFY_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-m", "kbverify", "build", str(folder), "--device", "cpu"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("1 built, 0 cached, 0 failed, 0 unreached (1 without native code) in ")
    assert "builds at a time, MAX_JOBS=" in done.stdout


def test_a_missing_source_is_bad_input(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kbverify", "build", str(tmp_path / "nowhere")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr

"""The sandbox wherever Python lives (issue 35): a venv or checkout under /tmp, a TMPDIR below /tmp.

The job's /tmp is private and empty, so what the interpreter reads there (a venv, a checkout, `pip install
--target /tmp/site`) must be bound back into it, and the folders the job writes made in it, whatever the parent's
TMPDIR: before, `check` from a venv under /tmp lost kbverify's own modules (`runtime_error`), and TMPDIR below /tmp
made the view's mounts fail, so an honest kernel read `crashed` with `ISOLATION: DEGRADED`. A view that cannot be
built runs nothing: the command exits 3 with one line naming the path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RELU = REPO / "tasks" / "basic" / "level1" / "1_ReLU.py"
CPP_RELU = REPO / "tests" / "corpus" / "honest" / "relu_cpp_extension.py"
HONEST = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0)\n"
WRONG = HONEST.replace("x.clamp_min(0)", "x.clamp_min(0) * 0.5")
TIMEOUT = ["--timeout", "60"]


def _under_tmp(path: Path) -> Path:
    """`path` where it lies below /tmp (pytest's tmp_path does, unless TMPDIR moves it), else a folder that does."""
    if str(path.resolve()).startswith("/tmp/"):
        return path
    return Path(tempfile.mkdtemp(prefix="kbv-paths-", dir="/tmp"))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _env(**extra) -> dict:
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "KBVERIFY_START_METHOD", "KBVERIFY_SANDBOX")}
    env.update({key: str(value) for key, value in extra.items()})
    return env


def _verdicts(result: subprocess.CompletedProcess) -> dict:
    (line,) = result.stdout.splitlines()
    return json.loads(line)["verdicts"]


@pytest.fixture(scope="module")
def fast_verified(tmp_path_factory) -> Path:
    """`verified` with a short timing budget, without the set run as a user calls it (as tests/test_cli.py)."""
    return _write(tmp_path_factory.mktemp("protocols") / "verified.json",
                  json.dumps({"base": "verified", "name": "verified", "timing_budget_s": 0.2,
                              "as_user_set": False}))


# --- TMPDIR below /tmp -------------------------------------------------------------------------------------------

def test_check_with_tmpdir_below_tmp_passes_an_honest_kernel_and_rejects_a_wrong_one(tmp_path, fast_verified):
    base = _under_tmp(tmp_path)
    tmpdir = base / "tmp"
    tmpdir.mkdir()
    honest, wrong = _write(base / "honest.py", HONEST), _write(base / "wrong.py", WRONG)
    env = _env(TMPDIR=tmpdir)

    def check(submission, protocol):
        return subprocess.run([sys.executable, "-m", "kbverify", "check", str(submission), "--task", str(RELU),
                               "--protocol", protocol, "--device", "cpu", "--json", *TIMEOUT],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    passed = check(honest, f"original,{fast_verified}")
    assert passed.returncode == 0, passed.stdout[-2000:] + passed.stderr[-2000:]
    for name, verdict in _verdicts(passed).items():
        assert verdict["status"] == "passed" and verdict["isolation"] == "isolated", (name, verdict)
    rejected = check(wrong, "original")
    assert rejected.returncode == 1, rejected.stdout[-2000:] + rejected.stderr[-2000:]
    verdict = _verdicts(rejected)["original"]
    assert verdict["status"] == "incorrect" and verdict["isolation"] == "isolated", verdict


# --- a venv and a checkout under /tmp ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def under_tmp(tmp_path_factory):
    """A fresh venv at <dir>/venv (this interpreter's packages visible, as --system-site-packages gives), kbverify
    copied to <dir>/src and installed into it editable, and a TMPDIR and build cache below <dir>: everything
    kbverify and its jobs read or write lies under /tmp. Built once for the module."""
    base = _under_tmp(tmp_path_factory.mktemp("kbv-under-tmp"))
    venv, src = base / "venv", base / "src"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    # Where these tests themselves run in a venv, --system-site-packages shows the base Python's packages, not
    # torch's: the new venv sees this interpreter's site-packages too.
    site_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    import site

    _write(Path(site_packages) / "outer.pth", "\n".join(site.getsitepackages()) + "\n")
    src.mkdir()
    shutil.copytree(REPO / "kbverify", src / "kbverify", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                                "--no-index", "-e", str(src)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    (base / "tmp").mkdir()
    (base / "cache").mkdir()
    env = _env(TMPDIR=base / "tmp", KBVERIFY_CACHE=base / "cache")
    found = subprocess.run([str(python), "-c", "import kbverify; print(kbverify.__file__)"], cwd=base, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert found == str(src / "kbverify" / "__init__.py"), found  # the copy under /tmp, not this checkout
    yield {"base": base, "venv": venv, "src": src, "env": env, "kbverify": venv / "bin" / "kbverify"}
    if not str(base).startswith(str(tmp_path_factory.getbasetemp())):
        shutil.rmtree(base, ignore_errors=True)


def _check_from(under_tmp, submission: Path, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(under_tmp["kbverify"]), "check", str(submission), "--task", str(RELU),
                           "--device", "cpu", "--json", *args],
                          cwd=under_tmp["base"], env=under_tmp["env"], capture_output=True, text=True,
                          timeout=timeout)


def test_check_from_a_venv_and_checkout_under_tmp_passes_an_honest_kernel_and_rejects_a_wrong_one(
        under_tmp, fast_verified):
    honest = _write(under_tmp["base"] / "subs" / "honest.py", HONEST)
    wrong = _write(under_tmp["base"] / "subs" / "wrong.py", WRONG)
    # `verified` imports kbverify's timing modules in the job, after the sandbox is built: from the copy under /tmp
    passed = _check_from(under_tmp, honest, "--protocol", f"original,{fast_verified}", *TIMEOUT)
    assert passed.returncode == 0, passed.stdout[-2000:] + passed.stderr[-2000:]
    for name, verdict in _verdicts(passed).items():
        assert verdict["status"] == "passed" and verdict["isolation"] == "isolated", (name, verdict)
    rejected = _check_from(under_tmp, wrong, "--protocol", str(fast_verified), *TIMEOUT)
    assert rejected.returncode == 1, rejected.stdout[-2000:] + rejected.stderr[-2000:]
    verdict = _verdicts(rejected)["verified"]
    assert verdict["status"] == "incorrect" and verdict["isolation"] == "isolated", verdict


LOOK = """import json, os
found = {{}}
for name, path in [*{paths!r}.items(), ("job_tmpdir", os.environ["TMPDIR"])]:
    try:
        open(os.path.join(path, "planted"), "w").close()
        found[name] = "wrote"
    except OSError as error:
        found[name] = error.strerror
found["beside"] = os.path.exists({beside!r})
found["parents_tmpdir"] = os.path.isdir({tmpdir!r})
raise RuntimeError("FOUND" + json.dumps(found) + "END")
"""


def test_what_is_bound_back_is_read_only_and_the_rest_of_the_hosts_tmp_stays_out_of_sight(under_tmp):
    base = under_tmp["base"]
    beside = _write(base / "beside" / "secret.txt", "the host's, not the job's")
    paths = {"venv": str(under_tmp["venv"]), "src": str(under_tmp["src"] / "kbverify")}
    probe = _write(base / "subs" / "look.py", LOOK.format(paths=paths, beside=str(beside), tmpdir=str(base / "tmp")))
    result = _check_from(under_tmp, probe, "--protocol", "original", *TIMEOUT)
    verdict = _verdicts(result)["original"]
    message = verdict["message"]
    assert "FOUND" in message, verdict
    found = json.loads(message[message.index("FOUND") + 5:message.index("END")])
    assert found["venv"] != "wrote" and found["src"] != "wrote", found  # bound back read-only
    assert found["job_tmpdir"] == "wrote", found  # its own TMPDIR exists and is its own
    assert found["beside"] is False, found  # the rest of the host's /tmp is not bound back
    assert found["parents_tmpdir"] is True, found  # the parent's TMPDIR folder exists in the job's view
    assert not (under_tmp["venv"] / "planted").exists() and not (under_tmp["src"] / "kbverify" / "planted").exists()
    assert verdict["isolation"] == "isolated", verdict


@pytest.mark.slow
def test_a_cpp_extension_builds_and_passes_from_a_venv_under_tmp(under_tmp):
    """The issue's first symptom: honest C++ kernels judged `compile_error` from a venv under /tmp. The build cache
    lies under /tmp too (KBVERIFY_CACHE), so the job's writable build folders are made in its private /tmp."""
    result = _check_from(under_tmp, CPP_RELU, "--protocol", "original", "--timeout", "300", timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    verdict = _verdicts(result)["original"]
    assert verdict["status"] == "passed" and verdict["build"]["extension_called"], verdict
    assert verdict["isolation"] == "isolated", verdict


# --- a sandbox that cannot be built ------------------------------------------------------------------------------

REFUSE = """import errno, sys
from kbverify.harness import confine


def refuse(path, root, copy):  # as a mount the kernel refuses would
    raise PermissionError(errno.EPERM, "Operation not permitted")


confine._bind_back_one = refuse
sys.argv = ["kbverify", *sys.argv[1:]]
from kbverify.__main__ import main

main()
"""


def test_a_sandbox_that_cannot_be_built_runs_nothing_and_exits_3_naming_the_path(tmp_path):
    """A bind the kernel refuses (made to fail here; the workers fork from this script, so they carry the
    patch) ends the command with exit 3 and one line that names the path and what to do: no verdict."""
    base = _under_tmp(tmp_path)
    library = base / "lib"
    library.mkdir()
    script = _write(base / "refuse.py", REFUSE)
    honest = _write(base / "honest.py", HONEST)
    env = _env(KBVERIFY_START_METHOD="fork", PYTHONPATH=os.pathsep.join([str(library), str(REPO)]))
    result = subprocess.run([sys.executable, str(script), "check", str(honest), "--task", str(RELU),
                             "--protocol", "original", "--device", "cpu", *TIMEOUT],
                            cwd=base, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 3, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert result.stdout == "", result.stdout
    (line,) = [entry for entry in result.stderr.splitlines() if entry.startswith("kbverify: ")]
    assert "sandbox could not be built" in line and "Operation not permitted" in line, line
    # the first path bound back is named: this test's library, or the checkout itself where that lies under /tmp
    assert (str(base) in line or str(REPO) in line) and "KBVERIFY_SANDBOX=off" in line, line
    assert "Traceback" not in result.stderr, result.stderr[-2000:]


def test_a_tmpdir_below_tmp_is_no_private_root_of_its_own(monkeypatch, tmp_path):
    from kbverify.harness import confine

    below = _under_tmp(tmp_path) / "tmp"
    below.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(below))
    roots = confine._private_roots()
    assert "/tmp" in roots and not any(root.startswith("/tmp/") for root in roots), roots

"""The sandbox around submission code (SPEC §4, §7): what a candidate process can see, write and signal, what its
messages can claim, and that nothing it starts outlives kbverify. Where this machine allows no namespaces the
isolation tests skip and say so; the degraded path is tested either way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kbverify.harness.sandbox import run_child

REPO = Path(__file__).resolve().parents[1]


def _probe(source: str, **kwargs):
    """Run `source` as a submission's module in a build job; what it found comes back as its error text."""
    outcome = run_child("build", {"submission_source": source, "device": "cpu"}, timeout_s=60, **kwargs)
    if outcome.isolation != "isolated":
        pytest.skip(f"isolation unavailable here: {outcome.isolation} ({outcome.isolation_reason})")
    return outcome


LOOK_AROUND = """
import json, os, signal
found = {{"listed": sorted(p for p in os.listdir("/proc") if p.isdigit())}}
for pid in {pids}:
    for what in ("status", "cwd", "environ", "fd"):
        try:
            path = f"/proc/{{pid}}/{{what}}"
            found[path] = "opened" if (os.listdir(path) if what == "fd" else open(path).read(1) if what != "cwd"
                                       else os.listdir(path)) is not None else "?"
        except OSError as error:
            found[path] = error.strerror
    try:
        os.kill(pid, signal.SIGKILL)
        found[f"kill {{pid}}"] = "sent"
    except OSError as error:
        found[f"kill {{pid}}"] = error.strerror
for folder in {folders}:
    try:
        with open(os.path.join(folder, "planted"), "w") as handle:
            handle.write("x")
        found[folder] = "wrote"
    except OSError as error:
        found[folder] = error.strerror
raise RuntimeError("FOUND" + json.dumps(found))
"""


def _found(outcome) -> dict:
    error = outcome.result["error"]
    return json.loads(error[error.index("FOUND") + 5:])


def test_a_candidate_sees_signals_and_writes_nothing_of_the_parent_or_other_workers(tmp_path):
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # stands in for a judge
    parents_folder = tmp_path / "parent"
    parents_folder.mkdir()
    try:
        pids = [os.getpid(), os.getppid(), sibling.pid]
        folders = [str(parents_folder), str(REPO), str(Path.home()), "/etc"]
        outcome = _probe(LOOK_AROUND.format(pids=pids, folders=folders))
        found = _found(outcome)
        assert found["listed"] == ["1", "2"]  # its namespace's init and itself
        for pid in pids:
            for what in ("status", "cwd", "environ", "fd"):
                assert found[f"/proc/{pid}/{what}"] != "opened", found
            assert found[f"kill {pid}"] != "sent", found
        assert sibling.poll() is None  # still running
        for folder in folders:
            assert found[folder] != "wrote", (folder, found)
        assert not (parents_folder / "planted").exists() and not (REPO / "planted").exists()
        # its temporary folders and /dev/shm are its own, writable and empty: nothing reaches the host's
        shared = _probe("import os\nfor folder in ('/dev/shm', '/var/tmp'):\n"
                        "    open(folder + '/planted', 'w').write('x')\n    assert os.listdir(folder) == ['planted']\n")
        assert shared.result["ok"] is True, shared.result
        assert not Path("/dev/shm/planted").exists() and not Path("/var/tmp/planted").exists()
    finally:
        sibling.kill()
        sibling.wait()


def test_a_candidate_writes_its_scratch_and_the_folders_it_is_given(tmp_path):
    given = tmp_path / "given"
    outcome = _probe(f"import os\nopen(os.path.join(os.environ['HOME'], 'x'), 'w').write('x')\n"
                     f"open({str(given / 'out')!r}, 'w').write('ok')\nopen('/tmp/scratch', 'w').write('x')\n",
                     writable=(given,))
    assert outcome.result["ok"] is True, outcome.result
    assert (given / "out").read_text() == "ok"
    assert not Path("/tmp/scratch").exists()  # its /tmp is its own


def test_a_candidate_cannot_undo_its_mounts_or_regain_privileges():
    source = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
found = {"umount_tmp": libc.umount2(b"/tmp", 2), "remount_root": libc.mount(None, b"/", None, 32 | 4096, None),
         "status": [l for l in open("/proc/self/status") if l.startswith(("CapEff", "CapBnd", "NoNewPrivs"))]}
import json
raise RuntimeError("FOUND" + json.dumps(found))
"""
    found = _found(_probe(source))
    assert found["umount_tmp"] != 0 and found["remount_root"] != 0
    caps = {line.split(":")[0]: line.split(":")[1].strip() for line in found["status"]}
    assert int(caps["CapEff"], 16) == 0 and int(caps["CapBnd"], 16) == 0 and caps["NoNewPrivs"] == "1"


def test_a_candidate_runs_as_a_uid_of_its_own_and_cannot_write_kernel_settings():
    source = """
import json, os
found = {"uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups()}
for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname"):
    try:
        open(path, "w").close()
        found[path] = "opened"
    except OSError as error:
        found[path] = error.strerror
raise RuntimeError("FOUND" + json.dumps(found))
"""
    outcome = _probe(source)
    found = _found(outcome)
    for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname"):
        assert found[path] != "opened", found
    if os.geteuid() == 0 and "kept uid 0" not in outcome.isolation_reason:
        assert found["uid"] != 0 and found["euid"] != 0 and found["groups"] == [], found


def test_a_result_counts_only_from_a_job_that_exits_0_after_sending_it():
    source = ("import os, signal\nfrom kbverify.worker import worker\n"
              "worker.send({'kind': 'result', 'result': {'ok': True, 'error': '', 'extensions': {}}})\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    outcome = _probe(source)
    assert outcome.died and outcome.result is None
    assert outcome.signal == signal.SIGKILL


def test_the_job_cannot_speak_for_its_supervisor():
    source = ("from kbverify.worker import worker\n"
              "worker.send({'kind': 'exit', 'code': 0, 'signal': None})\n"
              "worker.send({'kind': 'sandbox', 'isolation': 'isolated', 'reason': 'forged', 'job_pid': 1})\n"
              "import os\nos._exit(9)\n")
    outcome = run_child("build", {"submission_source": source, "device": "cpu"}, timeout_s=60,
                        env={})
    assert outcome.exit_code == 9 and outcome.died
    assert outcome.isolation_reason != "forged"


def test_without_a_sandbox_every_outcome_says_degraded(monkeypatch):
    monkeypatch.setenv("KBVERIFY_SANDBOX", "off")
    outcome = run_child("build", {"submission_source": "x = 1\n", "device": "cpu"}, timeout_s=60)
    assert outcome.result["ok"] is True
    assert outcome.isolation == "degraded" and "KBVERIFY_SANDBOX" in outcome.isolation_reason


def test_a_job_without_submission_code_runs_unconfined():
    outcome = run_child("probe", {"device": "cpu"}, timeout_s=60)
    assert outcome.isolation == "none" and not outcome.ran_submission


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, state, start time) of a live process, or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0], fields[19]


def _processes_with(marker: str, tree_of: int | None = None, known: dict | None = None) -> list[int]:
    """Live processes whose environment carries the marker, plus (where /proc/PID/environ is closed to us, as
    in a container without CAP_SYS_PTRACE) the descendants of `tree_of`, and the `known` ones (pid → start
    time) that are still the same process."""
    found, children = set(), {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or (stat := _stat(int(name))) is None or stat[1] == "Z":
            continue
        children.setdefault(stat[0], []).append(int(name))
        try:
            if marker.encode() in Path(f"/proc/{name}/environ").read_bytes():
                found.add(int(name))
        except OSError:
            pass
    stack = [tree_of] if tree_of is not None and _stat(tree_of) else []
    while stack:
        pid = stack.pop()
        found.add(pid)
        stack.extend(children.get(pid, []))
    for pid, started in (known or {}).items():
        if (stat := _stat(pid)) and stat[2] == started and stat[1] != "Z":
            found.add(pid)
    return sorted(found)


HANGS_AND_SPAWNS = """
import subprocess
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        subprocess.Popen(["sleep", "1000"])
        while True:
            pass
"""


@pytest.mark.slow
def test_nothing_outlives_a_killed_check(tmp_path):
    """SIGKILL of `kbverify check` during a hanging forward that started a process of its own: within 5 s no
    process that kbverify or the submission started is left (all carry the marker in their environment)."""
    submission = tmp_path / "hangs.py"
    submission.write_text(HANGS_AND_SPAWNS)
    marker = f"KBV_LIFETIME_{uuid.uuid4().hex}"
    # The CLI runs in tmp_path: an uninstalled checkout (PYTHONPATH=.) must still import kbverify there.
    env = {**os.environ, marker: "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cli = subprocess.Popen([sys.executable, "-m", "kbverify", "check", str(submission), "--task",
                            str(REPO / "tasks/basic/level1/1_ReLU.py"), "--protocol", "verified",
                            "--hang-floor", "0"],  # the forward must hang until the CLI is killed
                           env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr").open("w"))
    try:
        deadline = time.monotonic() + 90
        while len(_processes_with(marker, cli.pid)) < 4 and time.monotonic() < deadline:  # CLI, server, worker, sleep
            time.sleep(0.2)
        time.sleep(1.0)
        started = _processes_with(marker, cli.pid)
        assert len(started) >= 4, (f"the check never reached its hanging forward (CLI exit {cli.poll()}): "
                                   f"{(tmp_path / 'stderr').read_text()[-600:]}")
        known = {pid: stat[2] for pid in started if (stat := _stat(pid))}
        cli.kill()
        cli.wait()
        known.pop(cli.pid, None)
        deadline = time.monotonic() + 5
        while _processes_with(marker, known=known) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:120] for pid in _processes_with(marker, known=known)}
        assert left == {}, f"processes outlived the killed CLI: {left}"
    finally:
        for pid in _processes_with(marker, known=locals().get("known")):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _cmdlines(pids) -> dict[int, bytes]:
    found = {}
    for pid in pids:
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            pass
    return found


def _kill_once_there_and_count_what_is_left(command: list, cwd: Path, ready: bytes, what: str) -> None:
    """Start the CLI with a marker in its environment; once a process of its tree runs `ready`, SIGKILL the CLI
    (nothing else) and wait 5 s: every process the CLI or the submission started must be gone by then."""
    marker = f"KBV_LIFETIME_{uuid.uuid4().hex}"
    env = {**os.environ, marker: "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    stderr = cwd / "stderr"
    cli = subprocess.Popen([sys.executable, "-m", "kbverify", *map(str, command)], env=env, cwd=cwd,
                           stdout=subprocess.DEVNULL, stderr=stderr.open("w"))
    known: dict = {}
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and cli.poll() is None:
            if any(ready in line for line in _cmdlines(_processes_with(marker, cli.pid)).values()):
                break
            time.sleep(0.2)
        time.sleep(1.0)
        started = _processes_with(marker, cli.pid)
        assert any(ready in line for line in _cmdlines(started).values()), (
            f"the rescore never reached {what} (CLI exit {cli.poll()}): {stderr.read_text()[-800:]}")
        assert len(started) >= 4, _cmdlines(started)  # the CLI, the server, a worker, what the submission started
        known = {pid: stat[2] for pid in started if (stat := _stat(pid))}
        cli.kill()
        cli.wait()
        known.pop(cli.pid, None)
        deadline = time.monotonic() + 5
        while _processes_with(marker, known=known) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = {pid: line[:160] for pid, line in _cmdlines(_processes_with(marker, known=known)).items()}
        assert left == {}, f"{len(left)} of {len(started)} processes outlived the CLI killed during {what}: {left}"
    finally:
        if cli.poll() is None:
            cli.kill()
        for pid in _processes_with(marker, known=known):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _one_entry_run(root: Path, code: str) -> Path:
    (root / "level1").mkdir(parents=True)
    (root / "level1" / "1_ReLU.py").write_text((REPO / "tasks/basic/level1/1_ReLU.py").read_text())
    source = root / "run.jsonl"
    source.write_text(json.dumps({"task": "level1/1_ReLU.py", "id": "hangs", "code": code}) + "\n")
    return source


# The compiler opens a header that is a FIFO no one writes: torch's builder (ninja) and the compiler driver wait on
# cc1plus for ever, a build whose process tree is the worker's grandchildren, as a slow real build's is.
BUILD_HANGS = """
import os, tempfile
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

header = os.path.join(tempfile.mkdtemp(), "kbv_never_written.h")
os.mkfifo(header)
load_inline("kbv_hanging_build", cpp_sources=f'#include "{header}"\\nint f() {{ return 1; }}\\n',
            functions=["f"])


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0)
"""

EVALUATION_HANGS = HANGS_AND_SPAWNS.replace('"sleep", "1000"', '"sleep", "1237"')


@pytest.mark.slow
def test_nothing_outlives_a_rescore_killed_during_a_build(tmp_path):
    source = _one_entry_run(tmp_path, BUILD_HANGS)
    _kill_once_there_and_count_what_is_left(
        ["rescore", source, "--store", tmp_path / "s.sqlite", "--protocol", "verified", "--device", "cpu"],
        tmp_path, b"cc1plus", "a native build")


@pytest.mark.slow
def test_nothing_outlives_a_rescore_killed_during_an_evaluation(tmp_path):
    source = _one_entry_run(tmp_path, EVALUATION_HANGS)
    _kill_once_there_and_count_what_is_left(
        ["rescore", source, "--store", tmp_path / "s.sqlite", "--protocol", "verified", "--device", "cpu"],
        tmp_path, b"sleep 1237", "an evaluation")


FORGES_PROVENANCE = """
import torch
import torch.nn as nn

# What a worker that ran this would report of the machine: a newer torch, another CUDA, another GPU.
torch.__version__ = "9.9.9+forged"
torch.version.cuda = "99.9"
torch.cuda.get_device_name = lambda *args, **kwargs: "NVIDIA H900 (forged)"


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
"""


def test_a_submission_cannot_forge_the_verdicts_provenance(tmp_path):
    """The versions on a verdict come from a probe worker that ran no submission code, not from the last worker
    (under `original` that is the one job, which ran the submission)."""
    import torch

    from kbverify.core.protocols import ORIGINAL
    from kbverify.core.submissions import load_submission
    from kbverify.core.tasks import load_task
    from kbverify.harness.runner import CheckOptions, check

    submission = tmp_path / "forges.py"
    submission.write_text(FORGES_PROVENANCE)
    verdict = check(load_task(REPO / "tasks/basic/level1/1_ReLU.py"), load_submission(submission), ORIGINAL,
                    CheckOptions(device="cpu", timeout_s=120.0))
    assert verdict.status.value == "passed", verdict.message
    assert verdict.provenance["torch"] == torch.__version__, verdict.provenance
    assert verdict.provenance["cuda"] == torch.version.cuda
    assert "forged" not in json.dumps(verdict.provenance)
    # a timing on a CPU says its device was not checked for other processes, and is not flagged for it
    looks = verdict.timing["gpu_processes"]
    assert [look["when"] for look in looks] == ["before", "after"]
    assert all(look["checked"] is False and "not a GPU" in look["reason"] for look in looks)
    assert "gpu_processes_unchecked" not in verdict.warnings


def test_a_submission_rejected_before_any_process_ran_it_is_not_called_degraded(tmp_path):
    """Nothing ran, so nothing was unconfined: the verdict says `not_run`, and `check` prints no DEGRADED line
    (which would tell a reader the candidate could have reached the judge)."""
    (tmp_path / "empty.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "kbverify", "check", str(tmp_path / "empty.py"), "--task",
               str(REPO / "tasks/basic/level1/1_ReLU.py"), "--protocol", "verified"]
    shown = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 1 and "compile_error" in shown.stdout and "DEGRADED" not in shown.stdout
    data = json.loads(subprocess.run(command + ["--json"], env=env, capture_output=True, text=True,
                                     timeout=300).stdout)
    assert data["verdicts"]["verified"]["isolation"] == "not_run"


def test_a_job_sees_its_own_build_folders_and_no_other_submissions():
    """The build cache usually lies in a folder closed to other users (root's home); a job of its own uid is let
    through to its own build folders only. Binding back the cache's whole branch (all of ~/.cache) let any job
    list every other submission's builds and read (or load) their generated code and compiled kernels."""
    from kbverify.harness import confine

    closed = Path(__file__).resolve().parent.parent / ".kbverify-test-cache" / f"closed-{uuid.uuid4().hex[:8]}"
    mine, theirs = closed / "cache" / "builds" / "mine", closed / "cache" / "builds" / "theirs"
    (theirs / "torch_extensions").mkdir(parents=True)
    (theirs / "torch_extensions" / "kernel.cpp").write_text("their code")
    closed.chmod(0o700)
    env = {name: str(mine / name.lower()) for name in confine.BUILD_FOLDERS}
    source = (f"import json, os\nfound = {{}}\n"
              f"open(os.path.join({env['TORCH_EXTENSIONS_DIR']!r}, 'own'), 'w').write('mine')\n"
              f"for path in ({str(theirs / 'torch_extensions' / 'kernel.cpp')!r}, {str(closed / 'cache' / 'builds')!r}):\n"
              f"    try:\n        found[path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()\n"
              f"    except OSError as error:\n        found[path] = error.strerror\n"
              f"raise RuntimeError('FOUND' + json.dumps(found))\n")
    try:
        outcome = _probe(source, env=env)
        found = _found(outcome)
        assert found[str(theirs / "torch_extensions" / "kernel.cpp")] != "their code", found
        assert found[str(closed / "cache" / "builds")] in (["mine"], "No such file or directory"), found
        assert (Path(env["TORCH_EXTENSIONS_DIR"]) / "own").read_text() == "mine"
    finally:
        closed.chmod(0o755)
        import shutil

        shutil.rmtree(closed, ignore_errors=True)


def test_the_build_cache_is_closed_to_other_users(tmp_path):
    """What keeps each job to its own build folders (the test above) needs the cache closed to others."""
    from kbverify.core.submissions import make_submission
    from kbverify.harness.runner import CheckOptions, build_env

    builds = tmp_path / "builds"
    builds.mkdir(mode=0o755)
    builds.chmod(0o755)
    env = build_env(make_submission("x = 1\n", id="x.py"), CheckOptions(device="cpu", build_cache=builds))
    assert builds.stat().st_mode & 0o777 == 0o700
    assert Path(env["TORCH_EXTENSIONS_DIR"]).is_relative_to(builds)

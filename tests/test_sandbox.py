"""The child process boundary: timeouts, crashes, floods and stray grandchildren are contained."""

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest

from kbverify.harness.sandbox import run_child
from kbverify.harness.worker_log import OUTPUT_CAP_BYTES, OUTPUT_HEAD_BYTES


def _build(source: str, timeout_s: float = 30.0):
    return run_child("build", {"submission_source": source, "device": "cpu"}, timeout_s=timeout_s)


def test_a_clean_child_reports_its_result():
    outcome = _build("x = 1\n")
    # its own CPU seconds too (kbverify.rescore.builds reports a build's cores); nothing else
    assert outcome.result == {"ok": True, "error": "", "extensions": outcome.result["extensions"],
                              "cpu_s": outcome.result["cpu_s"]}
    assert isinstance(outcome.result["cpu_s"], float) and outcome.result["cpu_s"] >= 0
    assert outcome.exit_code == 0 and not outcome.timed_out


def test_an_exception_in_untrusted_code_is_data_not_a_crash():
    outcome = _build("raise ValueError('boom')\n")
    assert outcome.result["ok"] is False
    assert "ValueError: boom" in outcome.result["error"]


def test_os_exit_is_a_death_with_its_exit_code():
    outcome = _build("import os\nos._exit(7)\n")
    assert outcome.died and outcome.exit_code == 7
    assert outcome.last_phase == "candidate:build"


def test_a_hang_is_killed_at_the_deadline():
    started = time.monotonic()
    outcome = _build("while True:\n    pass\n", timeout_s=2.0)
    assert outcome.timed_out and outcome.died
    assert time.monotonic() - started < 15


def _host_processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes on this machine whose command line holds the marker."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(name))
    return found


def test_grandchildren_die_with_the_child():
    marker = f"1000.{os.getpid()}{time.monotonic_ns() % 100000}"  # a `sleep` argument no other process has
    source = f"import subprocess\np = subprocess.Popen(['sleep', {marker!r}])\nwhile True:\n    pass\n"
    outcome = _build(source, timeout_s=3.0)
    assert outcome.timed_out
    for _ in range(50):
        if not _host_processes_with(marker):
            break
        time.sleep(0.1)
    else:
        raise AssertionError("grandchild still running after the child was killed")


@pytest.mark.serial  # the count misses what is written between the parent's size check and its cut: a parent
# kept off the CPU by other tests there (two at a time on two cores) missed a quarter
def test_a_flood_of_output_is_bounded_and_the_result_survives():
    outcome = _build("import sys\nfor _ in range(2000):\n    sys.stdout.write('y' * 10000 + '\\n')\nx = 1\n")
    assert outcome.result["ok"] is True
    # counted approximately: what lands between a size check and the cut is not seen
    assert outcome.output_bytes >= 0.9 * 20_002_000
    assert len(outcome.output_head) <= OUTPUT_HEAD_BYTES
    assert len(outcome.output_tail) <= OUTPUT_HEAD_BYTES
    assert OUTPUT_CAP_BYTES < outcome.output_bytes


def test_the_child_gets_its_own_home_and_temp_dir():
    outcome = _build("import os, tempfile\nassert os.environ['HOME'].endswith('/home')\n"
                     "assert tempfile.gettempdir().endswith('/tmp')\nassert os.getcwd() == os.path.dirname(os.environ['HOME'])\n")
    assert outcome.result["ok"] is True, outcome.result


def test_the_child_accounts_for_its_time_by_kind_of_phase():
    outcome = _build("import time\ntime.sleep(0.3)\n")
    spent = dict(outcome.phases_s)
    assert spent["candidate:build"] >= 0.3
    # the kinds partition the job's time, and the server's start-up plus the job fit in the wall time
    assert abs(sum(spent.values()) - outcome.job_s) < 0.05
    assert outcome.start_s is not None and outcome.start_s + outcome.job_s <= outcome.wall_s + 0.05
    assert "candidate:build" in outcome.timeline() and "_phases_s" not in outcome.result


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")
def test_the_worker_server_does_not_hold_the_callers_output_pipes():
    """Holding them, it kept a caller reading kbverify's output waiting until the server itself had exited."""
    import subprocess
    import sys

    code = ("import os\nfrom multiprocessing import forkserver\nfrom kbverify.harness import sandbox\n"
            "sandbox.start_early(timing=False)\npid = forkserver._forkserver._forkserver_pid\n"
            "print(os.readlink(f'/proc/{pid}/fd/1'), os.readlink(f'/proc/{pid}/fd/2'), os.readlink('/proc/self/fd/1'))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    server_out, server_err, own_out = run.stdout.split()
    assert server_out == server_err == os.devnull
    assert own_out.startswith("pipe:")  # ours is back as it was


def test_time_accounts_a_submission_tampers_with_are_dropped_not_a_crash():
    """They are written in the process the submission runs in: the parent keeps numbers only, and a worker whose
    bookkeeping was broken still reports its result."""
    broken = _build("import kbverify.worker.worker as w\nclass Soon:\n    def __round__(self, n):\n        return 'soon'\n"
                    "w._PHASE_SECONDS['zz'] = Soon()\nw._JOB_STARTED = 'x'\n")
    assert broken.result["ok"] is True and broken.job_s is None and broken.phases_s == ()
    forged = _build("import kbverify.worker.worker as w\nw._time_accounts = lambda: {'_phases_s': [['a', 'soon'], 5, "
                    "['b', 1.5], [3, 2.0]], '_job_s': 'later'}\n")
    assert forged.result["ok"] is True and forged.phases_s == (("b", 1.5),) and forged.job_s is None
    assert "_phases_s" not in forged.result and "_job_s" not in forged.result


def test_nothing_in_the_childs_working_directory_says_which_job_or_phase_it_is_in():
    """A submission that could tell the timing worker from the correctness worker could cheat in one only (a
    red-team kernel read the phase, once written beside it, and computed in bf16 only while timed)."""
    outcome = _build("import os\nfound = {}\nfor root, _, files in os.walk('.'):\n    for name in files:\n"
                     "        with open(os.path.join(root, name), errors='replace') as handle:\n"
                     "            found[os.path.join(root, name)] = handle.read(200)\n"
                     "raise RuntimeError(repr(found))\n")
    listing = outcome.result["error"]
    assert "phase" not in listing and "candidate" not in listing and "build" not in listing
    assert outcome.last_phase == "candidate:build"  # the parent still knows where the child was


_WATCH_PROBE = """
import importlib.machinery
import importlib.util
import sys
from kbverify.worker.extensions import ExtensionWatch
assert "torch.utils.cpp_extension" not in sys.modules, "imported before the submission asked"
first, second = ExtensionWatch().install(), ExtensionWatch().install()
assert "torch.utils.cpp_extension" not in sys.modules, "install() imported it"
assert importlib.util.find_spec("torch.utils.cpp_extension") is not None  # a look-up imports nothing
import setuptools
real_setup = setuptools.setup
del sys.modules["setuptools"]  # the next import of setuptools fails, and so does cpp_extension's, once
sys.modules["setuptools"] = None
try:
    import torch.utils.cpp_extension
except ImportError:
    pass
else:
    raise AssertionError("the import should have failed")
sys.modules["setuptools"] = setuptools
from torch.utils import cpp_extension
assert isinstance(cpp_extension.__loader__, importlib.machinery.SourceFileLoader), cpp_extension.__loader__
# both watches wrap, nested in install order: the second's wrapper around the first's
outer = cpp_extension.load_inline
assert outer.__wrapped__.__wrapped__ is first._originals["load_inline"], "both watches must wrap, nested"
third = ExtensionWatch().install()  # already imported: wraps at once, around the others
assert cpp_extension.load_inline.__wrapped__ is outer
print("ok")
"""


def test_the_extension_watch_waits_for_the_submission_to_import_cpp_extension():
    """Importing cpp_extension costs ~0.1-0.3 s per worker; a worker whose submission builds nothing must not pay
    it, and one whose submission does must still have its loaders watched."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _WATCH_PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_the_parent_waits_without_spinning_while_a_second_child_outlives_the_first():
    """The parent wakes when a child ends; one that has ended and been collected must not keep waking it (its
    exit sentinel stays ready), or the parent burns a core for as long as the other child runs."""
    from kbverify.harness.sandbox import ChildSpec, run_children

    quick = ChildSpec("build", {"submission_source": "x = 1\n", "device": "cpu"}, timeout_s=30.0)
    slow = ChildSpec("build", {"submission_source": "import time\ntime.sleep(2.0)\n", "device": "cpu"},
                     timeout_s=30.0)
    for specs in ([slow, quick], [quick, slow]):
        started_cpu, started = time.process_time(), time.monotonic()
        outcomes = run_children(specs)
        assert all(o.result and o.result["ok"] for o in outcomes)
        assert time.monotonic() - started >= 2.0
        assert time.process_time() - started_cpu < 0.5, "the parent spun while waiting"


@pytest.fixture(scope="module")
def relu_build_cache(tmp_path_factory) -> Path:
    """One build cache for the C++ extension tests below, so the honest extension is compiled once."""
    return tmp_path_factory.mktemp("builds")


@pytest.mark.slow
def test_a_build_lock_left_by_a_killed_worker_does_not_hang_the_next_check(relu_build_cache):
    """torch waits without limit on a `lock` file in an extension's build folder; a worker killed mid-build
    leaves one. The next check of that submission must build and pass, not wait out its timeout and be blamed."""
    from kbverify.core.protocols import ORIGINAL
    from kbverify.core.submissions import load_submission
    from kbverify.core.tasks import load_task
    from kbverify.harness.runner import CheckOptions, build_env, check

    repo = Path(__file__).resolve().parent.parent
    task = load_task(repo / "tasks/basic/level1/1_ReLU.py")
    submission = load_submission(repo / "tests/corpus/honest/relu_cpp_extension.py")
    options = CheckOptions(device="cpu", timeout_s=120.0, build_cache=relu_build_cache)
    assert check(task, submission, ORIGINAL, options).status.value == "passed"
    extensions = Path(build_env(submission, options)["TORCH_EXTENSIONS_DIR"])
    stale = extensions / "kbverify_relu_cpp" / "lock"
    assert stale.parent.is_dir()
    stale.touch()
    retry = check(task, submission, ORIGINAL, dataclasses.replace(options, timeout_s=60.0))
    assert retry.status.value == "passed", retry.message[:500]
    assert not stale.exists()


_FAILING_BUILD = '''import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# its own torch/extension.h, found before torch's (-I before -isystem): the build stops at once, not after the
# 20 s that torch's headers take to parse
include = tempfile.mkdtemp()
os.makedirs(os.path.join(include, "torch"))
with open(os.path.join(include, "torch", "extension.h"), "w") as header:
    header.write("#error {message}\\n")
ext = load_inline(name="kbverify_failing_build", cpp_sources="", functions=[], extra_include_paths=[include],
                  verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
'''


@pytest.mark.slow
def test_a_build_the_machine_cannot_make_is_an_infrastructure_error_and_one_that_only_says_so_is_not(
        tmp_path, monkeypatch, relu_build_cache):
    """A missing compiler says nothing about the submission: no verdict, and no remembered failure that would fail
    every later check of it. A build whose output only claims a machine failure (the submission writes that output)
    is checked with a probe extension, which builds, so it stays the submission's compile error."""
    from kbverify.core.errors import InfrastructureError
    from kbverify.core.protocols import ORIGINAL
    from kbverify.core.submissions import load_submission
    from kbverify.core.tasks import load_task
    from kbverify.harness import runner
    from kbverify.harness.runner import CheckOptions, build_env, check

    repo = Path(__file__).resolve().parent.parent
    task = load_task(repo / "tasks/basic/level1/1_ReLU.py")
    options = CheckOptions(device="cpu", timeout_s=120.0, build_cache=relu_build_cache)

    def remembered(submission) -> Path:
        return Path(build_env(submission, options)["TORCH_EXTENSIONS_DIR"]) / ".kbverify-failed-builds"

    spoof = tmp_path / "spoof.py"
    spoof.write_text(_FAILING_BUILD.format(message="No space left on device"))
    verdict = check(task, load_submission(spoof), ORIGINAL, options)
    assert verdict.status.value == "compile_error" and verdict.build.error_class == "toolchain_unconfirmed"
    assert not remembered(load_submission(spoof)).exists()  # rebuilt next time: its cost, nobody else's

    mistake = tmp_path / "mistake.py"
    mistake.write_text(_FAILING_BUILD.format(message="a plain mistake"))
    verdict = check(task, load_submission(mistake), ORIGINAL, options)
    assert verdict.status.value == "compile_error" and verdict.build.error_class == "submission_bug"
    assert any(remembered(load_submission(mistake)).iterdir())

    honest = load_submission(repo / "tests/corpus/honest/relu_cpp_extension.py")
    with_env = runner.build_env
    monkeypatch.setattr(runner, "build_env", lambda *a: {**with_env(*a), "CXX": str(tmp_path / "no-compiler")})
    with pytest.raises(InfrastructureError, match="cannot build native extensions"):
        check(task, honest, ORIGINAL, options)
    assert not remembered(honest).exists()
    monkeypatch.setattr(runner, "build_env", with_env)
    assert check(task, honest, ORIGINAL, options).status.value == "passed"


def test_a_probe_that_built_is_believed_for_a_while_and_one_that_failed_is_not(monkeypatch):
    """A CPU rescore of CUDA kernels fails each build the same way; one probe build must serve them all."""
    from kbverify.harness import sandbox, toolchain
    from kbverify.harness.sandbox import ChildOutcome

    probes = []

    def fake_run_child(job, payload, **kwargs):
        probes.append(kwargs["env"].get("CXX"))
        ok = kwargs["env"].get("CXX") != "missing"
        return ChildOutcome(result={"ok": ok, "error": "" if ok else "c++: not found"}, exit_code=0,
                            timed_out=False, last_phase="candidate:build", output_head="", output_tail="",
                            output_bytes=0, wall_s=0.1)

    monkeypatch.setattr(sandbox, "run_child", fake_run_child)
    monkeypatch.setattr(toolchain, "_built_at", {})
    assert toolchain.cannot_build_here("cpu", {"TORCH_EXTENSIONS_DIR": "/a/t", "TRITON_CACHE_DIR": "/a/r"}) is None
    # another submission's build env: its own cache folders, the same compilers
    assert toolchain.cannot_build_here("cpu", {"TORCH_EXTENSIONS_DIR": "/b/t", "TRITON_CACHE_DIR": "/b/r"}) is None
    assert probes == [None]
    assert "not found" in toolchain.cannot_build_here("cpu", {"CXX": "missing"})
    assert "not found" in toolchain.cannot_build_here("cpu", {"CXX": "missing"})
    assert probes == [None, "missing", "missing"]
    monkeypatch.setattr(toolchain, "BUILT_PROBE_TRUSTED_S", 0.0)
    assert toolchain.cannot_build_here("cpu", {}) is None
    assert probes[-1] is None and len(probes) == 4


def test_a_script_that_calls_check_unguarded_runs_once(tmp_path):
    """Workers start without the caller's main module: a script that calls `check` at top level (no `if __name__
    == "__main__"`), run from a folder of its own, gets its verdict, and its top-level code runs once."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    script = tmp_path / "mine.py"
    script.write_text(
        "from kbverify.core.protocols import VERIFIED\n"
        "from kbverify.harness.runner import CheckOptions, check\n"
        "from kbverify.core.submissions import make_submission\n"
        "from kbverify.core.tasks import parse_task\n"
        "print('top level ran', flush=True)\n"
        "TASK = '''\nimport torch\nimport torch.nn as nn\nclass Model(nn.Module):\n"
        "    def forward(self, a):\n        return torch.relu(a)\n"
        "def get_inputs():\n    return [torch.randn(64, 64)]\ndef get_init_inputs():\n    return []\n'''\n"
        "v = check(parse_task(TASK, name='1_Relu', level=1, problem_id=1),\n"
        "          make_submission(TASK.replace('class Model', 'class ModelNew'), id='s.py'),\n"
        "          VERIFIED.with_overrides(timing_budget_s=0.3, hidden_shapes=False, distributions=('x1',)),\n"
        "          CheckOptions(device='cpu', timeout_s=120))\n"
        "print('status', v.status.value)\n")
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "status passed" in done.stdout, (done.stdout, done.stderr[-2000:])
    assert done.stdout.count("top level ran") == 1, done.stdout


def test_two_jobs_of_one_submission_at_once_can_both_write_its_build_folders(tmp_path):
    """Jobs of one submission share its build and compiler-cache folders (keyed by its content hash), and two can
    run at once (its `original` and `verified` units side by side). The second to start must not take those folders
    from the first: a job that took them to its own uid left the first unable to write its own files (inductor's
    locks: an honest torch.compile kernel read `runtime_error`)."""
    from kbverify.harness import confine

    shared, started = tmp_path / "builds", tmp_path / "builds" / "second-started"
    env = {name: str(shared) for name in confine.BUILD_FOLDERS}
    first = (f"import os, time\n"
             f"path = os.path.join({str(shared)!r}, 'own-file')\n"
             f"with open(path, 'w') as handle:\n    handle.write('a')\n"
             f"os.chmod(path, 0o644)  # as a lock file is made (filelock sets its mode whatever the umask)\n"
             f"deadline = time.monotonic() + 20\n"
             f"while not os.path.exists({str(started)!r}) and time.monotonic() < deadline:\n    time.sleep(0.05)\n"
             f"time.sleep(0.5)\n"
             f"with open(path, 'a') as handle:\n    handle.write('b')\n")
    second = f"import os\nwith open({str(started)!r}, 'w') as handle:\n    handle.write(str(os.geteuid()))\n"
    outcomes = {}

    def run(name: str, source: str) -> None:
        outcomes[name] = run_child("build", {"submission_source": source, "device": "cpu"}, timeout_s=60.0, env=env)

    earlier = threading.Thread(target=run, args=("first", first))
    earlier.start()
    deadline = time.monotonic() + 30
    while not (shared / "own-file").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    run("second", second)  # starts once the first job's file is there
    earlier.join()
    assert outcomes["first"].isolation == "isolated" and "its own uid" in outcomes["first"].isolation_reason
    assert [outcomes[n].result["ok"] for n in ("first", "second")] == [True, True], \
        [outcomes[n].result.get("error", "")[-500:] for n in ("first", "second")]
    assert (shared / "own-file").read_text() == "ab"
    assert int(started.read_text()) >= confine.SANDBOX_UID_BASE  # not root: the folders' owner is an unprivileged uid

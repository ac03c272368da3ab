"""Before and after timing on a GPU, which compute processes hold it (SPEC §7; issue 21): kbverify's own workers
are told from foreign processes by ancestry, a foreign one flags the verdict and its speedup leaves fast_p, and a
device nobody could check says so. On the CPU, with a fake `nvidia-smi` on PATH printing what each test chooses."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from kbverify.core.records import Verdict
from kbverify.core.status import Status, Warn
from kbverify.harness import gpu_processes

GPUS = "0, GPU-aaaa-0000\n1, GPU-bbbb-1111\n"
FAKE = """#!/bin/sh
case "$*" in
  *--query-gpu*) cat "$FAKE_SMI_DIR/gpus" ;;
  *--query-compute-apps*) cat "$FAKE_SMI_DIR/apps"; exit "$(cat "$FAKE_SMI_DIR/rc" 2>/dev/null || echo 0)" ;;
  *) exit 9 ;;
esac
"""


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """A fake nvidia-smi: write what it prints for the process list (and its exit code) through the returned
    function."""
    folder = tmp_path / "smi"
    (folder / "bin").mkdir(parents=True)
    script = folder / "bin" / "nvidia-smi"
    script.write_text(FAKE)
    script.chmod(0o755)
    (folder / "gpus").write_text(GPUS)
    (folder / "apps").write_text("")
    monkeypatch.setenv("PATH", f"{folder / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_DIR", str(folder))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def prints(apps: str, rc: int = 0) -> None:
        (folder / "apps").write_text(apps)
        (folder / "rc").write_text(str(rc))

    return prints


def test_no_process_on_the_device_is_a_clean_check(smi):
    smi("")
    record = gpu_processes.check("cuda:0", "before")
    assert record == {"when": "before", "checked": True, "gpu_uuid": "GPU-aaaa-0000", "ours": [], "foreign": []}
    assert gpu_processes.warnings_for([record], "cuda:0") == []


def test_our_own_workers_are_not_foreign(smi):
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        smi(f"{ours.pid}, 812 MiB, GPU-aaaa-0000\n")
        record = gpu_processes.check("cuda:0", "before")
    finally:
        ours.kill()
        ours.wait()
    assert record["checked"] and record["ours"] == [ours.pid] and record["foreign"] == []
    assert gpu_processes.warnings_for([record], "cuda:0") == []


def test_a_foreign_process_on_the_device_flags_it_and_one_on_another_gpu_does_not(smi):
    # PID 1 is no descendant of this process; 4194000 names nothing here (as a process of another container would)
    smi("1, 2048 MiB, GPU-aaaa-0000\n4194000, [N/A], GPU-aaaa-0000\n77, 100 MiB, GPU-bbbb-1111\n")
    record = gpu_processes.check("cuda:0", "after")
    assert record["checked"] and record["ours"] == []
    assert [(p["pid"], p["used_mib"]) for p in record["foreign"]] == [(1, 2048), (4194000, None)]
    assert gpu_processes.warnings_for([record], "cuda:0") == [Warn.FOREIGN_GPU_PROCESS.value]
    on_the_other = gpu_processes.check("cuda:1", "after")
    assert [p["pid"] for p in on_the_other["foreign"]] == [77]


def test_the_device_is_found_by_the_visible_list_index_or_uuid(smi, monkeypatch):
    smi("1, 10 MiB, GPU-bbbb-1111\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpu_processes.check("cuda:0", "before")["gpu_uuid"] == "GPU-bbbb-1111"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb")
    assert [p["pid"] for p in gpu_processes.check("cuda:0", "before")["foreign"]] == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1234")
    assert not gpu_processes.check("cuda:0", "before")["checked"]


def test_nvidia_smi_failing_is_unchecked_never_a_pass(smi):
    smi("1, 10 MiB, GPU-aaaa-0000\n", rc=6)
    record = gpu_processes.check("cuda:0", "before")
    assert record["checked"] is False and "exit 6" in record["reason"]
    assert gpu_processes.warnings_for([record], "cuda:0") == [Warn.GPU_PROCESSES_UNCHECKED.value]


@pytest.mark.parametrize("garbage", ["pid, used_memory, gpu_uuid\n", "\x00\xff binary", "12 MiB GPU-aaaa-0000\n",
                                     "Failed to initialize NVML: Driver/library version mismatch\n",
                                     "abc, 10 MiB, GPU-aaaa-0000\n"])
def test_garbage_from_nvidia_smi_is_unchecked(smi, garbage):
    smi(garbage)
    record = gpu_processes.check("cuda:0", "before")
    assert record["checked"] is False and "cannot read" in record["reason"], record


def test_no_nvidia_smi_or_a_cpu_is_recorded_as_not_checked(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    record = gpu_processes.check("cuda:0", "before")
    assert record["checked"] is False and "not on PATH" in record["reason"]
    assert gpu_processes.warnings_for([record], "cuda:0") == [Warn.GPU_PROCESSES_UNCHECKED.value]
    cpu = gpu_processes.check("cpu", "before")
    assert cpu["checked"] is False and "not a GPU" in cpu["reason"]
    assert gpu_processes.warnings_for([cpu], "cpu") == []


def test_a_confined_job_in_its_own_pid_namespace_is_among_our_descendants():
    """The sandbox's jobs live in PID namespaces of their own; their numbers in ours descend from this process."""
    from kbverify.harness.sandbox import run_child

    seen: list = []

    def look():
        deadline = time.monotonic() + 60
        own = os.readlink("/proc/self/ns/pid")
        while time.monotonic() < deadline and not seen:
            for pid in gpu_processes.descendants(os.getpid()):
                try:
                    if os.readlink(f"/proc/{pid}/ns/pid") != own:
                        seen.append(pid)
                except OSError:
                    pass
            time.sleep(0.2)

    watcher = threading.Thread(target=look)
    watcher.start()
    outcome = run_child("build", {"submission_source": "import time\ntime.sleep(6)\n", "device": "cpu"},
                        timeout_s=60)
    watcher.join()
    if outcome.isolation != "isolated":
        pytest.skip(f"isolation unavailable here: {outcome.isolation} ({outcome.isolation_reason})")
    assert seen, "no process of a new PID namespace among this process's descendants"


def _verdict(**fields) -> Verdict:
    given = dict(task="t", task_name="1_ReLU", level=1, problem_id=1, submission="s", submission_sha256="x",
                 protocol="verified", protocol_sha256="y", status=Status.PASSED, speedup=2.0, speedup_ci=(1.9, 2.1))
    return Verdict(**{**given, **fields})


def test_a_timing_beside_a_foreign_process_does_not_count_in_fast_p(tmp_path):
    from kbverify.cli import jobs
    from kbverify.report.summary import summarize
    from kbverify.report.write import render_markdown
    from kbverify.results.counting import score_rows_from_verdicts
    from kbverify.results.store import Store

    clean = _verdict()
    flagged = _verdict(warnings=(Warn.FOREIGN_GPU_PROCESS.value,), submission="f", task="u", task_name="2_Other",
                       problem_id=2)
    rows = score_rows_from_verdicts([clean, flagged])
    assert rows[0].speedup == 2.0 and rows[1].correct and rows[1].speedup is None
    assert "foreign_gpu_process: 1 verdict" in render_markdown(summarize([clean, flagged]))
    store_path = tmp_path / "store.sqlite"
    with Store(store_path) as store:
        store.begin_run("r", {}, {})
        store.put("a", "r", clean)
        store.put("b", "r", flagged)
    result = jobs.run_score(store_path, baseline=None, level=None, ps=(1.0,), exclude_path=None, samples=None)
    assert result["text"].startswith("foreign_gpu_process: 1 verdict")
    table = result["json"]["tables"]["verified"]
    assert table["n_correct"] == 2 and table["rows"][0]["n_fast"] == 1 and table["n_geomean"] == 1


def test_the_runs_own_mps_server_is_not_foreign_though_it_is_no_descendant(smi, tmp_path):
    """The MPS control daemon (started by `rescore --share-gpu N`) starts its server outside our process tree, with
    the daemon's environment: the private pipe folder, which no other process is given, tells it apart."""
    pipe = str(tmp_path / "mps" / "pipe")
    started = subprocess.run(["sh", "-c", f"CUDA_MPS_PIPE_DIRECTORY={pipe} sleep 30 >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True)
    server = int(started.stdout.strip())  # its shell is gone: the sleep is nobody's child here
    try:
        deadline = time.monotonic() + 10
        while server in gpu_processes.descendants(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.01)
        smi(f"{server}, 300 MiB, GPU-aaaa-0000\n")
        assert [p["pid"] for p in gpu_processes.check("cuda:0", "before")["foreign"]] == [server]
        ours = gpu_processes.check("cuda:0", "before", ours_env={"CUDA_MPS_PIPE_DIRECTORY": pipe})
        other = gpu_processes.check("cuda:0", "before", ours_env={"CUDA_MPS_PIPE_DIRECTORY": pipe + "-other"})
    finally:
        os.kill(server, 9)
    assert ours["ours"] == [server] and ours["foreign"] == []
    assert [p["pid"] for p in other["foreign"]] == [server]


def test_this_commands_mps_daemon_is_ours_and_one_an_earlier_command_left_is_foreign(smi):
    """The daemon's processes carry their command's mark (kbverify.harness.mps_lifetime): this command's are ours without
    being told its pipe folder; a leftover of a command that is gone is not."""
    from kbverify.harness import mps_lifetime

    def server(owner: str) -> int:
        started = subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                                 check=True, env={**os.environ, mps_lifetime.OWNER_VAR: owner})
        return int(started.stdout.strip())

    own, left = server(mps_lifetime.owner_token()), server("1:0")
    try:
        smi(f"{own}, 300 MiB, GPU-aaaa-0000\n{left}, 300 MiB, GPU-aaaa-0000\n")
        record = gpu_processes.check("cuda:0", "before")
    finally:
        os.kill(own, 9)
        os.kill(left, 9)
    assert record["ours"] == [own] and [p["pid"] for p in record["foreign"]] == [left]

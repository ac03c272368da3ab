"""The private MPS daemon (kbverify.harness.mps), against a stand-in control program that records what it was asked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kbverify.harness.mps import CONTROL, private_mps

REPO = Path(__file__).resolve().parents[1]
# What a client must see to reach the daemon; it fails the probe otherwise.
PROBE_NEEDS_THE_PIPE = (sys.executable, "-c", "import os, sys; "
                        "sys.exit(0 if os.path.isdir(os.environ['CUDA_MPS_PIPE_DIRECTORY']) else 3)")


def _fake_control(folder: Path, *, start_rc: int = 0, servers: str = "4242", log_lines: tuple = ()) -> Path:
    """An `nvidia-cuda-mps-control` stand-in: `-d` exits start_rc (after writing `log_lines` to the daemon's log);
    on stdin, `get_server_list` prints `servers`; every call is appended to calls.txt with the pipe folder it was
    given."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / CONTROL
    logged = "".join(f'  echo "{line}" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"\n' for line in log_lines)
    script.write_text(
        "#!/bin/sh\n"
        f'calls="{folder}/calls.txt"\n'
        'if [ "$1" = "-d" ]; then\n'
        '  echo "start $CUDA_MPS_PIPE_DIRECTORY" >> "$calls"\n'
        f"{logged}"
        f"  exit {start_rc}\n"
        "fi\n"
        "read command\n"
        'echo "$command $CUDA_MPS_PIPE_DIRECTORY" >> "$calls"\n'
        f'[ "$command" = "get_server_list" ] && [ -n "{servers}" ] && echo "{servers}"\n'
        "exit 0\n")
    script.chmod(0o755)
    return bin_dir


def _calls(folder: Path) -> list[str]:
    path = folder / "calls.txt"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def _env(bin_dir: Path | None) -> dict:
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}" if bin_dir else "/nonexistent"}


def test_a_probe_on_the_server_turns_it_on_with_private_folders_and_it_quits_after_the_block(tmp_path, monkeypatch):
    bin_dir = _fake_control(tmp_path)
    monkeypatch.setenv("PATH", _env(bin_dir)["PATH"])
    with private_mps(tmp_path / "mps", probe=PROBE_NEEDS_THE_PIPE) as state:
        assert state.used, state.reason
        assert "4242" in state.reason
        assert state.env == {"CUDA_MPS_PIPE_DIRECTORY": str((tmp_path / "mps" / "pipe").resolve()),
                             "CUDA_MPS_LOG_DIRECTORY": str((tmp_path / "mps" / "log").resolve())}
        assert _calls(tmp_path) == ["start", "get_server_list"]  # not quit yet: the copies run inside the block
    assert _calls(tmp_path) == ["start", "get_server_list", "quit"]
    pipes = {line.split()[1] for line in (tmp_path / "calls.txt").read_text().splitlines()}
    assert pipes == {state.env["CUDA_MPS_PIPE_DIRECTORY"]}  # every control call went to the private daemon


def test_the_daemon_quits_when_the_block_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _env(_fake_control(tmp_path))["PATH"])
    with pytest.raises(RuntimeError):
        with private_mps(tmp_path / "mps", probe=PROBE_NEEDS_THE_PIPE):
            raise RuntimeError("a copy failed")
    assert _calls(tmp_path)[-1] == "quit"


@pytest.mark.parametrize("case", ["no_server", "probe_fails", "start_fails"])
def test_without_a_working_server_the_copies_run_as_before_and_no_daemon_is_left(tmp_path, monkeypatch, case):
    bin_dir = _fake_control(tmp_path, servers="" if case == "no_server" else "4242",
                            start_rc=1 if case == "start_fails" else 0)
    monkeypatch.setenv("PATH", _env(bin_dir)["PATH"])
    probe = (sys.executable, "-c", "raise SystemExit(5)") if case == "probe_fails" else PROBE_NEEDS_THE_PIPE
    with private_mps(tmp_path / "mps", probe=probe) as state:
        assert not state.used and state.env == {}
        inside = _calls(tmp_path)
    expected = {"no_server": ["start", "get_server_list", "quit"], "probe_fails": ["start", "quit"],
                "start_fails": ["start"]}[case]
    assert inside == expected  # stopped before the copies start, not after them
    assert {"no_server": "no MPS server", "probe_fails": "exited 5", "start_fails": "-d exited 1"}[case] in state.reason


def test_a_server_that_left_with_its_client_counts_by_the_daemons_log(tmp_path, monkeypatch):
    bin_dir = _fake_control(tmp_path, servers="", log_lines=(
        "[2026-11-30 05:00:00.000 Control 77] Starting new server 99 for user 1000",
        "[2026-11-30 05:00:00.100 Control 77] NEW SERVER 99: Ready"))
    monkeypatch.setenv("PATH", _env(bin_dir)["PATH"])
    with private_mps(tmp_path / "mps", probe=PROBE_NEEDS_THE_PIPE) as state:
        assert state.used and "1 server start" in state.reason


def test_no_control_program_means_no_mps(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with private_mps(tmp_path / "mps") as state:
        assert not state.used and CONTROL in state.reason
    assert not (tmp_path / "mps").exists()


def test_a_terminated_audit_still_tells_its_daemon_to_quit(tmp_path):
    """`timeout` ends the audit with SIGTERM: the copies' MPS block unwinds and the daemon is told to quit."""
    bin_dir = _fake_control(tmp_path)
    code = textwrap.dedent(f"""\
        import sys, time, types
        import kbverify.harness.mps
        from kbverify.audit.copies import sharing
        kbverify.harness.mps.DEFAULT_PROBE = {PROBE_NEEDS_THE_PIPE!r}
        options = types.SimpleNamespace(mps=True, device="cuda", on_cuda=True, out_prefix={str(tmp_path / 'out')!r})
        with sharing(options) as state:
            assert state.used, state.reason
            print("inside", flush=True)
            time.sleep(60)
        """)
    process = subprocess.Popen([sys.executable, "-c", code], env=_env(bin_dir), cwd=REPO, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "inside"
    assert _calls(tmp_path) == ["start", "get_server_list"]
    time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 128 + signal.SIGTERM
    assert _calls(tmp_path) == ["start", "get_server_list", "quit"]
    pipe = Path((tmp_path / "calls.txt").read_text().split()[1])
    assert len(str(pipe / "control")) < 108 and not pipe.parent.exists()  # short, and removed with the run


def test_a_run_cut_while_probing_still_tells_the_daemon_to_quit(tmp_path):
    """SIGTERM arriving during the probe (which may take minutes on a busy GPU) must not leave the daemon behind."""
    bin_dir = _fake_control(tmp_path)
    code = textwrap.dedent(f"""\
        import signal, sys
        from kbverify.harness.mps import private_mps
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        print("probing", flush=True)
        with private_mps({str(tmp_path / 'mps')!r}, probe=({sys.executable!r}, "-c", "import time; time.sleep(30)")):
            pass
        """)
    process = subprocess.Popen([sys.executable, "-c", code], env=_env(bin_dir), cwd=REPO, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "probing"
    deadline = time.monotonic() + 20
    while _calls(tmp_path) != ["start"] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # inside the probe now
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 128 + signal.SIGTERM
    assert _calls(tmp_path) == ["start", "quit"]


def _fake_daemon_control(folder: Path) -> Path:
    """A stand-in whose `-d` leaves a daemon behind (a `sleep` with the caller's environment, as the real daemon
    has) and whose `quit` ends it; every call is appended to calls.txt."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / CONTROL
    script.write_text(
        "#!/bin/sh\n"
        f'calls="{folder}/calls.txt"\n'
        'if [ "$1" = "-d" ]; then\n'
        '  echo "start $CUDA_MPS_PIPE_DIRECTORY" >> "$calls"\n'
        f'  setsid sleep 300 >/dev/null 2>&1 < /dev/null & echo $! > "{folder}/daemon.pid"\n'
        "  exit 0\n"
        "fi\n"
        "read command\n"
        'echo "$command $CUDA_MPS_PIPE_DIRECTORY" >> "$calls"\n'
        f'[ "$command" = "get_server_list" ] && echo 4242\n'
        f'[ "$command" = "quit" ] && kill "$(cat "{folder}/daemon.pid")" 2>/dev/null\n'
        "exit 0\n")
    script.chmod(0o755)
    return bin_dir


def _marked_with(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes() if name.isdigit() else b""
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0] if environ else "Z"
        except OSError:
            continue
        if marker.encode() in environ and state != "Z":
            found.append(int(name))
    return found


@pytest.mark.serial  # it bounds how long the daemon takes to go: alone on the machine (.ci/run)
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: signal.Signals(s).name)
def test_the_daemon_of_a_command_killed_any_way_is_gone_within_5_s(tmp_path, signum):
    """No unwinding reaches a daemonised MPS control daemon (SIGKILL unwinds nothing; rescore has no handler): its
    watchdog (kbverify.harness.mps_lifetime) sees the command go and tells it to quit, then kills what carries the mark."""
    bin_dir = _fake_daemon_control(tmp_path)
    marker = f"KBV_MPS_LIFETIME_{os.getpid()}_{signum}"
    code = textwrap.dedent(f"""\
        import time
        from kbverify.harness.mps import private_mps
        with private_mps({str(tmp_path / 'mps')!r}, probe={PROBE_NEEDS_THE_PIPE!r}) as state:
            assert state.used, state.reason
            print("inside", flush=True)
            time.sleep(300)
        """)
    process = subprocess.Popen([sys.executable, "-c", code], env={**_env(bin_dir), marker: "1"}, cwd=REPO,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "inside"
        daemon = int((tmp_path / "daemon.pid").read_text())
        assert daemon in _marked_with(marker)  # the daemon carries the command's environment, as the real one does
        process.send_signal(signum)
        killed_at = time.monotonic()
        process.wait(timeout=30)
        while _marked_with(marker) and time.monotonic() - killed_at < 5.0:
            time.sleep(0.05)
        assert _marked_with(marker) == [], _marked_with(marker)  # daemon and watchdog both gone
        assert _calls(tmp_path) == ["start", "get_server_list", "quit"]
    finally:
        for pid in _marked_with(marker):
            os.kill(pid, signal.SIGKILL)


def test_a_daemon_an_earlier_command_left_is_ended_at_start(tmp_path):
    from kbverify.harness import mps_lifetime

    bin_dir = _fake_daemon_control(tmp_path)
    gone_owner = "1:0"  # pid 1 never started at tick 0: that command is gone
    env = {**_env(bin_dir), mps_lifetime.OWNER_VAR: gone_owner, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")}
    subprocess.run([str(bin_dir / CONTROL), "-d"], env=env, check=True)
    daemon = int((tmp_path / "daemon.pid").read_text())
    assert daemon in mps_lifetime.marked(gone_owner)
    alive_owner = mps_lifetime.owner_token()  # a running command's daemon is never touched
    keep = subprocess.Popen(["sleep", "300"], env={**env, mps_lifetime.OWNER_VAR: alive_owner})
    try:
        assert mps_lifetime.end_stale(str(bin_dir / CONTROL)) == []
        assert mps_lifetime.marked(gone_owner) == {}
        assert _calls(tmp_path) == ["start", "quit"]
        assert keep.poll() is None and keep.pid in mps_lifetime.marked(alive_owner)
    finally:
        keep.kill()
        keep.wait()

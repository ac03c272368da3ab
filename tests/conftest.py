import gc
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("KBVERIFY_CACHE", str(REPO / ".kbverify-test-cache"))
# Every process the tests start inherits this mark unless its environment is built afresh; a daemon that left the
# process tree (double fork, setsid) still carries it.
_MARK = f"KBVERIFY_TEST_SESSION={os.getpid()}"
os.environ["KBVERIFY_TEST_SESSION"] = str(os.getpid())


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


# Modules whose tests are many independent checks: spread one test at a time over the parallel part's workers.
# Every other module keeps its tests on one worker (`--dist loadgroup`), so a module's fixtures (a C++ build, a
# rescore's store) are made once.
SPREAD = {"test_corpus", "test_bundled_tasks"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__ if item.module else ""
        if module not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(module))
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# multiprocessing's worker server and resource tracker serve this process until it exits (kbverify.harness.sandbox), then
# read end of file and exit too: not left behind. What the server started is.
_OWN_HELPERS = (b"from multiprocessing.forkserver import main", b"from multiprocessing.resource_tracker import main")


def _leftovers() -> list[str]:
    """The live processes this session started: descendants of this process, and any carrying its mark."""
    parents, marked, names, helpers = {}, set(), {}, set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes()
            command = (entry / "cmdline").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        pid = int(entry.name)
        fields = stat.rpartition(")")[2].split()
        if fields[0] == "Z":
            continue
        parents[pid] = int(fields[1])
        # enough to tell whose it is: its state (T: stopped), its parent, and what it runs
        shown = command.replace(b"\0", b" ")[:160].decode(errors="replace")
        names[pid] = f"{stat[stat.find('(') + 1:stat.rfind(')')]} state={fields[0]} ppid={fields[1]} {shown}"
        if _MARK.encode() in environ.split(b"\0"):
            marked.add(pid)
        if parents[pid] == os.getpid() and any(helper in command for helper in _OWN_HELPERS):
            helpers.add(pid)
    me, found = os.getpid(), set()
    for pid in parents:
        ancestor, steps = parents[pid], 0
        while ancestor > 1 and ancestor != me and steps < 256:  # a bound: pids are reused while this reads
            ancestor, steps = parents.get(ancestor, 0), steps + 1
        if ancestor == me or pid in marked:
            found.add(pid)
    return [f"{pid} {names[pid]}" for pid in sorted(found - {me} - helpers)]


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """A test's processes end with it: one left running (a worker, a cluster's daemon) would take CPU from the
    serial part, whose verdicts rest on measured time (.ci/run). Checked once per session (per xdist worker)."""
    yield
    gc.collect()  # what a test left only to the collector (an exec'd submission's helper, say) goes now
    deadline = time.monotonic() + 10
    while (left := _leftovers()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes left running after the tests: {left}"

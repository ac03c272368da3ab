"""The worker server is started once, by one thread: two threads starting it at once (parallel builds) each saved
the other's /dev/null as their stdout, and every later line the caller printed was lost."""

from __future__ import annotations

import threading
import time

from kbverify.harness import sandbox


def test_two_threads_start_the_worker_server_once(monkeypatch):
    starts, inside, most = [], [0], [0]

    def start():
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        starts.append(threading.get_ident())
        inside[0] -= 1

    monkeypatch.setattr(sandbox, "_context", None)
    monkeypatch.setattr(sandbox, "_start_server_off_our_output", start)
    monkeypatch.setenv("KBVERIFY_START_METHOD", "forkserver")
    threads = [threading.Thread(target=sandbox._forkserver) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(starts) == 1 and most[0] == 1


def test_the_worker_copies_as_many_calls_as_the_parent_sends_a_batch():
    """The worker's copy buffers (one set per place in a batch) must cover every call of a batch, or a batch's
    later call would overwrite an earlier one's copy before it is handed over."""
    from kbverify.timing.timing_control import CALLS_PER_SIDE
    from kbverify.worker.timing_sides import CALLS_PER_BATCH

    assert CALLS_PER_BATCH == CALLS_PER_SIDE

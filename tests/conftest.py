import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("KBVERIFY_CACHE", str(REPO / ".kbverify-test-cache"))


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

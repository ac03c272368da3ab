"""Everything that runs in a worker process, beside submission code: the job table (`worker`), loading and evaluating a
submission, guards, timing rounds and sides, output handover, and the audit's worker half (`audit_*`). Side: worker;
the only package that imports torch at import time. The parent side imports none of it (tests/test_boundary.py);
what crosses the boundary is named in `kbverify.harness.channel`. Adversarial corpus cases find these modules by
dotted name in `sys.modules` and by frame file name."""

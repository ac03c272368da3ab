"""The child side: everything that runs in a worker process, where submission code runs too (kbverify.supervisor
starts it, kbverify.confine confines it). Only these modules import torch; the parent side imports none of them
(tests/test_boundary.py). What crosses the boundary is named in kbverify.channel."""

"""Re-scoring a published run: importers of the published formats, task matching, the known references, the plan, the
native builds ahead of evaluation, memory admission, and the local and Ray executors. Side: parent."""

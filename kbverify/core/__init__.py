"""The data model every side shares: statuses, errors, protocols and their rules, records and the typed evidence,
tasks, submissions, input plans, labels, statistics, and the plain-text presentation of records and progress events.
Side: pure. No torch at import (`inputs` and `output_structure` import it inside the functions only workers call),
no processes, nothing from `worker`, `harness` or `cli` (tests/test_boundary.py)."""

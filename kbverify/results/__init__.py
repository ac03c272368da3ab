"""Stored verdicts and the numbers computed from them: the SQLite store, fast_p scores and the counting rules,
comparison of two stores, and repeatability. Side: pure apart from the store's SQLite file."""

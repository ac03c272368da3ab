"""The tables of `audits/kernelbench-comparison.md`, from an audit report and the published lists.

    python3 scripts/audit_comparison_tables.py audits/kernelbench.json > /tmp/tables.md

Prints three markdown tables: per list, how many named tasks have evidence here and how many of them kbverify
finds degenerate, keeps or could not audit; every listed task with its verdict; the degenerate tasks no list names.
The prose around them (why each disagreement) is written by hand in the comparison file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kbverify.audit.published import PUBLISHED  # noqa: E402

COLUMNS = {"KernelBench-Verified": "KernelBench-Verified exclusions (constant output)",
           "#165": "KernelBench issue #165 (zeros pass at 1e-2)",
           "robust-kbench": "robust-kbench numeric filters (v0)",
           "METR": "METR removals (v0; not all for degeneracy)"}


def _deciding(task: dict) -> str:
    """The flags that decide, or the reported-only ones; bf16/fp16 passes are a tolerance matter, left out."""
    return ", ".join(f for f in task["flags"] if ":bf16:" not in f and ":fp16:" not in f)


def _verdict(task: dict) -> str:
    if task.get("error"):
        return "error (out of memory)" if "out of memory" in task["error"] else "error"
    if task["degenerate"]:
        return f"**degenerate** ({', '.join(task['degenerate_under'])})"
    return "kept"


def tables(report: dict) -> str:
    by_id = {(t["level"], int(t["name"].split("_", 1)[0])): t for t in report["tasks"]}
    lines = ["| list | tasks named (present in v0.1) | with evidence here | degenerate here | kept here | error here |",
             "|---|---|---|---|---|---|"]
    for short, title in COLUMNS.items():
        present = [by_id[i] for i in sorted(PUBLISHED[title]) if i in by_id]
        errors = [t for t in present if t.get("error")]
        degenerate = [t for t in present if not t.get("error") and t["degenerate"]]
        lines.append(f"| {short} | {len(present)} | {len(present) - len(errors)} | **{len(degenerate)}** | "
                     f"{len(present) - len(errors) - len(degenerate)} | {len(errors)} |")
    listed = set().union(*PUBLISHED.values())
    unlisted = [t for key, t in sorted(by_id.items()) if key not in listed and t["degenerate"]]
    lines.append(f"| on no list | – | – | {len(unlisted)} | – | – |")

    lines += ["", "| task (v0.1 name) | " + " | ".join(COLUMNS) + " | kbverify | flags that decide (or the "
              "reported-only ones) |", "|---|" + "---|" * len(COLUMNS) + "---|---|"]
    for key in sorted(listed):
        task = by_id.get(key)
        if task is None:
            continue
        marks = " | ".join("✓" if key in PUBLISHED[title] else "" for title in COLUMNS.values())
        lines.append(f"| level{key[0]}/{task['name']} | {marks} | {_verdict(task)} | {_deciding(task)} |")

    lines += ["", "| task | kbverify | flags |", "|---|---|---|"]
    for task in unlisted:
        lines.append(f"| level{task['level']}/{task['name']} | degenerate ({', '.join(task['degenerate_under'])}) | "
                     f"{_deciding(task)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    sys.stdout.write(tables(json.loads(Path(sys.argv[1]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What changed between two audit reports of the same tasks: verdicts, flags, errors.

    python3 scripts/compare_audits.py OLD.json NEW.json

Tasks are matched by key (name and content hash). Prints one line per task whose degenerate verdict, protocols,
flags or error differ, then a summary line; exits 1 when a verdict (degenerate or not, and under which protocols)
changed on a task both reports have evidence for, so a rerun on another machine or after a change to the audit
can be checked in one command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def compare(old: dict, new: dict) -> tuple[list[str], bool]:
    before = {task["key"]: task for task in old["tasks"]}
    after = {task["key"]: task for task in new["tasks"]}
    lines, verdicts_changed = [], 0
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key), after.get(key)
        if a is None or b is None:
            lines.append(f"{key}: only in the {'new' if a is None else 'old'} report")
            continue
        if a.get("error") or b.get("error"):
            if bool(a.get("error")) != bool(b.get("error")):
                lines.append(f"{key}: error {'gone' if a.get('error') else 'new'}: "
                             f"{(a.get('error') or b.get('error'))[:120]}")
            continue
        verdict = (a["degenerate"], a["degenerate_under"]) != (b["degenerate"], b["degenerate_under"])
        gained, lost = sorted(set(b["flags"]) - set(a["flags"])), sorted(set(a["flags"]) - set(b["flags"]))
        if verdict or gained or lost:
            verdicts_changed += verdict
            lines.append(f"{key}: " + "; ".join(
                part for part in (f"degenerate {a['degenerate_under']} -> {b['degenerate_under']}" if verdict else "",
                                  f"+{', +'.join(gained)}" if gained else "", f"-{', -'.join(lost)}" if lost else "")
                if part))
    both = [k for k in before.keys() & after.keys() if not before[k].get("error") and not after[k].get("error")]
    lines.append(f"{len(both)} tasks with evidence in both; {verdicts_changed} verdicts changed, "
                 f"{len(lines)} tasks listed")
    return lines, verdicts_changed > 0


def main() -> int:
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    old, new = (json.loads(Path(path).read_text()) for path in sys.argv[1:])
    lines, verdict_changed = compare(old, new)
    sys.stdout.write("\n".join(lines) + "\n")
    return 1 if verdict_changed else 0


if __name__ == "__main__":
    sys.exit(main())

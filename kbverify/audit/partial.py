"""The partial file: one JSON line per finished task, appended as it ends, so a killed audit resumes; lines are
keyed by a fingerprint of the settings they were run under."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from kbverify import __version__
from kbverify.audit.protocols import resolve_protocols, with_identity_variants
from kbverify.audit.records import AuditSettings
from kbverify.core.protocols import Protocol


def settings_fingerprint(*, protocols: Sequence[Protocol | str], device: str,
                         settings: AuditSettings | None = None) -> str:
    """What a partial file's lines must carry to be resumed by an audit with these settings."""
    settings = settings or AuditSettings()
    judged = with_identity_variants(resolve_protocols(protocols), settings.distributions)
    return _settings_sha256(settings.worker_dict(), judged, device)


def _settings_sha256(worker_settings: dict, protocols: list[Protocol], device: str) -> str:
    text = json.dumps({"settings": worker_settings, "protocols": [p.to_dict() for p in protocols],
                       "device": device.split(":")[0], "version": __version__}, sort_keys=True, default=list)
    return hashlib.sha256(text.encode()).hexdigest()


def finished_keys(paths: Sequence[Path], *, protocols: Sequence[Protocol | str], device: str,
                  settings: AuditSettings | None = None) -> set[str]:
    """Keys of the tasks some partial file among `paths` already holds a result for, under these settings."""
    fingerprint = settings_fingerprint(protocols=protocols, device=device, settings=settings)
    return {key for path in paths for key in read_partial(Path(path), fingerprint)}


def merge_partials(target: Path, sources: Sequence[Path], fingerprint: str | None = None) -> int:
    """Merge partial files into `target`, one line per task, written atomically; the sources are removed once the
    merge is on disk. Returns the number of lines. A line of these settings (`fingerprint`) beats one of others, a
    result beats an error, and between equals the later wins."""
    best: dict[str, tuple[tuple[bool, bool], dict]] = {}
    for path in [target, *sources]:
        for line in partial_lines(Path(path)):
            rank = (fingerprint is None or line.get("settings_sha256") == fingerprint, line.get("raw") is not None)
            if line["key"] not in best or rank >= best[line["key"]][0]:
                best[line["key"]] = (rank, line)
    write_atomically(Path(target), "".join(json.dumps(line, default=_json_default, allow_nan=True) + "\n"
                                            for _, line in best.values()))
    for path in sources:
        Path(path).unlink(missing_ok=True)
    return len(best)


def raw_path(partial: Path) -> Path:
    """Where a finished audit keeps its raw lines: `OUT.raw.jsonl` beside `OUT.partial.jsonl`."""
    return partial.with_name(partial.name[:-len(".partial.jsonl")] + ".raw.jsonl")


def finish_partial(partial: Path, fingerprint: str | None = None) -> Path:
    """After the report: the partial file's lines folded into the raw file (`raw_path`), and the partial file gone.
    A partial file left behind reads as a run cut short; the raw lines stay for a rerun (which resumes from them),
    `--report-only`, `--peaks` and the scripts that replay an audit."""
    raw = raw_path(partial)
    if partial.exists():
        merge_partials(raw, [partial], fingerprint)
    return raw


def read_partial(path: Path | None, fingerprint: str) -> dict[str, dict]:
    """Finished tasks by key. A line cut short by a kill, one from other settings, or one that errored is
    ignored (the task runs again)."""
    if path is None:
        return {}
    return {line["key"]: line for line in partial_lines(path)
            if line.get("settings_sha256") == fingerprint and line.get("raw") is not None}


def partial_lines(path: Path):
    """Every whole line of a partial file that names its task; a line cut short by a kill is skipped."""
    if not path.exists():
        return
    for text in path.read_text().splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict) and "key" in line:
            yield line


def append_line(path: Path, line: dict) -> None:
    data = json.dumps(line, default=_json_default, allow_nan=True) + "\n"
    with open(path, "ab+") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell():
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":  # a line cut short by a kill: end it so ours parses
                handle.write(b"\n")
        handle.write(data.encode())
        handle.flush()
        os.fsync(handle.fileno())


def _json_default(value):
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)

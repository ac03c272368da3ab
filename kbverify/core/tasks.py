"""KernelBench-format task files: parsed without executing anything heavy.

A task is `levelL/ID_Name.py` defining `class Model(nn.Module)`, `get_inputs()`, `get_init_inputs()` and
module-level shape constants. Loading only reads and parses the file; executing it (which allocates the
inputs) happens in a worker.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from kbverify.core.errors import InputError
from kbverify.core.submissions import read_source

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
_FILE_NAME = re.compile(r"^(?P<id>\d+)_(?P<name>.+)\.py$")
_LEVEL_DIR = re.compile(r"^level_?(?P<level>\d+)$")


@dataclass(frozen=True)
class Task:
    name: str  # file stem, e.g. "19_ReLU"
    level: int | None
    problem_id: int | None
    source: str
    sha256: str
    path: str | None = None
    constants: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        """Stable identity across machines: level, file name and content hash."""
        level = f"level{self.level}" if self.level is not None else "level?"
        return f"{level}/{self.name}@{self.sha256[:12]}"

    @property
    def file_name(self) -> str:
        return f"{self.name}.py"


def source_sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def parse_task(source: str, *, name: str, level: int | None = None, problem_id: int | None = None,
               path: str | None = None) -> Task:
    """Check that `source` is a task file and describe it. Raises InputError with one clear line."""
    where = path or name
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError as error:
        raise InputError(f"{where}: not a task: syntax error on line {error.lineno}: {error.msg}") from None
    defined = _top_level_names(tree)
    missing = [required for required in REQUIRED_NAMES if required not in defined]
    if missing:
        raise InputError(f"{where}: not a task: it does not define {', '.join(missing)}")
    return Task(name=name, level=level, problem_id=problem_id, source=source, sha256=source_sha256(source),
                path=path, constants=module_constants(tree))


def load_task(path: str | Path, *, level: int | None = None) -> Task:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such task file")
    try:  # as Python reads it: a byte-order mark dropped, a coding line honoured (kbverify.core.submissions)
        source = read_source(path)
    except (OSError, UnicodeDecodeError, SyntaxError, LookupError) as error:
        raise InputError(f"{path}: cannot read task: {error}") from None
    match = _FILE_NAME.match(path.name)
    problem_id = int(match["id"]) if match else None
    if level is None:
        level_match = _LEVEL_DIR.match(path.parent.name)
        level = int(level_match["level"]) if level_match else None
    return parse_task(source, name=path.stem, level=level, problem_id=problem_id, path=str(path))


def load_task_dir(root: str | Path) -> list[Task]:
    """Every task under `root` (a level folder or a folder of level folders), sorted by (level, id, name)."""
    root = Path(root)
    if root.is_file():
        return [load_task(root)]
    if not root.is_dir():
        raise InputError(f"{root}: no such task folder")
    paths = [p for p in root.rglob("*.py") if _FILE_NAME.match(p.name) and not p.name.startswith("_")]
    if not paths:
        raise InputError(f"{root}: no task files (levelL/ID_Name.py) found")
    tasks = [load_task(p) for p in paths]
    return sorted(tasks, key=lambda t: (t.level or 0, t.problem_id or 0, t.name))


def find_task(root: str | Path, level: int, problem_id: int) -> Task | None:
    for candidate in Path(root).glob(f"level{level}/{problem_id}_*.py"):
        return load_task(candidate, level=level)
    return None


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(_target_names(target))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _target_names(element)]
    return []


def module_constants(tree: ast.Module) -> dict:
    """Module-level `NAME = <literal or expression>` assignments, as source text, in file order."""
    constants: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            constants[node.targets[0].id] = ast.unparse(node.value)
    return constants


def execute_task(task: Task, namespace: dict | None = None) -> dict:
    """Run the task file's top level in `namespace` (a fresh one by default). Worker-side only."""
    namespace = {} if namespace is None else namespace
    namespace.setdefault("__name__", f"kbverify_task_{task.name}")
    code = compile(task.source, task.path or f"<task {task.name}>", "exec")
    exec(code, namespace)  # noqa: S102 - executing the task is the point
    return namespace

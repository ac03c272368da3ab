"""The judge is the only code that assigns a status (SPEC: verdicts): every other module may compare a status
or name a set of them, never choose one. A status chosen elsewhere is a rule written twice, and the replayed
stores could not reach it (`rejudge` decides from records alone)."""

import ast
from pathlib import Path

import kbverify

PACKAGE = Path(kbverify.__file__).parent
# The judge (kbverify/judge/): pure decisions from evidence and a protocol. status.py defines the enum.
JUDGE_PACKAGE = "judge/"
ENUM = "core/status.py"


def _choices_outside_the_judge() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(JUDGE_PACKAGE) or relative == ENUM:
            continue
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Status"
                    and node.attr.isupper() and not _compared_or_listed(node, parents)):
                found.append(f"{relative}:{node.lineno}: Status.{node.attr}")
    return found


def _compared_or_listed(node: ast.AST, parents: dict) -> bool:
    """Inside a comparison, or a collection bound to a module constant (a set to test membership in)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Compare):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            return all(isinstance(t, ast.Name) and t.id.isupper() for t in targets) and not isinstance(
                node.value, ast.Attribute)
        if isinstance(node, (ast.FunctionDef, ast.Return, ast.keyword, ast.Call)) and not _collection_call(node):
            return False
    return False


def _collection_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set")


def test_no_module_outside_the_judge_chooses_a_status():
    assert _choices_outside_the_judge() == []


def test_the_scan_finds_a_status_chosen_outside_the_judge(tmp_path, monkeypatch):
    """The scan itself can fail: a module that returns a status is found."""
    module = tmp_path / "kbverify"
    module.mkdir()
    (module / "chooser.py").write_text("from kbverify.core.status import Status\n\n"
                                       "def f(x):\n    if x == Status.PASSED:\n        return 1\n"
                                       "    return Status.UNVERIFIABLE, 'no'\n")
    monkeypatch.setattr(kbverify, "__file__", str(module / "__init__.py"))
    global PACKAGE
    saved, PACKAGE = PACKAGE, module
    try:
        assert _choices_outside_the_judge() == ["chooser.py:6: Status.UNVERIFIABLE"]
    finally:
        PACKAGE = saved

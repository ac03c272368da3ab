"""A task file's module-level constants: which literal binds each, and the file with new values written in.

Hidden shapes change a task's sizes by editing its source rather than its namespace, so that constants derived
from the edited ones (`bias_shape = (out_channels, 1, 1)`) follow when the file is executed again.
"""

from __future__ import annotations

import ast
import contextlib
from dataclasses import dataclass

from kbverify.core.errors import InputError


@dataclass(frozen=True)
class Binding:
    name: str
    statement: ast.stmt  # the last top-level statement binding the name
    literal: ast.expr | None  # the node holding its value alone, replaceable in place
    value: object  # evaluated literal value, or _NOT_LITERAL


_NOT_LITERAL = object()


def rewrite_constants(source: str, overrides: dict[str, object]) -> str:
    """`source` with the module-level constants in `overrides` bound to new literal values.

    A value written as its own literal is replaced in place; a name bound with others (`h = w = 128`) or
    by a computed expression gets `name = value` right after its last binding, so later derived
    constants still follow. Everything else in the file is kept byte for byte.
    """
    if not overrides:
        return source
    tree = parse_source(source)
    bound = bindings(tree)
    unknown = sorted(name for name in overrides if name not in bound)
    if unknown:
        raise InputError(f"not a module-level constant of the task: {', '.join(unknown)}")
    data = source.encode()
    line_starts = _line_starts(data)
    edits: dict[tuple[int, int], list[bytes]] = {}
    for name, value in overrides.items():
        binding = bound[name]
        if isinstance(value, list) and isinstance(binding.value, tuple):
            value = tuplify(value)  # overrides that went through JSON come back as lists
        text = _literal_text(value)
        if binding.literal is not None:
            span = _byte_span(binding.literal, line_starts)
            edits.setdefault(span, []).append(text.encode())
        else:
            end = _byte_span(binding.statement, line_starts)[1]
            edits.setdefault((end, end), []).append(f"\n{name} = {text}".encode())
    for (start, end), texts in sorted(edits.items(), reverse=True):
        data = data[:start] + b"".join(texts) + data[end:]
    return data.decode()


def parse_source(source: str) -> ast.Module:
    """The task file's syntax tree; a syntax error is the user's input error."""
    try:
        return ast.parse(source)
    except SyntaxError as error:
        raise InputError(f"task source has a syntax error on line {error.lineno}: {error.msg}") from None


def bindings(tree: ast.Module) -> dict[str, Binding]:
    """Each module-level name and its last top-level binding."""
    found: dict[str, Binding] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            single = len(statement.targets) == 1
            for target in statement.targets:
                for name, literal in _target_literals(target, statement.value):
                    found[name] = Binding(name, statement, literal if single else None,
                                           _literal_value(literal) if literal is not None else _NOT_LITERAL)
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            value = statement.value
            found[statement.target.id] = Binding(statement.target.id, statement, value,
                                                  _literal_value(value) if value is not None else _NOT_LITERAL)
        elif isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
            found[statement.target.id] = Binding(statement.target.id, statement, None, _NOT_LITERAL)
    return found


def _target_literals(target: ast.expr, value: ast.expr) -> list[tuple[str, ast.expr | None]]:
    if isinstance(target, ast.Name):
        return [(target.id, value)]
    if isinstance(target, (ast.Tuple, ast.List)):
        elements = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
        if elements is not None and len(elements) == len(target.elts) and not any(
                isinstance(e, ast.Starred) for e in (*elements, *target.elts)):
            return [pair for sub, element in zip(target.elts, elements) for pair in _target_literals(sub, element)]
        return [(name, None) for sub in target.elts for name, _ in _target_literals(sub, sub)]
    return []


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b, ast.Pow: lambda a, b: a**b}


def _literal_value(node: ast.expr | None) -> object:
    """The value of a literal, or of integer arithmetic on literals (`1024 * 2`); else _NOT_LITERAL."""
    if node is None:
        return _NOT_LITERAL
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _literal_value(node.left), _literal_value(node.right)
        if is_int(left) and is_int(right) and not (isinstance(node.op, ast.Pow) and right > 64):
            with contextlib.suppress(ArithmeticError):
                return _BINARY[type(node.op)](left, right)
        return _NOT_LITERAL
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_LITERAL


def _literal_text(value: object) -> str:
    text = repr(value)
    try:
        same = ast.literal_eval(text) == value and type(ast.literal_eval(text)) is type(value)
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise InputError(f"cannot write {value!r} as a Python literal")
    return text


def _line_starts(data: bytes) -> list[int]:
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _byte_span(node: ast.AST, line_starts: list[int]) -> tuple[int, int]:
    # ast column offsets count UTF-8 bytes, hence editing the encoded source.
    return (line_starts[node.lineno - 1] + node.col_offset, line_starts[node.end_lineno - 1] + node.end_col_offset)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def tuplify(value: object) -> object:
    if isinstance(value, list):
        return tuple(tuplify(v) for v in value)
    return value


"""A calculator tool: integer arithmetic the lab's tool task (``lab:multiply``) calls."""

from __future__ import annotations

import ast
import operator

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv}
_MAX_CHARS = 64  # a longer expression is refused before parsing (bounded work)
_MAX_DIGITS = 40  # no intermediate result may grow past this (no 9**9**9)


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression with + - * / (integer division) and brackets.

    Args:
        expression: The expression, e.g. "347*29".
    """
    if len(expression) > _MAX_CHARS:
        raise ValueError(f"expression longer than {_MAX_CHARS} characters")
    return str(_eval(ast.parse(expression.strip(), mode="eval").body))


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv)) and b == 0:
            raise ZeroDivisionError("division by zero")
        out = _OPS[type(node.op)](a, b)
        if len(str(abs(out))) > _MAX_DIGITS:
            raise ValueError("result too large")
        return out
    raise ValueError(f"not integer arithmetic: {ast.dump(node)[:40]}")

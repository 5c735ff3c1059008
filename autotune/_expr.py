"""Small, safe expressions for search spaces: conditions, constraints and derived values.

Expressions are Python syntax restricted to arithmetic, comparisons, ``and``/``or``/``not``,
``x if c else y``, literals, tuples and lists (for ``in``), names of parameters, and the
functions below. They are stored as text, so a space serializes to JSON without loss.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping
from typing import Any

__all__ = ["FUNCTIONS", "Expr"]

MAX_TEXT = 1000          # characters in an expression
MAX_NODES = 200          # syntax nodes in an expression
MAX_MAGNITUDE = 1e15     # any number an expression computes stays within +-MAX_MAGNITUDE
MAX_EXPONENT = 64        # ... and ** takes exponents up to this

FUNCTIONS: dict[str, Any] = {"min": min, "max": max, "abs": abs, "round": round,
                             "sqrt": math.sqrt, "log2": math.log2, "ceil": math.ceil,
                             "floor": math.floor}
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.Pow: operator.pow}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
        ast.NotIn: lambda a, b: a not in b}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}


class Expr:
    """A parsed expression. Raises ``ValueError`` for text outside the allowed syntax."""

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"an expression must be non-empty text, got {text!r}")
        self.text = text
        if len(text) > MAX_TEXT:
            raise ValueError(f"an expression is at most {MAX_TEXT} characters, got "
                             f"{len(text)}")
        try:
            self._tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as e:
            raise ValueError(f"{text!r} is not a valid expression: {e.msg}") from e
        self.names: set[str] = set()
        if sum(1 for _ in ast.walk(self._tree)) > MAX_NODES:
            raise ValueError(f"{text[:60]!r}...: an expression has at most {MAX_NODES} parts")
        self._check(self._tree.body)

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            if node.id not in FUNCTIONS:
                self.names.add(node.id)
            return
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS \
                    or node.keywords:
                raise ValueError(f"{self.text!r}: only these functions may be called: "
                                 f"{', '.join(FUNCTIONS)}")
            for arg in node.args:
                self._check(arg)
            return
        allowed = (ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Constant,
                   ast.Tuple, ast.List, ast.And, ast.Or, ast.Load, *_BIN, *_CMP, *_UNARY)
        if not isinstance(node, allowed):
            raise ValueError(f"{self.text!r}: {type(node).__name__} is not allowed in an "
                             "expression")
        for child in ast.iter_child_nodes(node):
            self._check(child)

    def __call__(self, values: Mapping[str, Any]) -> Any:
        return self._eval(self._tree.body, values)

    def _eval(self, node: ast.AST, env: Mapping[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in FUNCTIONS:
                return FUNCTIONS[node.id]
            if node.id not in env:
                raise KeyError(node.id)
            return env[node.id]
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self._eval(e, env) for e in node.elts)
        if isinstance(node, ast.BinOp):
            return self._arithmetic(type(node.op), self._eval(node.left, env),
                                    self._eval(node.right, env))
        if isinstance(node, ast.UnaryOp):
            unary: Any = _UNARY[type(node.op)]
            return unary(self._eval(node.operand, env))
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return all(self._eval(v, env) for v in node.values)
            return any(self._eval(v, env) for v in node.values)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, env)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = self._eval(comparator, env)
                if not _CMP[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            branch = node.body if self._eval(node.test, env) else node.orelse
            return self._eval(branch, env)
        if isinstance(node, ast.Call):
            func = FUNCTIONS[node.func.id]  # type: ignore[attr-defined]
            return func(*(self._eval(a, env) for a in node.args))
        raise ValueError(f"{self.text!r}: cannot evaluate {type(node).__name__}")

    def _arithmetic(self, op: type, left: Any, right: Any) -> Any:
        """``left op right`` on numbers only, bounded so no expression can run away."""
        numbers = (int, float)
        if not isinstance(left, numbers) or not isinstance(right, numbers):
            raise ValueError(f"{self.text!r}: arithmetic takes numbers, got "
                             f"{type(left).__name__} and {type(right).__name__}")
        if op is ast.Pow and (abs(right) > MAX_EXPONENT or abs(left) > MAX_MAGNITUDE):
            raise ValueError(f"{self.text!r}: {left!r} ** {right!r} is out of range (an "
                             f"exponent is at most {MAX_EXPONENT})")
        binary: Any = _BIN[op]  # type: ignore[index]
        try:
            result = binary(left, right)
        except (ArithmeticError, ValueError) as e:
            raise ValueError(f"{self.text!r}: {e}") from None
        if isinstance(result, numbers) and not abs(result) <= MAX_MAGNITUDE:
            raise ValueError(f"{self.text!r}: a value out of range ({result:.3g}; at most "
                             f"{MAX_MAGNITUDE:g} in size)")
        return result

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"

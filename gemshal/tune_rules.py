"""The heuristic rule language of tuning files (``[ops.NAME.heuristics]``).

A rule computes one keyword from the kernel's arguments at each launch, like a
value of ``triton.heuristics``. An expression is a constant (integer, float or
boolean), a string naming a kernel argument, or a one-key table applying a
function to operands: ``{ divisible = ["K", "BLOCK_K"] }``. The language is kept
this small on purpose; rules it cannot express are Python callables passed to
``rules=`` of :func:`gemshal.kernel.decorator.kernel`.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn, TypeAlias

import attrs

from gemshal.errors import ConfigError

__all__ = ["FUNCTIONS", "Call", "Expr", "HeuristicRule", "parse_rules"]

Expr: TypeAlias = "int | float | bool | str | Call"
"""A heuristic expression, which is a constant, a kernel-argument name, or a :class:`Call`."""

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _next_power_of_2(n: int) -> int:
    # Same results as triton.next_power_of_2 (0 for 0) without importing triton.
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def _if(cond: object, then: object, otherwise: object) -> object:
    return then if cond else otherwise


# name -> (fewest operands, most operands or None, implementation)
_FUNCS: dict[str, tuple[int, int | None, Callable[..., Any]]] = {
    "next_power_of_2": (1, 1, _next_power_of_2),
    "cdiv": (2, 2, lambda a, b: -(-a // b)),
    "divisible": (2, 2, lambda a, b: a % b == 0),
    "min": (1, None, lambda *a: min(a)),
    "max": (1, None, lambda *a: max(a)),
    "lt": (2, 2, operator.lt),
    "le": (2, 2, operator.le),
    "gt": (2, 2, operator.gt),
    "ge": (2, 2, operator.ge),
    "if": (3, 3, _if),
}

FUNCTIONS: tuple[str, ...] = tuple(_FUNCS)
"""The function names a rule may use."""


def _operands(value: Iterable[Expr]) -> tuple[Expr, ...]:
    return tuple(value)


@attrs.frozen
class Call:
    """A function applied to operands, e.g. ``{ divisible = ["K", "BLOCK_K"] }``.

    Attributes:
        fn: One of :data:`FUNCTIONS`.
        args: The operands, themselves expressions.
    """

    fn: str = attrs.field(validator=attrs.validators.in_(FUNCTIONS))
    args: tuple[Expr, ...] = attrs.field(converter=_operands)

    def as_data(self) -> dict[str, object]:
        """The TOML form of the call."""
        return {self.fn: [_data(a) for a in self.args]}


def _data(expr: Expr) -> object:
    return expr.as_data() if isinstance(expr, Call) else expr


def _evaluate(expr: Expr, args: Mapping[str, Any]) -> Any:
    if isinstance(expr, str):
        return args[expr]
    if isinstance(expr, Call):
        return _FUNCS[expr.fn][2](*[_evaluate(a, args) for a in expr.args])
    return expr


def _compile(expr: Expr) -> Callable[[Mapping[str, Any]], Any]:
    # Closures instead of walking the tree at every launch: the host cost of a launch matters.
    if isinstance(expr, str):
        return operator.itemgetter(expr)
    if isinstance(expr, Call):
        fn = _FUNCS[expr.fn][2]
        subs = [_compile(a) for a in expr.args]
        if len(subs) == 1:
            (one,) = subs
            return lambda args: fn(one(args))
        if len(subs) == 2:
            first, second = subs
            return lambda args: fn(first(args), second(args))
        return lambda args: fn(*[sub(args) for sub in subs])
    constant = expr
    return lambda _args: constant


def _refs(expr: Expr) -> frozenset[str]:
    if isinstance(expr, str):
        return frozenset((expr,))
    if isinstance(expr, Call):
        return frozenset().union(*[_refs(a) for a in expr.args])
    return frozenset()


@attrs.frozen
class HeuristicRule:
    """A named value computed from the kernel's arguments at each launch.

    Attributes:
        name: The keyword the value is passed as (a meta-parameter or launch keyword).
        expr: The expression: a constant, an argument name, or a :class:`Call`.
    """

    name: str = attrs.field(validator=attrs.validators.matches_re(NAME))
    expr: Expr

    def __call__(self, args: Mapping[str, Any]) -> Any:
        """The rule's value for the given ``{argument name: value}`` mapping."""
        return _evaluate(self.expr, args)

    def compile(self) -> Callable[[Mapping[str, Any]], Any]:
        """A faster function computing the same value as calling the rule."""
        return _compile(self.expr)

    def references(self) -> frozenset[str]:
        """Every argument name the expression reads."""
        return _refs(self.expr)

    def as_data(self) -> object:
        """The TOML form of the rule's expression."""
        return _data(self.expr)


def _fail(where: str, problem: str) -> NoReturn:
    raise ConfigError(f"{where}: {problem}")


def _expr(where: str, value: object) -> Expr:
    if isinstance(value, str):
        if not NAME.match(value):
            _fail(where, f"{value!r} is not a kernel-argument name")
        return value
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            _fail(where, f"constants must be finite; got {value}")
        return value
    if not isinstance(value, dict) or len(value) != 1:
        _fail(where, f"a rule is a constant, an argument name or a one-key table; got {value!r}")
    [(fn, operands)] = value.items()
    if fn not in _FUNCS:
        _fail(where, f"unknown function {fn!r}; known: {', '.join(FUNCTIONS)}")
    args = operands if isinstance(operands, list) else [operands]
    least, most = _FUNCS[fn][:2]
    if len(args) < least or (most is not None and len(args) > most):
        want = f"{least}" if least == most else f"at least {least}"
        _fail(where, f"{fn!r} takes {want} operand(s); got {len(args)}")
    return Call(fn, [_expr(where, a) for a in args])


def parse_rules(where: str, value: object) -> tuple[HeuristicRule, ...]:
    """Parse an op's ``heuristics`` table.

    Args:
        where: The file and op, for error messages.
        value: The decoded table.

    Raises:
        ConfigError: the table is empty, a name is not an identifier, a function
            is unknown or has the wrong number of operands.
    """
    if not isinstance(value, dict) or not value:
        _fail(f"{where} heuristics", "'heuristics' must be a non-empty table")
    rules = []
    for name, expr in value.items():
        here = f"{where} heuristics key {name!r}"
        if not NAME.match(name):
            _fail(here, "the name must be a kernel-argument or launch-keyword name")
        rules.append(HeuristicRule(name, _expr(here, expr)))
    return tuple(rules)

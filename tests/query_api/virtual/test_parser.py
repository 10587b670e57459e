"""The expression parser: precedence, units after numbers, and errors that point at the position."""

from __future__ import annotations

import pytest

from services.query_api.virtual.parser import (
    Binary,
    Call,
    ExpressionError,
    Number,
    Ref,
    Unary,
    lead_steps,
    parse,
    refs,
)


def test_precedence_and_associativity() -> None:
    tree = parse('"/a" + "/b" * 2 ^ 3 ^ 2')
    assert isinstance(tree, Binary) and tree.op == "+"
    mul = tree.right
    assert isinstance(mul, Binary) and mul.op == "*"
    power = mul.right
    assert isinstance(power, Binary) and power.op == "^"
    assert isinstance(power.right, Binary) and power.right.op == "^"  # right-associative
    neg = parse("-2^2")
    assert isinstance(neg, Unary) and isinstance(neg.operand, Binary)  # -(2^2)


def test_numbers_with_units() -> None:
    assert parse("1.5 kW") == Number(1.5, "kW", 0)
    assert parse("3 [W/m^2]") == Number(3.0, "W/m^2", 0)
    assert parse("2e3") == Number(2000.0, None, 0)


def test_references_functions_and_wildcards() -> None:
    tree = parse("sum(\"/dc/row0/*/power\") / max('/a', 5 W)")
    assert isinstance(tree, Binary)
    assert tree.left == Call("sum", (Ref("/dc/row0/*/power", 4),), 0)
    assert [r.name for r in refs(tree)] == ["/dc/row0/*/power", "/a"]
    assert lead_steps(parse('rate(delta("/a")) + integral("/b")')) == 2


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ('"/a" +', 7, "ends early"),
        ('("/a" + 1', 10, "expected ')'"),
        ('foo("/a")', 1, "unknown function 'foo'"),
        ("/a/b + 1", 1, "must be quoted"),
        ('"/a/*" * 2', 1, "wildcard"),
        ('abs("/a", "/b")', 1, "exactly one argument"),
        ('"/a" + "/b', 8, "unterminated"),
        ('"/a" $ 2', 6, "unexpected character '$'"),
        ('"no-slash"', 1, "must start with '/'"),
        ('"/a" "/b"', 6, "after a complete expression"),
        ("1 [W", 3, "no closing ']'"),
        ("", 1, "empty expression"),
    ],
)
def test_errors_point_at_the_position(text: str, position: int, fragment: str) -> None:
    with pytest.raises(ExpressionError) as err:
        parse(text)
    assert err.value.position + 1 == position, str(err.value)
    assert fragment in str(err.value)
    assert f"at position {position}" in str(err.value)


def test_no_eval_anywhere() -> None:
    with pytest.raises(ExpressionError):
        parse("__import__('os').system('true')")

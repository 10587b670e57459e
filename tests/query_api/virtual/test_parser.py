"""The expression parser: precedence, units after numbers, and errors that point at the position."""

from __future__ import annotations

import pytest

from services.query_api.virtual.parser import (
    MAX_DEPTH,
    Binary,
    Call,
    ExpressionError,
    ExpressionTooDeep,
    Node,
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


# --------------------------------------------------------------------------- depth

DEEP = {
    "400 nested parentheses": "(" * 400 + '"/a"' + ")" * 400,
    "500 chained ^": '"/a"' + ' ^ "/a"' * 500,
    "600 unary minus": "-" * 600 + '"/a"',
    "1200 nested calls": "abs(" * 1200 + '"/a"' + ")" * 1200,
    "1300 chained -": '"/a"' + ' - "/a"' * 1300,
    "mixed": "(-abs(" * 60 + '"/a"' + "))" * 60,
}


@pytest.mark.parametrize("name", sorted(DEEP))
def test_too_deep_is_an_error_with_its_position_not_a_recursion_error(name: str) -> None:
    text = DEEP[name]
    with pytest.raises(ExpressionTooDeep) as info:
        parse(text)
    assert info.value.reason == "too_deep"
    assert 0 <= info.value.position < len(text)
    assert f"deeper than {MAX_DEPTH}" in str(info.value)
    assert len(str(info.value)) < 400, "no copy of a 10 kB expression in the message"


def test_a_long_sum_stays_shallow_and_means_the_same() -> None:
    text = " + ".join(f'"/n{i}"' for i in range(1000))
    tree = parse(text)
    assert [r.name for r in refs(tree)] == [f"/n{i}" for i in range(1000)]
    assert isinstance(tree, Binary) and tree.op == "+"
    # -, / runs keep their left-to-right meaning: 8 - 2 - 1 is (8 - 2) - 1
    assert _shape(parse("8 - 2 - 1 + 4 * 3 / 2")) == "(((8.0-2.0)-1.0)+((4.0*3.0)/2.0))"
    assert _shape(parse("1 + 2 + 3 - 4")) == "(((1.0+2.0)+3.0)-4.0)", "runs of three stay in order"


def _shape(node: Node) -> str:
    if isinstance(node, Binary):
        return f"({_shape(node.left)}{node.op}{_shape(node.right)})"
    assert isinstance(node, Number)
    return str(node.value)


def test_the_deepest_allowed_expression_parses() -> None:
    parse("(" * (MAX_DEPTH - 1) + '"/a"' + ")" * (MAX_DEPTH - 1))
    parse("-" * (MAX_DEPTH - 1) + '"/a"')

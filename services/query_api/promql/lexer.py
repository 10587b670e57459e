"""PromQL tokens, as Prometheus' lexer (promql/parser/lex.go) cuts a query.

Keywords are case-insensitive (``SUM``, ``By``), numbers include hex (``0x1F``),
``Inf`` and ``NaN``; strings are Go-quoted (``"..."``, ``'...'``) or raw
(backquotes); ``#`` starts a comment to the end of the line. Inside ``{...}``
every word is a label name; inside ``[...]`` only durations and ``:``.
"""

from __future__ import annotations

from dataclasses import dataclass

KEYWORDS = {
    "and": "LAND", "or": "LOR", "unless": "LUNLESS", "atan2": "ATAN2",
    "sum": "AGG", "avg": "AGG", "count": "AGG", "min": "AGG", "max": "AGG", "group": "AGG",
    "stddev": "AGG", "stdvar": "AGG", "topk": "AGG", "bottomk": "AGG",
    "count_values": "AGG", "quantile": "AGG",
    "offset": "OFFSET", "by": "BY", "without": "WITHOUT", "on": "ON", "ignoring": "IGNORING",
    "group_left": "GROUP_LEFT", "group_right": "GROUP_RIGHT", "bool": "BOOL",
    "start": "START", "end": "END", "inf": "NUMBER", "nan": "NUMBER",
}  # fmt: skip
OPERATORS = {
    "+": "ADD", "-": "SUB", "*": "MUL", "/": "DIV", "%": "MOD", "^": "POW",
    "==": "EQLC", "!=": "NEQ", "<": "LSS", "<=": "LTE", ">": "GTR", ">=": "GTE",
}  # fmt: skip


class LexError(Exception):
    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.pos = pos


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # IDENTIFIER, METRIC_IDENTIFIER, NUMBER, STRING, DURATION, a keyword kind, ...
    text: str
    pos: int

    @property
    def word(self) -> str:
        """Lower-cased text (keywords are case-insensitive)."""
        return self.text.lower()

    def desc(self) -> str:
        """How Prometheus names the token in "unexpected ..." messages."""
        k = self.kind
        if k == "EOF":
            return "end of input"
        if k in ("IDENTIFIER", "METRIC_IDENTIFIER", "STRING", "NUMBER", "DURATION"):
            what = {"METRIC_IDENTIFIER": "metric identifier"}.get(k, k.lower())
            text = self.text if k != "STRING" and len(self.text) <= 10 else self.text[:10]
            return f'{what} "{text}"'
        if k in ("AGG",):
            return f"<aggr:{self.word}>"
        if k in ("LAND", "LOR", "LUNLESS", "ATAN2") or k in OPERATORS.values():
            return f"<op:{self.word}>"
        if k in KEYWORDS.values():
            return f"<{self.word}>"
        return f'"{self.text}"'


def _is_alpha(c: str) -> bool:
    return c == "_" or ("a" <= c <= "z") or ("A" <= c <= "Z")


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


def _is_alnum(c: str) -> bool:
    return _is_alpha(c) or _is_digit(c)


class Lexer:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.paren = 0
        self.brace = False
        self.bracket = False
        self.got_colon = False

    def _peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def tokens(self) -> list[Token]:
        out: list[Token] = []
        while True:
            t = self._next()
            if t.kind == "COMMENT":
                continue
            out.append(t)
            if t.kind == "EOF":
                return out

    def _next(self) -> Token:
        s = self.s
        while self.i < len(s) and s[self.i] in " \t\n\r":
            self.i += 1
        start = self.i
        if self.i >= len(s):
            if self.brace:
                raise LexError("unexpected end of input inside braces", start)
            if self.paren:
                raise LexError("unclosed left parenthesis", start)
            if self.bracket:
                raise LexError("unclosed left bracket", start)
            return Token("EOF", "", start)
        c = s[self.i]
        if c == "#":
            while self.i < len(s) and s[self.i] not in "\r\n":
                self.i += 1
            return Token("COMMENT", s[start : self.i], start)
        if self.brace:
            return self._inside_braces(c, start)
        if self.bracket:
            return self._inside_brackets(c, start)
        two = s[self.i : self.i + 2]
        if c == ",":
            self.i += 1
            return Token("COMMA", c, start)
        if two in ("==", "!=", "<=", ">="):
            self.i += 2
            return Token(OPERATORS[two], two, start)
        if c == "=":
            if self._peek(1) == "~":
                raise LexError("unexpected character after '=': '~'", start)
            self.i += 1
            return Token("EQL", c, start)
        if c == "!":
            raise LexError(f"unexpected character after '!': {self._peek(1)!r}", start)
        if c in OPERATORS:
            self.i += 1
            return Token(OPERATORS[c], c, start)
        if _is_digit(c) or (c == "." and _is_digit(self._peek(1))):
            return self._number_or_duration(start)
        if c in "\"'":
            return self._string(start)
        if c == "`":
            return self._raw_string(start)
        if _is_alpha(c) or c == ":":
            return self._word(start)
        self.i += 1
        if c == "(":
            self.paren += 1
            return Token("LEFT_PAREN", c, start)
        if c == ")":
            self.paren -= 1
            if self.paren < 0:
                raise LexError("unexpected right parenthesis ')'", start)
            return Token("RIGHT_PAREN", c, start)
        if c == "{":
            self.brace = True
            return Token("LEFT_BRACE", c, start)
        if c == "[":
            self.bracket = True
            self.got_colon = False
            return Token("LEFT_BRACKET", c, start)
        if c == "]":
            raise LexError("unexpected right bracket ']'", start)
        if c == "@":
            return Token("AT", c, start)
        raise LexError(f"unexpected character: {c!r}", start)

    def _inside_braces(self, c: str, start: int) -> Token:
        if _is_alpha(c):
            while self.i < len(self.s) and _is_alnum(self.s[self.i]):
                self.i += 1
            return Token("IDENTIFIER", self.s[start : self.i], start)
        if c in "\"'":
            return self._string(start)
        if c == "`":
            return self._raw_string(start)
        self.i += 1
        if c == ",":
            return Token("COMMA", c, start)
        if c == "=":
            if self._peek() == "~":
                self.i += 1
                return Token("EQL_REGEX", "=~", start)
            return Token("EQL", c, start)
        if c == "!":
            nxt = self._peek()
            if nxt in ("~", "="):
                self.i += 1
                return Token("NEQ_REGEX" if nxt == "~" else "NEQ", "!" + nxt, start)
            raise LexError(f"unexpected character after '!' inside braces: {nxt!r}", start)
        if c == "}":
            self.brace = False
            return Token("RIGHT_BRACE", c, start)
        if c == "{":
            raise LexError("unexpected left brace '{'", start)
        raise LexError(f"unexpected character inside braces: {c!r}", start)

    def _inside_brackets(self, c: str, start: int) -> Token:
        if c == "]":
            self.i += 1
            self.bracket = False
            return Token("RIGHT_BRACKET", c, start)
        if c == ":":
            if self.got_colon:
                raise LexError("unexpected colon ':'", start)
            self.i += 1
            self.got_colon = True
            return Token("COLON", c, start)
        if _is_digit(c):
            if self._scan_number():
                raise LexError("missing unit character in duration", start)
            if not self._remaining_duration():
                raise LexError(f"bad duration syntax: {self.s[start : self.i]!r}", start)
            return Token("DURATION", self.s[start : self.i], start)
        if c == "[":
            raise LexError("unexpected left bracket '['", start)
        if _is_alpha(c):
            raise LexError(f"bad duration syntax: {c!r}", start)
        raise LexError(f"unexpected character: {c!r}", start)

    def _accept(self, valid: str) -> bool:
        c = self._peek()
        if c and c in valid:
            self.i += 1
            return True
        return False

    def _accept_run(self, valid: str) -> None:
        while self._accept(valid):
            pass

    def _scan_number(self) -> bool:
        """Advance over a number; True when what follows cannot continue it."""
        digits = "0123456789"
        if self._peek() == "0" and self._peek(1) in ("x", "X") and self._peek(1):
            self.i += 2
            digits = "0123456789abcdefABCDEF"
        self._accept_run(digits)
        if self._accept("."):
            self._accept_run(digits)
        if self._accept("eE"):
            self._accept("+-")
            self._accept_run("0123456789")
        nxt = self._peek()
        return not (nxt and _is_alnum(nxt))

    def _remaining_duration(self) -> bool:
        if not self._accept("smhdwy"):
            return False
        self._accept("s")
        while self._accept("0123456789"):
            self._accept_run("0123456789")
            if not self._accept("smhdw"):
                return False
            self._accept("s")
        nxt = self._peek()
        return not (nxt and _is_alnum(nxt))

    def _number_or_duration(self, start: int) -> Token:
        if self._scan_number():
            return Token("NUMBER", self.s[start : self.i], start)
        self.i = start
        self._accept_run("0123456789")
        if self._remaining_duration():
            return Token("DURATION", self.s[start : self.i], start)
        self.i = start
        self._scan_number()
        while self.i < len(self.s) and _is_alnum(self.s[self.i]):
            self.i += 1
        raise LexError(f"bad number or duration syntax: {self.s[start : self.i]!r}", start)

    def _string(self, start: int) -> Token:
        quote = self.s[start]
        self.i += 1
        while True:
            if self.i >= len(self.s) or self.s[self.i] == "\n":
                raise LexError("unterminated quoted string", start)
            c = self.s[self.i]
            self.i += 1
            if c == "\\":
                self.i += 1
            elif c == quote:
                return Token("STRING", self.s[start : self.i], start)

    def _raw_string(self, start: int) -> Token:
        end = self.s.find("`", start + 1)
        if end < 0:
            raise LexError("unterminated raw string", start)
        self.i = end + 1
        return Token("STRING", self.s[start : self.i], start)

    def _word(self, start: int) -> Token:
        while self.i < len(self.s) and (_is_alnum(self.s[self.i]) or self.s[self.i] == ":"):
            self.i += 1
        word = self.s[start : self.i]
        kind = KEYWORDS.get(word.lower())
        if kind is None:
            kind = "METRIC_IDENTIFIER" if ":" in word else "IDENTIFIER"
        return Token(kind, word, start)

"""ClickHouse's error codes -> Kelvin's retry rules (RetryableStorageError or PermanentStorageError).

The collect agent's writer retries a RetryableStorageError for as long as it
lasts (the spool holds the data and back-pressure follows) and quarantines what
a PermanentStorageError refuses. So a code belongs here as *retryable* when the
same request can succeed later without any change: a node, a replica, a shard
or ZooKeeper down or slow, a quorum not reached, an insert whose fate is
unknown (retried, it is deduplicated by the replicated table's block hash).
Everything that names the request itself (syntax, types, unknown table or
column, authentication, a value the column cannot hold) is permanent. Codes
not listed are permanent too, so that an unknown error never stalls the
pipeline for good; the message carries the code.
"""

from __future__ import annotations

import re

from services.common.errors import PermanentStorageError, RetryableStorageError, StorageError

RETRYABLE: dict[int, str] = {
    3: "unexpected end of file",
    32: "attempt to read after end of file",
    33: "cannot read all data",
    159: "timeout exceeded",
    202: "too many simultaneous queries",
    203: "no free connection",
    209: "socket timeout",
    210: "network error",
    225: "no ZooKeeper",
    241: "memory limit exceeded",
    242: "table is in read-only mode (ZooKeeper unreachable)",
    252: "too many parts (merges are behind)",
    279: "all connection tries failed (a shard is unreachable)",
    285: "too few live replicas for the insert quorum",
    286: "the previous quorum write is not yet satisfied",
    319: "unknown status of insert (it may or may not have landed)",
    394: "query was cancelled",
    425: "system error",
    999: "ZooKeeper (Keeper) error",
    1000: "network error (POCO)",
}
PERMANENT: dict[int, str] = {
    6: "cannot parse text",
    16: "no such column",
    27: "cannot parse input",
    36: "bad arguments",
    44: "illegal column",
    46: "unknown function",
    47: "unknown identifier",
    53: "type mismatch",
    60: "unknown table",
    62: "syntax error",
    69: "argument out of bound",
    81: "unknown database",
    117: "incorrect data",
    192: "unknown user",
    193: "wrong password",
    194: "required password",
    497: "access denied",
    516: "authentication failed",
}
_CODE = re.compile(r"Code:\s*(\d+)")


def code_of(text: str, header: str | None = None) -> int | None:
    """The exception code of an error answer (header of newer servers, else the body)."""
    if header and header.strip().isdigit():
        return int(header)
    m = _CODE.search(text)
    return int(m.group(1)) if m else None


def is_retryable(code: int | None, status: int) -> bool:
    if code is None:
        return status in (429, 502, 503, 504)
    return code in RETRYABLE


def error(where: str, what: str, code: int | None, status: int, detail: str) -> StorageError:
    """The Kelvin error for one failed request."""
    named = RETRYABLE.get(code or -1) or PERMANENT.get(code or -1) or "error"
    label = f"code {code} ({named})" if code is not None else f"HTTP {status}"
    text = f"clickhouse {where}: {what} failed: {label}: {detail.strip()[:400]}"
    if code in (192, 193, 194, 497, 516):
        text += " (check storage.clickhouse.username/password)"
    elif code in (60, 81):
        text += " (set storage.clickhouse.create_tables, or create them: docs/storage.md)"
    if is_retryable(code, status):
        return RetryableStorageError(text)
    return PermanentStorageError(text)

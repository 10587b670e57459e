"""One HTTP ingest path for every body format: line protocol today, remote write beside it.

:func:`ingest` does what every HTTP way in must do, in one place: refuse while
the agent drains before it exits (503), wait out back-pressure (503 with
``Retry-After`` when it lasts), read the body within
``max_payload_bytes`` (413; gzip undone when the client says so), hand it to
the format's decoder, count every rejected item by reason, and answer 204 only
once the readings are durable in the spool (503 when the spool refuses them),
or 400 naming the first rejected item after keeping the good ones (a partial
write). A format supplies only ``decode(body) -> Decoded``; it raises
:class:`BodyError` for a body it refuses whole.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import HTTPException, Request, Response
from fastapi.responses import JSONResponse

from services.collect_agent.spool import SpoolError
from services.common.readings import Batch
from services.common.tasks import wait_for

if TYPE_CHECKING:
    from services.collect_agent.ingest import Ingestor

ADMIT_TIMEOUT_S = 10.0


@dataclass
class Decoded:
    """What a decoder made of a body."""

    batch: Batch
    received: int
    """Items received (lines, series), for the messages counter."""
    errors: list[tuple[int, str, str]] = field(default_factory=list)
    """(item number, reason, message) of each rejected item; ``what`` names the item."""
    what: str = "line"


class BodyError(ValueError):
    """A body refused whole (400): ``reason`` labels the reject counter."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


async def read_body(request: Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes (also once gzip is undone); HTTPException 413/400."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"body of {declared} bytes exceeds max_payload_bytes={limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"body exceeds max_payload_bytes={limit}")
        chunks.append(chunk)
    body = b"".join(chunks)
    if request.headers.get("content-encoding", "").lower() == "gzip":
        d = zlib.decompressobj(wbits=31)
        try:
            body = d.decompress(body, limit + 1)
        except zlib.error as exc:
            raise HTTPException(400, f"gzip body does not decompress: {exc}") from exc
        if len(body) > limit or d.unconsumed_tail:
            raise HTTPException(413, f"decompressed body exceeds max_payload_bytes={limit}")
    return body


async def ingest(
    ing: Ingestor,
    request: Request,
    limit: int,
    decode: Callable[[bytes], Decoded],
    transport: str,
) -> Response:
    """Admit, read, decode, count rejects, wait until durable (see the module docstring)."""
    where = f"HTTP {request.url.path} from {request.client}"
    if ing.draining:  # refused before the body is read (receive_batch would refuse it too)
        return JSONResponse(
            {"error": "the collect agent is shutting down; send to another agent"},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    try:
        if ing.paused:  # only when there is something to wait for
            await wait_for(ing.admitted(), ADMIT_TIMEOUT_S)
    except TimeoutError:
        return JSONResponse(
            {"error": "spool full (storage behind); retry later"},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    try:
        body = await read_body(request, limit)
    except HTTPException as exc:
        ing.reject(
            None, "too_large" if exc.status_code == 413 else "bad_gzip", f"{where}: {exc.detail}"
        )
        raise
    try:
        got = decode(body)
    except BodyError as exc:
        ing.reject(None, exc.reason, f"{where}: {exc}")
        return JSONResponse({"error": str(exc)}, status_code=400)
    for no, reason, msg in got.errors:
        ing.reject(None, reason, f"{where} {got.what} {no}: {msg}")
    try:
        await ing.receive_batch(got.batch, got.received, transport)
    except SpoolError as exc:
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "5"})
    if got.errors:
        no, _, msg = got.errors[0]
        return JSONResponse(
            {
                "error": f"partial write: {got.what} {no}: {msg} "
                f"({len(got.errors)} {got.what}(s) rejected)"
            },
            status_code=400,
        )
    return Response(status_code=204)

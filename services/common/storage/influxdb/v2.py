"""InfluxDB 2.x bucket management, the one thing the v1-compatible API lacks.

A v1 write to database ``db`` and policy ``rp`` lands in bucket ``db/rp``
(2.x maps it automatically when the bucket has that name). Kelvin creates the
readings bucket and the catalog bucket with ``influxdb-client`` when missing.
Runs in a worker thread: the client is synchronous.
"""

from __future__ import annotations

import logging
from typing import Any

from services.common.errors import PermanentStorageError, RetryableStorageError, TimeSpecError
from services.common.storage.settings import InfluxSettings
from services.common.times import parse_duration_ns

log = logging.getLogger(__name__)


def bucket_names(s: InfluxSettings) -> list[str]:
    """Buckets a v1 client of these settings writes to."""
    rps = {s.retention_policy or "autogen", s.catalog_retention_policy or "autogen"}
    return sorted(f"{s.database}/{rp}" for rp in rps)


def ensure_buckets(s: InfluxSettings) -> None:
    """Create the buckets of :func:`bucket_names` in ``s.org`` if missing."""
    from influxdb_client.client.influxdb_client import InfluxDBClient
    from influxdb_client.rest import ApiException

    if not s.org:
        # 3.x needs no bucket (it creates databases on first write); on 2.x the
        # first write then fails with a clear 404 naming the database.
        log.info(
            "influxdb: CREATE DATABASE refused and storage.influxdb.org unset: not creating "
            "buckets %s (set org on 2.x)",
            ", ".join(bucket_names(s)),
        )
        return
    try:
        with InfluxDBClient(
            url=s.url, token=s.token or "", org=s.org, timeout=int(s.timeout_s * 1000)
        ) as c:
            api = c.buckets_api()
            readings = f"{s.database}/{s.retention_policy or 'autogen'}"
            for name in bucket_names(s):
                if api.find_bucket_by_name(name) is None:
                    log.info("influxdb: creating bucket %s in org %s", name, s.org)
                    rules = _rules(s.retention_duration) if name == readings else None
                    api.create_bucket(bucket_name=name, org=s.org, retention_rules=rules)
    except ApiException as exc:
        if exc.status == 404:  # no v2 bucket API (3.x): databases appear on first write
            log.info("influxdb: no bucket API at %s; relying on creation at first write", s.url)
            return
        if exc.status in (401, 403, 422):
            raise PermanentStorageError(f"influxdb: cannot create buckets: {exc.reason}") from exc
        raise RetryableStorageError(f"influxdb: cannot create buckets: {exc.reason}") from exc
    except OSError as exc:
        raise RetryableStorageError(f"influxdb: cannot create buckets: {exc}") from exc


def _rules(duration: str | None) -> Any:
    """Bucket retention rules for an InfluxQL duration (None: keep forever)."""
    if not duration or duration.strip().upper() == "INF":
        return None
    from influxdb_client.domain.bucket_retention_rules import BucketRetentionRules

    try:
        seconds = parse_duration_ns(duration) // 1_000_000_000
    except TimeSpecError as exc:
        raise PermanentStorageError(f"storage.influxdb.retention_duration: {exc}") from exc
    return BucketRetentionRules(type="expire", every_seconds=seconds)  # type: ignore[no-untyped-call]

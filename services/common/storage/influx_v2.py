"""InfluxDB 2.x bucket management, the one thing the v1-compatible API lacks.

A v1 write to database ``db`` and policy ``rp`` lands in bucket ``db/rp``
(2.x maps it automatically when the bucket has that name). Kelvin creates the
readings bucket and the catalog bucket with ``influxdb-client`` when missing.
Runs in a worker thread: the client is synchronous.
"""

from __future__ import annotations

import logging

from services.common.errors import PermanentStorageError, RetryableStorageError
from services.common.storage.settings import InfluxSettings

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
        raise PermanentStorageError(
            "influxdb: CREATE DATABASE was refused and storage.influxdb.org is not set; on "
            f"InfluxDB 2.x set org (to create buckets {', '.join(bucket_names(s))}) or "
            "create them yourself and set create_database: false"
        )
    try:
        with InfluxDBClient(
            url=s.url, token=s.token or "", org=s.org, timeout=int(s.timeout_s * 1000)
        ) as c:
            api = c.buckets_api()
            for name in bucket_names(s):
                if api.find_bucket_by_name(name) is None:
                    log.info("influxdb: creating bucket %s in org %s", name, s.org)
                    api.create_bucket(bucket_name=name, org=s.org)
    except ApiException as exc:
        if exc.status in (401, 403, 404, 422):
            raise PermanentStorageError(f"influxdb: cannot create buckets: {exc.reason}") from exc
        raise RetryableStorageError(f"influxdb: cannot create buckets: {exc.reason}") from exc
    except OSError as exc:
        raise RetryableStorageError(f"influxdb: cannot create buckets: {exc}") from exc

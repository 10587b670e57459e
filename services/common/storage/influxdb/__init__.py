"""The InfluxDB backend: 1.x over HTTP (line protocol in, InfluxQL CSV out), 2.x/3.x through their v1 endpoints."""

from services.common.storage.influxdb.backend import InfluxStorage

__all__ = ["InfluxStorage"]

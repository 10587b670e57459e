"""How a line's measurement, tag values and field keys become a Kelvin sensor name.

``cpu,host=n1,core=0 user=1.5`` becomes ``<prefix>/n1/0/user``, where
``<prefix>`` is the measurement's configured prefix (default
``<influx_prefix>/<measurement>``). Tag values keep their order on the line
(Telegraf sorts tags by key); tag keys name nothing. A ``/``, ``+``, ``#`` or
NUL inside a name becomes ``_``, so that each name stays one level.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from services.common import names

_LEVEL_UNSAFE = str.maketrans({"/": "_", "+": "_", "#": "_", "\x00": "_"})


def level(text: str) -> str:
    return text.translate(_LEVEL_UNSAFE)


class Naming:
    """The naming rules of one agent (its ``influx_prefix`` and ``influx_measurements``)."""

    def __init__(self, measurements: Mapping[str, str] | None = None, prefix: str = "/influx"):
        self.measurements = dict(measurements or {})
        self.base = "" if prefix in ("", "/") else prefix.rstrip("/")

    def head(self, measurement: str, tag_values: Iterable[str]) -> str:
        """Everything of the name but the field level."""
        prefix = self.measurements.get(measurement) or f"{self.base}/{level(measurement)}"
        return "/".join([prefix.rstrip("/"), *(level(v) for v in tag_values)])

    def sensor(self, head: str, field: str) -> str:
        """The sensor name; SensorNameError when it breaks the naming rules (too deep, too long)."""
        return names.validate(f"{head}/{level(field)}")

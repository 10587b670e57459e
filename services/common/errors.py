"""Kelvin's error tree, shared by every service.

    KelvinError
    ├── ConfigError                 bad configuration file, env variable or flag (CLI exit 2)
    ├── SensorNameError             a sensor name / MQTT topic that breaks the naming rules
    ├── PayloadError                a wire payload that cannot be decoded
    ├── TimeSpecError               a time argument that is not in the DCDB time syntax
    ├── NotFoundError               an unknown sensor, job, plugin, virtual sensor, ...
    ├── PortInUseError              a listening port that another process holds
    └── StorageError                anything a storage backend raises
        ├── RetryableStorageError   try again later: server down, timeout, database locked
        └── PermanentStorageError   retrying cannot help: bad data, schema conflict, auth

Messages name the input, the place and what was expected, so that an operator
can act on them without reading code.
"""

from __future__ import annotations


class KelvinError(Exception):
    """Root of every error Kelvin raises on purpose."""


class ConfigError(KelvinError):
    """A configuration value is missing, of the wrong type or out of range."""


class SensorNameError(KelvinError, ValueError):
    """A sensor name (= MQTT topic) breaks the naming rules."""


class PayloadError(KelvinError, ValueError):
    """A payload cannot be decoded.

    ``reason`` is a short, stable, label-safe token used as the value of the
    ``reason`` label on reject counters (e.g. ``bad_length``, ``bad_json``).
    """

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


class TimeSpecError(KelvinError, ValueError):
    """A time argument is not in the DCDB time syntax."""


class NotFoundError(KelvinError, LookupError):
    """A named thing (sensor, job, plugin, virtual sensor) does not exist."""


class PortInUseError(KelvinError, OSError):
    """A port Kelvin must listen on is held by another process."""


class StorageError(KelvinError):
    """Base of every storage backend error."""


class RetryableStorageError(StorageError):
    """The operation may succeed later (server unreachable, timeout, locked)."""


class PermanentStorageError(StorageError):
    """The operation cannot succeed by retrying (bad data, auth, schema)."""

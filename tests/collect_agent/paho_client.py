"""paho-mqtt (the reference Python client) driven step by step from async tests.

paho runs its network loop in a thread; each call here blocks until the broker's
answer arrived (CONNACK, PUBACK/PUBCOMP) and returns the MQTT 5 reason code, so
tests call it through ``asyncio.to_thread`` while the agent runs in the test's loop.
"""

from __future__ import annotations

import ssl
import threading
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

WAIT_S = 10.0


class Paho:
    """One paho client (MQTT 5 unless ``v311``)."""

    def __init__(
        self,
        port: int,
        client_id: str,
        username: str | None = None,
        password: str | None = None,
        v311: bool = False,
        tls: ssl.SSLContext | None = None,
        clean_session: bool = True,
    ) -> None:
        """``clean_session``: 3.1.1 only (MQTT 5 gives Clean Start to :meth:`connect`)."""
        self.port = port
        self.v5 = not v311
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv311 if v311 else mqtt.MQTTv5,
            clean_session=clean_session if v311 else None,
        )
        if username is not None:
            self.client.username_pw_set(username, password)
        if tls is not None:
            self.client.tls_set_context(tls)
        self._connack = threading.Event()
        self._closed = threading.Event()
        self.connack: tuple[int, bool] = (-1, False)
        self.disconnect_code: int | None = None
        self._acks: dict[int, int] = {}
        self._acked = threading.Condition()
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_publish
        self.client.on_disconnect = self._on_disconnect

    def _on_connect(self, c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.connack = (int(rc.value), bool(flags.session_present))
        self._connack.set()

    def _on_publish(self, c: Any, u: Any, mid: int, rc: Any, props: Any) -> None:
        with self._acked:
            self._acks[mid] = int(rc.value)
            self._acked.notify_all()

    def _on_disconnect(self, c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.disconnect_code = int(rc.value)
        self._closed.set()

    def connect(
        self, clean_start: bool = True, expiry_s: int | None = None, keepalive_s: int = 60
    ) -> tuple[int, bool]:
        """(CONNACK reason code, session present)."""
        props = None
        if self.v5 and expiry_s is not None:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = expiry_s
        kw: dict[str, Any] = {"keepalive": keepalive_s}
        if self.v5:
            kw.update(clean_start=clean_start, properties=props)
        self.client.connect("127.0.0.1", self.port, **kw)
        self.client.loop_start()
        if not self._connack.wait(WAIT_S):
            raise TimeoutError("no CONNACK")
        return self.connack

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> int:
        """The reason code of the PUBACK (QoS 1) / PUBREC (QoS 2)."""
        info = self.client.publish(topic, payload, qos=qos)
        with self._acked:
            if not self._acked.wait_for(lambda: info.mid in self._acks, WAIT_S):
                raise TimeoutError(f"no acknowledgement of {topic}")
            return self._acks.pop(info.mid)

    def wait_closed(self) -> int | None:
        """Until the server closed the connection; its DISCONNECT reason (if any)."""
        if not self._closed.wait(WAIT_S):
            raise TimeoutError("the server did not close the connection")
        return self.disconnect_code

    def close(self, expiry_s: int | None = None) -> None:
        """DISCONNECT (MQTT 5: with a new Session Expiry Interval when given)."""
        if not self._closed.is_set():
            props = None
            if expiry_s is not None:
                props = Properties(PacketTypes.DISCONNECT)  # type: ignore[no-untyped-call]
                props.SessionExpiryInterval = expiry_s
            self.client.disconnect(properties=props)
            self._closed.wait(WAIT_S)
        self.client.loop_stop()

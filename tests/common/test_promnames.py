"""Sensor names <-> Prometheus series: levels never share a metric, remote-write names round-trip."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.common import names
from services.common.promnames import labels_dict, sensor_name, series_labels


def test_a_total_and_its_parts_are_different_metrics() -> None:
    hall = labels_dict("/hall/power")
    node = labels_dict("/hall/row0/rack1/node2/power")
    row = labels_dict("/hall/row0/power")
    assert hall["__name__"] == "hall_power" and row["__name__"] == "row_power"
    assert node == {
        "__name__": "node_power", "hall": "hall", "row": "row0", "rack": "rack1",
        "node": "node2", "sensor": "/hall/row0/rack1/node2/power",
    }  # fmt: skip
    assert labels_dict("/dc/node17/power")["__name__"] == "node_power"  # kinds, not names


def test_awkward_levels_still_give_valid_names() -> None:
    assert labels_dict("/a/0/b")["l2"] == "0"
    assert labels_dict("/dc/rack0/rack1/t")["rack_2"] == "rack1"
    assert labels_dict("/x/sensor3/y")["sensor"] == "/x/sensor3/y"
    assert labels_dict("/x/sensor3/y")["sensor_level"] == "sensor3"
    assert labels_dict("/9lives/temp-c")["__name__"] == "l1_temp_c"  # a level starting with a digit


label_names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: n not in ("sensor", "__name__")
)
label_values = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), min_size=1, max_size=12
)


@given(
    st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True),
    st.dictionaries(label_names, label_values, max_size=5),
)
def test_remote_write_names_map_back_to_their_labels(metric: str, labels: dict[str, str]) -> None:
    name = sensor_name({"__name__": metric, **labels}, "/prometheus")
    try:
        names.validate(name)
    except Exception:
        return  # too long or too deep: remote write refuses such a series
    got = labels_dict(name)
    assert got.pop("sensor") == name
    assert got == {"__name__": metric, **labels}


def test_a_kelvin_series_is_its_sensor_a_derived_one_is_not() -> None:
    sensor = "/hall/row0/rack0/node0/power"
    assert sensor_name(labels_dict(sensor), "/p") == sensor
    # ALERTS_FOR_STATE of an alert on node_power carries the sensor label too
    derived = {**labels_dict(sensor), "__name__": "ALERTS_FOR_STATE", "alertname": "Hot"}
    name = sensor_name(derived, "/p")
    assert name.startswith("/p/ALERTS_FOR_STATE/") and "exported_sensor=%2Fhall" in name
    assert labels_dict(name)["exported_sensor"] == sensor
    assert sensor_name({**labels_dict(sensor), "job": "x"}, "/p") != sensor
    assert series_labels(sensor_name({"__name__": "up"}, "/p")) == (
        ("__name__", "up"),
        ("sensor", "/p/__name__=up"),
    )

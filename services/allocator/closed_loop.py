"""``kelvin allocator calibrate``: telemetry from the query API in, a fitted D out (and applied).

Sensor names per hall node come from a map (templates with ``{row}``,
``{rack}``, ``{slot}``, ``{index}``, or explicit lists), by default
:func:`services.common.thermal.node_sensor`; the supply temperature from the
map's ``supply_temp`` or ``/hall/supply_temp`` when it exists (else the hall's
constant ``supply_c``). Series are read with
``GET /api/v1/readings?sensor=NAME&start=NS&end=NS&format=json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import scipy.sparse as sp
import yaml

from services.allocator import model_wire as wire
from services.allocator.calibrate import (
    CalibrationError,
    Fit,
    Samples,
    Series,
    align,
    compare,
    fit_d,
    fit_lagged,
    lag_samples,
    standard_errors,
)
from services.allocator.settings import Settings
from services.common.auth import Role
from services.common.auth_settings import client_token
from services.common.errors import ConfigError, KelvinError, NotFoundError
from services.common.settings import Config
from services.common.thermal import (
    HALL_SENSOR_PREFIX,
    Float64Array,
    Hall,
    load_matrix,
    node_sensor,
    reference_hall,
)
from services.common.times import parse_duration_ns, parse_time

QUANTITIES = ("power", "inlet_temp")
SUPPLY_KEY = "supply_temp"
DEFAULT_SUPPLY_SENSOR = f"{HALL_SENSOR_PREFIX}/supply_temp"
"""The simulated hall's CRAC supply (datacenter plugin); used when it exists and the map names none."""


def sensor_names(hall: Hall, mapping: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """Per quantity, the sensor name of every present node (in node order)."""
    mapping = mapping or {}
    nodes = np.flatnonzero(hall.present_mask).tolist()
    out: dict[str, list[str]] = {}
    for q in QUANTITIES:
        spec = mapping.get(q)
        if spec is None:
            out[q] = [node_sensor(hall, i, q) for i in nodes]
        elif isinstance(spec, str):
            out[q] = [_render(spec, hall, i, q) for i in nodes]
        elif (
            isinstance(spec, list)
            and len(spec) == len(nodes)
            and all(isinstance(s, str) for s in spec)
        ):
            out[q] = list(spec)
        else:
            raise ConfigError(
                f"sensor map: {q}: expected a template string or a list of {len(nodes)} names "
                "(one per present node, in index order)"
            )
    return out


def _render(template: str, hall: Hall, i: int, q: str) -> str:
    row, rack, slot = hall.position(i)
    try:
        return template.format(row=row, rack=rack, slot=slot, index=i, quantity=q)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"sensor map template {template!r}: {exc}; use {{row}} {{rack}} {{slot}} {{index}}"
        ) from exc


def fetch_series(client: httpx.Client, name: str, start_ns: int, end_ns: int) -> Series:
    """One sensor's readings through the query API."""
    params = {"sensor": name, "start": str(start_ns), "end": str(end_ns), "format": "json"}
    try:
        r = client.get("/api/v1/readings", params=params)
    except httpx.HTTPError as exc:
        raise KelvinError(f"cannot reach the query API at {client.base_url}: {exc}") from exc
    if r.status_code == 404:
        raise NotFoundError(f"query API has no sensor {name!r} ({r.text[:200]})")
    if r.status_code != 200:
        raise KelvinError(f"query API answered {r.status_code} for {name!r}: {r.text[:200]}")
    try:
        doc = r.json()
        ts = np.asarray(doc["timestamps_ns"], dtype=np.int64)
        vs = np.asarray(doc["values"], dtype=np.float64)
    except (ValueError, KeyError, TypeError) as exc:
        raise KelvinError(
            f"query API answer for {name!r} lacks timestamps_ns/values arrays: {exc}"
        ) from exc
    if ts.shape != vs.shape:
        raise KelvinError(f"query API answer for {name!r}: timestamps and values differ in length")
    order = np.argsort(ts, kind="stable")
    return ts[order], vs[order]


def run_calibration(args: argparse.Namespace) -> dict[str, Any]:
    """Fetch, align, fit, report; write and apply when asked. Returns the report."""
    config = Config(args.config)
    settings = config.load(Settings)
    hall_path = args.hall or settings.hall_file
    if hall_path:
        from services.common.halls.hallfile import load_hall

        hall = load_hall(hall_path)
    else:
        hall = reference_hall()
    mapping = _read_map(args.sensor_map) if args.sensor_map else settings.sensor_map
    names = sensor_names(hall, mapping)
    known = _known_d(args.known_d, hall) if args.known_d else None
    start, end = parse_time(args.start), parse_time(args.end)
    if end <= start:
        raise ConfigError(f"--end {args.end} must be after --start {args.start}")
    step = parse_duration_ns(args.step) if args.step else None
    # --apply needs admin; reading the telemetry alone, the read token serves
    token = args.token or client_token(config, Role.ADMIN) or client_token(config, Role.READ)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = args.url or settings.query_api_url
    tau = _time_constant(getattr(args, "time_constant", None))
    with httpx.Client(base_url=url, headers=headers, timeout=30.0) as client:
        power = [fetch_series(client, n, start, end) for n in names["power"]]
        inlet = [fetch_series(client, n, start, end) for n in names["inlet_temp"]]
        supply_name, supply = _supply_series(client, mapping, start, end)
    samples = align(power, inlet + ([supply] if supply is not None else []), step)
    base = hall.supply_c
    if supply is not None:  # the inlets' rise over the supply as it was at each instant
        rise = samples.inlet_c[:, :-1] - samples.inlet_c[:, -1:]
        samples, base = Samples(samples.times_ns, samples.powers_w, rise), 0.0
    present = hall.present_mask
    local = getattr(args, "local", None)
    if hall.sparse and not local:
        raise ConfigError(
            f"hall {hall.name!r} has a sparse D ({hall.n_nodes} nodes): fit it sparse with "
            "--local RACKS[,ROWS] (a node's neighbourhood)"
        )
    if local:
        # A search over time constants would repeat the whole sparse fit: a given τ only.
        tau = tau or 0.0
        samples = lag_samples(samples, tau)
        d_full, fit = _local_fit(hall, samples, base, args.fit_supply, local)
    else:
        fit, tau, samples = fit_lagged(samples, base, tau, args.fit_supply)
        d_full = np.zeros_like(hall.d_matrix)
        d_full[np.ix_(present, present)] = fit.d_matrix
    doc: dict[str, Any] = {
        "hall": hall.name,
        "samples": fit.samples,
        "sensors": 2 * len(names["power"]),
        "rmse_c": fit.rmse_c,
        "max_abs_c": fit.max_abs_c,
        "supply_c": fit.supply_c.tolist() if args.fit_supply else base or None,
        "supply_sensor": supply_name,
        "time_constant_s": tau,
        "distinct_operating_points": int(
            np.unique(np.round(samples.powers_w / 100.0), axis=0).shape[0]
        ),
    }
    if not local:  # needs the dense N x N covariance
        doc["expected"] = standard_errors(samples, fit, hall, args.fit_supply)
    if known is not None:
        doc["known"] = compare(d_full, known, hall)
    fitted = hall.replace(d_matrix=d_full, name=f"{hall.name}-fitted")
    if args.out:
        from services.common.halls.hallfile import save_hall

        doc["written"] = str(save_hall(fitted, args.out))
    if args.apply:
        target = args.allocator_url or f"http://127.0.0.1:{settings.port}"
        doc["applied"] = apply_model(target, d_full, doc, headers)
    return doc


def _local_fit(
    hall: Hall, samples: Samples, supply_c: float, fit_supply: bool, spec: str
) -> tuple[Any, Fit]:
    """A sparse D fitted within each node's neighbourhood (``--local RACKS[,ROWS]``)."""
    from services.allocator.calibrate import local_support

    try:
        racks, _, rows = spec.partition(",")
        near = local_support(hall, int(racks), int(rows or 1))
    except ValueError:
        raise ConfigError(f"--local {spec!r}: expected RACKS or RACKS,ROWS (integers)") from None
    present = hall.present_mask.astype(np.float64)
    near = sp.csr_matrix(sp.diags(present) @ near @ sp.diags(present))
    keep = np.flatnonzero(hall.present_mask)
    fit = fit_d(samples, supply_c, fit_supply, sp.csr_matrix(near[keep][:, keep]))
    coo = sp.coo_matrix(fit.d_matrix)
    full = sp.csr_matrix((coo.data, (keep[coo.row], keep[coo.col])), shape=near.shape)
    return full, fit


def apply_model(base_url: str, d: Any, report: dict[str, Any], headers: dict[str, str]) -> str:
    """PUT the fitted D to a running allocator (a sparse D as ``d_npz``); returns the URL."""
    body = {
        **wire.encode(d, "npz" if sp.issparse(d) else "dense"),
        "source": "kelvin allocator calibrate",
        "fit": {k: report[k] for k in ("samples", "rmse_c", "max_abs_c")},
    }
    url = base_url.rstrip("/") + "/api/v1/hall/model"
    try:
        r = httpx.put(url, json=body, headers=headers, timeout=60.0)
    except httpx.HTTPError as exc:
        raise KelvinError(f"cannot reach the allocator at {base_url}: {exc}") from exc
    if r.status_code != 200:
        raise KelvinError(f"allocator refused the model ({r.status_code}): {r.text[:300]}")
    return url


def _time_constant(spec: str | None) -> float | None:
    """``--time-constant``: None (auto: found from the data) or seconds."""
    if spec is None or spec.strip().lower() == "auto":
        return None
    try:
        return parse_duration_ns(spec) / 1e9
    except KelvinError as exc:
        raise ConfigError(f"--time-constant: {exc}; or 'auto'") from exc


def _supply_series(
    client: httpx.Client, mapping: dict[str, Any] | None, start: int, end: int
) -> tuple[str | None, Series | None]:
    """The supply temperature's readings: the mapped sensor (which must exist), else the
    simulated hall's when stored, else none (the hall's constant supply)."""
    name = (mapping or {}).get(SUPPLY_KEY)
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"sensor map: {SUPPLY_KEY}: expected one sensor name")
    try:
        return name or DEFAULT_SUPPLY_SENSOR, fetch_series(
            client, name or DEFAULT_SUPPLY_SENSOR, start, end
        )
    except NotFoundError:
        if name:
            raise
        return None, None


def _known_d(path: Path, hall: Hall) -> Float64Array:
    """The ``--known-d`` matrix, checked against the hall before any data is fetched."""
    d = load_matrix(path)
    n = hall.n_nodes
    if d.shape != (n, n):
        raise ConfigError(
            f"--known-d {path}: matrix is {d.shape[0]}x{d.shape[1]}, expected {n}x{n} "
            f"(hall {hall.name!r})"
        )
    return d


def _read_map(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read sensor map: {exc}") from exc
    if not isinstance(doc, dict) or not set(doc) <= {*QUANTITIES, SUPPLY_KEY}:
        raise ConfigError(
            f"{path}: expected a mapping with keys power, inlet_temp and/or {SUPPLY_KEY}"
        )
    return doc


__all__ = ["CalibrationError", "apply_model", "fetch_series", "run_calibration", "sensor_names"]

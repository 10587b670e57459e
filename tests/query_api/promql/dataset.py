"""The samples the differential suite loads into both Prometheus and Kelvin.

Small but awkward on purpose: millisecond (sub-second) timestamps with jitter,
counters that reset, gaps longer than the lookback, NaN, infinities, a 1e17
spike, negative and constant series, several label sets per metric, one series
per level of a hierarchy, and histogram buckets for ``histogram_quantile``.
"""

from __future__ import annotations

import numpy as np

from services.common.promnames import escape_value, series_labels

T0_MS = 1_700_000_000_000
"""Start of the samples (2023-11-14T22:13:20Z)."""
SPAN_MS = 2 * 3600 * 1000
MS = 1_000_000


def _times(rng: np.random.Generator, step_ms: int, jitter_ms: int, start_ms: int = 0) -> np.ndarray:
    base = np.arange(T0_MS + start_ms, T0_MS + SPAN_MS, step_ms, dtype=np.int64)
    if jitter_ms:
        base = base + rng.integers(-jitter_ms, jitter_ms + 1, base.shape[0])
    return np.unique(base) * MS


def samples() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Sensor name -> (timestamps ns, values)."""
    rng = np.random.default_rng(15)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for r in range(2):
        for k in range(2):
            for n in range(2):
                node = f"/dc/row{r}/rack{k}/node{n}"
                ts = _times(rng, 15_000, 900 if (r + n) % 2 else 0)
                i = np.arange(ts.shape[0])
                out[f"{node}/power"] = (ts, 200 + 40 * r + 10 * n + 15 * np.sin(i / (7 + k)))
                ts2 = _times(rng, 10_000 + 2_500 * n, 300)
                out[f"{node}/inlet_temp"] = (
                    ts2,
                    20 + r + k / 2 + rng.normal(0, 0.4, ts2.shape[0]).round(3),
                )
                ts3 = _times(rng, 30_000, 2_000)
                energy = np.cumsum(rng.integers(500, 1500, ts3.shape[0])).astype(np.float64)
                if (r, k, n) == (0, 0, 0):
                    energy[100:] -= energy[99]  # a counter reset
                    energy[160:] -= energy[159]  # and another
                if (r, k, n) == (1, 1, 1):
                    energy[40:] = energy[40:] / 7  # a reset to a non-zero value
                out[f"{node}/energy"] = (ts3, energy)
        row_ts = _times(rng, 20_000, 0)
        out[f"/dc/row{r}/power"] = (
            row_ts,
            900 + 100 * r + np.cos(np.arange(row_ts.shape[0]) / 5) * 30,
        )
    dc_ts = _times(rng, 15_000, 0)
    out["/dc/power"] = (dc_ts, 1900 + 20 * np.sin(np.arange(dc_ts.shape[0]) / 11))

    gap_ts = _times(rng, 15_000, 500)
    keep = (gap_ts < (T0_MS + 1_800_000) * MS) | (gap_ts > (T0_MS + 2_700_000) * MS)  # 15 min gap
    gap_ts = gap_ts[keep]
    out["/dc/row1/rack0/node0/fan_rpm"] = (
        gap_ts,
        3000 + 100 * np.sin(np.arange(gap_ts.shape[0]) / 3),
    )

    odd_ts = _times(rng, 15_000, 0)
    odd = 10 + np.arange(odd_ts.shape[0]) % 17 - 8.0
    odd[[30, 31, 200]] = np.nan
    odd[[100]] = np.inf
    odd[[250]] = -np.inf
    out["/dc/row0/rack1/node1/odd"] = (odd_ts, odd)

    spike_ts = _times(rng, 15_000, 0)
    spike = 1 + (np.arange(spike_ts.shape[0]) % 5) * 0.1
    spike[150] = 1e17
    out["/dc/row0/rack1/node0/spiky"] = (spike_ts, spike)

    flat_ts = _times(rng, 60_000, 0)
    out["/dc/row1/rack1/node0/flat"] = (flat_ts, np.full(flat_ts.shape[0], 42.0))

    neg_ts = _times(rng, 15_000, 250)
    out["/dc/row1/rack1/node1/delta_t"] = (neg_ts, -5 + 3 * np.sin(np.arange(neg_ts.shape[0]) / 4))

    for inst in ("a", "b"):
        hts = _times(rng, 15_000, 0)
        base = np.cumsum(rng.integers(0, 20, (hts.shape[0], 5)), axis=0).astype(np.float64)
        cum = np.cumsum(base, axis=1)
        for j, le in enumerate(("0.05", "0.1", "0.5", "1", "+Inf")):
            name = f"/dc/api/http_latency_seconds_bucket/instance={inst}/le={escape_value(le)}"
            out[name] = (hts, cum[:, j])
        out[f"/dc/api/http_latency_seconds_count/instance={inst}"] = (hts, cum[:, 4])
    return out


def prometheus_series() -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
    """The same samples as Prometheus series (labels as Kelvin names them)."""
    return [(dict(series_labels(name)), ts, vs) for name, (ts, vs) in samples().items()]

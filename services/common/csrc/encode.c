/* Readings as JSON numbers and DCDB CSV lines, in C and without the GIL.
 *
 * The query API's answers were formatted by orjson (shortest round-trip digits,
 * as Python's repr picks them) and numpy, both holding the GIL, so a 1M-point
 * answer could not overlap its formatting with the storage reads and socket
 * writes. These functions write the same bytes with the GIL released:
 *
 * - a double's digits by the Schubfach algorithm (R. Giulietti, "The Schubfach
 *   way to render doubles", 2020): the shortest decimal that reads back to the
 *   same double, the closest one when there are several; the 128-bit powers of
 *   ten it needs come from Python (services/common/native.py computes them
 *   exactly with integers); short decimals, what most sensors send (250.125),
 *   take a shortcut that gives the same digits without its 128-bit products;
 * - laid out as orjson lays them out: scientific (``1e+16``, ``1.5e-7``) when the
 *   decimal exponent is below -5 or at least 16, else positional with at least
 *   one fractional digit (``100.0``, ``0.00001``); non-finite values are
 *   ``null`` in JSON and empty in CSV (csv_lines refuses infinities, which
 *   the Python code writes as ``inf``);
 * - ISO 8601 times with nanoseconds or raw integers; what neighbouring readings share
 *   (a timestamp's leading digits, a time's date, hour and minute) is written once
 *   and copied while it lasts.
 *
 * services/common/native.py checks the layout against the installed orjson
 * before the query API uses it; the tests compare every byte with the Python paths.
 */
#include "native.h"

#include <math.h>
#include <string.h>

#ifdef __SIZEOF_INT128__
#define HAVE_U128 1
#else
#define HAVE_U128 0
#endif

#define POW10_MIN (-292)
#define POW10_MAX 324
#define POW10_COUNT (POW10_MAX - POW10_MIN + 1)
static uint64_t POW10_HI[POW10_COUNT], POW10_LO[POW10_COUNT];
static int pow10_ready = 0;

static const char DIGITS2[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* ------------------------------------------------------------------ integers */

/* Eight digits of x < 10^8 at p, zero-padded: lanes of one 64-bit word divided in
   parallel (two 4-digit halves, then 2-digit quarters, then digits). */
static inline void write8(char *p, uint32_t x) {
    uint64_t v = (uint64_t)(x / 10000) | ((uint64_t)(x % 10000) << 32);
    uint64_t q = ((v * 5243) >> 19) & 0x0000007F0000007FULL; /* lane / 100 (lanes < 10^4) */
    uint64_t w = q | ((v - 100 * q) << 16);                 /* 16-bit lanes < 100, in order */
    uint64_t t = ((w * 103) >> 10) & 0x000F000F000F000FULL;  /* lane / 10 (lanes < 100) */
    uint64_t out = t | ((w - 10 * t) << 8);
    out |= 0x3030303030303030ULL;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    out = __builtin_bswap64(out);
#endif
    memcpy(p, &out, 8);
}

/* The digits of x < 10^8 without leading zeros at p; returns the end. */
static inline char *write_small(char *p, uint32_t x) {
    char tmp[16];
    write8(tmp, x);
    int skip = x >= 10000000   ? 0
               : x >= 1000000  ? 1
               : x >= 100000   ? 2
               : x >= 10000    ? 3
               : x >= 1000     ? 4
               : x >= 100      ? 5
               : x >= 10       ? 6
                               : 7;
    memcpy(p, tmp + skip, 8); /* (the writers leave 8 bytes of room) */
    return p + 8 - skip;
}

/* The decimal digits of u at p; returns the end (writes up to 24 bytes). */
static inline char *write_u64(char *p, uint64_t u) {
    if (u < 100000000) return write_small(p, (uint32_t)u);
    if (u < 10000000000000000ULL) {
        p = write_small(p, (uint32_t)(u / 100000000));
        write8(p, (uint32_t)(u % 100000000));
        return p + 8;
    }
    uint64_t r = u % 10000000000000000ULL;
    p = write_small(p, (uint32_t)(u / 10000000000000000ULL));
    write8(p, (uint32_t)(r / 100000000));
    write8(p + 8, (uint32_t)(r % 100000000));
    return p + 16;
}

static inline char *write_i64(char *p, int64_t v) {
    uint64_t u = (uint64_t)v;
    if (v < 0) {
        *p++ = '-';
        u = 0 - u;
    }
    return write_u64(p, u);
}

/* ------------------------------------------------------------------ doubles */

#if HAVE_U128
static inline uint64_t round_to_odd(uint64_t g_hi, uint64_t g_lo, uint64_t cp) {
    unsigned __int128 x = (unsigned __int128)g_lo * cp;
    unsigned __int128 y = (unsigned __int128)g_hi * cp + (uint64_t)(x >> 64);
    uint64_t y0 = (uint64_t)y, y1 = (uint64_t)(y >> 64);
    return y1 | (y0 > 1);
}

/* floor(e * log10(2)), floor(log10(3/4 * 2^e)), floor(e * log2(10)) for the
   exponents of doubles (the shifts floor negative products: gcc shifts arithmetically) */
static inline int floor_log10_pow2(int e) { return (e * 315653) >> 20; }
static inline int floor_log10_three_quarters_pow2(int e) { return (e * 315653 - 131237) >> 20; }
static inline int floor_log2_pow10(int e) { return (e * 1741647) >> 19; }

/* A finite v > 0 (its bits) as d * 10^k with the fewest digits that read back to v. */
static void shortest(uint64_t bits, uint64_t *d, int *k) {
    uint64_t m = bits & ((1ULL << 52) - 1);
    int be = (int)((bits >> 52) & 0x7FF);
    uint64_t c;
    int q;
    if (be) {
        c = m | (1ULL << 52);
        q = be - 1075;
    } else {
        c = m;
        q = -1074;
    }
    uint64_t out;
    int e10;
    if (q <= 0 && q > -53 && ((c >> -q) << -q) == c) {
        out = c >> -q; /* an integer below 2^53: its own digits are the shortest */
        e10 = 0;
    } else {
        int even = (c & 1) == 0;
        int closer = m == 0 && be > 1;
        uint64_t cbl = 4 * c - 2 + (uint64_t)closer, cb = 4 * c, cbr = 4 * c + 2;
        int kk = closer ? floor_log10_three_quarters_pow2(q) : floor_log10_pow2(q);
        int h = q + floor_log2_pow10(-kk) + 1;
        uint64_t g_hi = POW10_HI[-kk - POW10_MIN], g_lo = POW10_LO[-kk - POW10_MIN];
        uint64_t vbl = round_to_odd(g_hi, g_lo, cbl << h);
        uint64_t vb = round_to_odd(g_hi, g_lo, cb << h);
        uint64_t vbr = round_to_odd(g_hi, g_lo, cbr << h);
        uint64_t lower = vbl + (uint64_t)!even, upper = vbr - (uint64_t)!even;
        uint64_t s = vb >> 2;
        out = 0;
        e10 = kk;
        int done = 0;
        if (s >= 10) {
            uint64_t sp = s / 10;
            int up_in = lower <= 40 * sp, wp_in = 40 * sp + 40 <= upper;
            if (up_in != wp_in) {
                out = sp + (uint64_t)wp_in;
                e10 = kk + 1;
                done = 1;
            }
        }
        if (!done) {
            int u_in = lower <= 4 * s, w_in = 4 * s + 4 <= upper;
            if (u_in != w_in) {
                out = s + (uint64_t)w_in;
            } else {
                uint64_t mid = 4 * s + 2;
                out = s + (uint64_t)(vb > mid || (vb == mid && (s & 1) != 0));
            }
        }
    }
    *d = out; /* (may end in zeros: the writer drops them) */
    *k = e10;
}
#endif

/* Most readings are short decimals (250.123, 21.5): then m = round(a * 10^6) is an
   integer below 10^15 that reads back as a (m / 10^6 is correctly rounded, as reading
   the decimal is). Decimals of at most 15 significant digits read back to distinct
   doubles, so m * 10^-6 is the only one of them that gives a, and Schubfach's shortest
   (it has no more digits) is the same number: its digits without the 128-bit products.
   a > 0 and finite. */
static inline int short_decimal(double a, uint64_t *d, int *k) {
    if (!(a < 1e9)) return 0;
    /* a * 10^6 + 0.5 is exact below 2^52, so the truncation rounds to nearest (signed
       conversions: one instruction each way) */
    int64_t m = (int64_t)(a * 1e6 + 0.5);
    if ((double)m / 1e6 != a) return 0;
    *d = (uint64_t)m; /* (trailing zeros: the writer drops them) */
    *k = -6;
    return 1;
}

/* ``ip.frac`` for ip < 10^8 and six fractional digits, trailing zeros dropped but one
   kept: orjson's positional layout, written straight from the two integers. */
static inline char *write_fixed6(char *p, uint32_t ip, uint32_t frac) {
    p = write_small(p, ip);
    *p = '.';
    if (frac == 0) {
        p[1] = '0';
        return p + 2;
    }
    char tmp[16] = {0};
    write8(tmp, frac); /* "00dddddd" */
    uint64_t w;
    memcpy(&w, tmp, 8);
    w ^= 0x3030303030303030ULL; /* zero bytes where the text has '0' (frac > 0: w != 0) */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    int zeros = __builtin_ctzll(w) / 8;
#else
    int zeros = __builtin_clzll(w) / 8;
#endif
    memcpy(p + 1, tmp + 2, 8);
    return p + 7 - zeros;
}

/* For each v: round(|v| * 10^6) when |v| is a decimal of at most six fractional digits
   in [1, 10^8) that reads back as |v| (short_decimal's test, positional range), else -1.
   A loop of its own without branches, so its long chain of rounding, conversion and
   division per value runs for many values at once instead of stalling each write
   (1M short decimals on this machine: JSON 11.7 -> 8.1 ms, CSV lines 18.1 -> 14.2). Adding 2^52 rounds to an integer held in the
   low mantissa bits (a * 10^6 < 2^52 wherever the test can pass); round-half-even
   and short_decimal's round-half-up differ only at halves, which fail the test. */
#define SHORT_BLOCK 256
static void positional6(const double *v, Py_ssize_t n, int64_t *m) {
    const double two52 = 4503599627370496.0;
    Py_ssize_t i = 0;
#if defined(__GNUC__)
    /* two lanes at a time (SSE2 on any x86-64; GCC 12 does not vectorise the loop below,
       and this measured ~3 % faster than it) */
    typedef double v2d __attribute__((vector_size(16)));
    typedef int64_t v2i __attribute__((vector_size(16)));
    for (; i + 2 <= n; i += 2) {
        v2d x;
        memcpy(&x, v + i, 16);
        v2d a = (v2d)((v2i)x & 0x7FFFFFFFFFFFFFFFLL);
        v2d t = a * 1e6 + two52;
        v2d r = t - two52;
        v2i ok = (r / 1e6 == a) & (r >= 1e6) & (r < 1e14);
        v2i out = (((v2i)t - 0x4330000000000000LL) & ok) | ~ok;
        memcpy(m + i, &out, 16);
    }
#endif
    for (; i < n; i++) {
        double a = fabs(v[i]);
        double t = a * 1e6 + two52;
        double r = t - two52;
        int64_t bits;
        memcpy(&bits, &t, 8);
        int ok = (r / 1e6 == a) & (r >= 1e6) & (r < 1e14);
        m[i] = ok ? bits - 0x4330000000000000LL : -1;
    }
}

/* ``ip.frac`` from x = ip * 10^4 + frac, ip in 1..9999, frac of four digits: one
   eight-digit conversion for both, the integer's leading and the fraction's trailing
   zeros dropped (one digit kept each), as write_fixed6 writes them. */
static inline char *write_fixed4(char *p, uint32_t x) {
    char tmp[16] = {0};
    write8(tmp, x);
    uint64_t w;
    memcpy(&w, tmp, 8);
    w ^= 0x3030303030303030ULL; /* zero bytes where the text has '0' (ip > 0: w != 0) */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    int lead = __builtin_clzll(w) / 8, trail = __builtin_ctzll(w) / 8;
#else
    int lead = __builtin_ctzll(w) / 8, trail = __builtin_clzll(w) / 8;
#endif
    if (trail > 3) trail = 3; /* (lead is at most three: ip >= 1) */
    memcpy(p, tmp + lead, 4);
    p += 4 - lead;
    *p = '.';
    memcpy(p + 1, tmp + 4, 4);
    return p + 5 - trail;
}

/* m * 10^-6 (10^6 <= m < 10^14) positionally; most sensors' values, below 10^4 with
   at most four decimals, in one conversion. */
static inline char *write_fixed(char *p, uint64_t m) {
    if (m < 10000000000ULL && m % 100 == 0) return write_fixed4(p, (uint32_t)(m / 100));
    return write_fixed6(p, (uint32_t)(m / 1000000), (uint32_t)(m % 1000000));
}

/* A value positional6 found: sign and fixed digits. */
static inline char *write_positional(char *p, double v, int64_t m) {
    if (signbit(v)) *p++ = '-';
    return write_fixed(p, (uint64_t)m);
}

/* v (finite) as orjson writes it; returns the end. At most 24 bytes, and it may
   write garbage up to 48 bytes past the end (the callers leave that room). */
static char *write_double(char *p, double v) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    if (bits >> 63) *p++ = '-';
    bits &= ~(1ULL << 63);
    if (bits == 0) {
        memcpy(p, "0.0", 3);
        return p + 3;
    }
    uint64_t d = 0;
    int k = 0;
    double a;
    memcpy(&a, &bits, 8);
    if (short_decimal(a, &d, &k)) {
        if (d >= 1000000 && d < 100000000000000ULL) /* 1 <= a < 10^8: positional */
            return write_fixed(p, d);
    } else {
#if HAVE_U128
        shortest(bits, &d, &k);
#endif
    }
    char tmp[64];
    memcpy(tmp, "00000000", 8); /* (read by the zero count, never written out) */
    char *first = tmp + 8;
    char *end = write_u64(first, d);
    /* trailing zeros off, counted on the text: '0' bytes at the end of a word */
    for (;;) {
        uint64_t w;
        memcpy(&w, end - 8, 8);
        w ^= 0x3030303030303030ULL;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        int zeros = w ? __builtin_ctzll(w) / 8 : 8;
#else
        int zeros = w ? __builtin_clzll(w) / 8 : 8;
#endif
        if (zeros > end - first - 1) zeros = (int)(end - first - 1); /* keep one digit */
        end -= zeros;
        k += zeros;
        if (zeros < 8) break;
    }
    int nd = (int)(end - first);
    int e = k + nd - 1; /* the scientific exponent */
    if (e < -5 || e >= 16) {
        *p++ = first[0];
        if (nd > 1) {
            *p++ = '.';
            memcpy(p, first + 1, 32);
            p += nd - 1;
        }
        *p++ = 'e';
        *p++ = e < 0 ? '-' : '+';
        return write_i64(p, e < 0 ? -e : e);
    }
    /* fixed-size copies (the callers leave 48 bytes of room past every value) */
    if (e >= nd - 1) { /* an integer: digits, zeros, ".0" */
        memcpy(p, first, 32);
        p += nd;
        memset(p, '0', 16); /* e < 16 */
        p += e - nd + 1;
        memcpy(p, ".0", 2);
        return p + 2;
    }
    if (e >= 0) {
        memcpy(p, first, 32);
        p[e + 1] = '.';
        memcpy(p + e + 2, first + e + 1, 32);
        return p + nd + 1;
    }
    memcpy(p, "0.00000", 8); /* e >= -5 */
    p += 1 - e;
    memcpy(p, first, 32);
    return p + nd;
}

/* ------------------------------------------------------------------ times */

/* Days since 1970-01-01 -> civil date (H. Hinnant's algorithm, proleptic Gregorian). */
static void civil(int64_t days, int64_t *y, unsigned *mo, unsigned *d) {
    int64_t z = days + 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (unsigned)(doy - (153 * mp + 2) / 5 + 1);
    *mo = (unsigned)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*mo <= 2);
}

typedef struct {
    int64_t day;
    char date[11]; /* YYYY-MM-DDT */
} DayCache;

/* ``YYYY-MM-DDTHH:MM:SS.fffffffffZ`` (30 bytes) */
static char *write_iso(char *p, int64_t t, DayCache *dc) {
    int64_t sec = t / 1000000000, frac = t % 1000000000;
    if (frac < 0) {
        frac += 1000000000;
        sec -= 1;
    }
    int64_t day = sec / 86400, sod = sec % 86400;
    if (sod < 0) {
        sod += 86400;
        day -= 1;
    }
    if (day != dc->day) {
        int64_t y;
        unsigned mo, d;
        civil(day, &y, &mo, &d);
        memcpy(dc->date, DIGITS2 + 2 * (y / 100), 2);
        memcpy(dc->date + 2, DIGITS2 + 2 * (y % 100), 2);
        dc->date[4] = '-';
        memcpy(dc->date + 5, DIGITS2 + 2 * mo, 2);
        dc->date[7] = '-';
        memcpy(dc->date + 8, DIGITS2 + 2 * d, 2);
        dc->date[10] = 'T';
        dc->day = day;
    }
    memcpy(p, dc->date, 11);
    p += 11;
    unsigned s = (unsigned)sod;
    memcpy(p, DIGITS2 + 2 * (s / 3600), 2);
    p[2] = ':';
    memcpy(p + 3, DIGITS2 + 2 * (s / 60 % 60), 2);
    p[5] = ':';
    memcpy(p + 6, DIGITS2 + 2 * (s % 60), 2);
    p[8] = '.';
    p += 9;
    uint32_t f = (uint32_t)frac;
    char *end = p + 9;
    for (int i = 0; i < 4; i++) {
        unsigned r = f % 100;
        f /= 100;
        end -= 2;
        memcpy(end, DIGITS2 + 2 * r, 2);
    }
    *p = (char)('0' + f);
    p += 9;
    *p++ = 'Z';
    return p;
}

/* write_iso for times at or after 1970, the text up to the minute kept from the last
   time in the same minute (readings a second apart share it for a minute). */
typedef struct {
    int64_t minute;
    char text[32]; /* YYYY-MM-DDTHH:MM: */
    DayCache dc;
} MinuteCache;

static inline char *write_iso_cached(char *p, int64_t t, MinuteCache *mc) {
    if (t < 0) return write_iso(p, t, &mc->dc);
    uint64_t sec = (uint64_t)t / 1000000000, frac = (uint64_t)t % 1000000000;
    uint64_t minute = sec / 60;
    unsigned s = (unsigned)(sec - minute * 60);
    if ((int64_t)minute != mc->minute) {
        char tmp[48];
        write_iso(tmp, t, &mc->dc);
        memcpy(mc->text, tmp, 17);
        mc->minute = (int64_t)minute;
    }
    memcpy(p, mc->text, 17);
    memcpy(p + 17, DIGITS2 + 2 * s, 2);
    if (frac == 0) { /* readings on whole seconds (most sensors): no digits to work out */
        memcpy(p + 19, ".000000000Z", 11);
        return p + 30;
    }
    p[19] = '.';
    p[20] = (char)('0' + frac / 100000000);
    write8(p + 21, (uint32_t)(frac % 100000000));
    p[29] = 'Z';
    return p + 30;
}

/* ------------------------------------------------------------------ entry points */

static int get_arrays(PyObject *ts_o, PyObject *vs_o, Py_buffer *ts, Py_buffer *vs) {
    if (PyObject_GetBuffer(ts_o, ts, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (PyObject_GetBuffer(vs_o, vs, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(ts);
        return -1;
    }
    if (ts->itemsize != 8 || vs->itemsize != 8 || ts->len != vs->len) {
        PyBuffer_Release(ts);
        PyBuffer_Release(vs);
        PyErr_SetString(PyExc_ValueError, "int64 timestamps and float64 values of one length");
        return -1;
    }
    return 0;
}

static int need_tables(void) {
    if (pow10_ready) return 0;
    PyErr_SetString(PyExc_RuntimeError, "init_pow10() was not called");
    return -1;
}

/* json_numbers(array, floats) -> (buffer, used): an int64 (floats false) or float64
   array's numbers joined by commas in the buffer's first ``used`` bytes, written
   without the GIL. */
static PyObject *json_numbers(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *arr;
    int floats;
    if (!PyArg_ParseTuple(args, "Op", &arr, &floats) || need_tables() < 0) return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(arr, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    const char *fmt = b.format ? b.format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
    int ok = b.itemsize == 8 && (floats ? strcmp(fmt, "d") == 0
                                        : (strcmp(fmt, "q") == 0 || strcmp(fmt, "l") == 0));
    if (!ok) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "a C-contiguous int64 or float64 array");
        return NULL;
    }
    Py_ssize_t n = b.len / 8;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 25 + 64);
    if (out == NULL) {
        PyBuffer_Release(&b);
        return NULL;
    }
    char *p = PyBytes_AS_STRING(out), *p0 = p;
    Py_BEGIN_ALLOW_THREADS;
    if (floats) {
        const double *v = b.buf;
        int64_t m[SHORT_BLOCK];
        for (Py_ssize_t i0 = 0; i0 < n; i0 += SHORT_BLOCK) {
            Py_ssize_t k = n - i0 < SHORT_BLOCK ? n - i0 : SHORT_BLOCK;
            positional6(v + i0, k, m);
            for (Py_ssize_t j = 0; j < k; j++) {
                double x = v[i0 + j];
                if (m[j] >= 0) {
                    p = write_positional(p, x, m[j]);
                } else if (isfinite(x)) {
                    p = write_double(p, x);
                } else {
                    memcpy(p, "null", 4);
                    p += 4;
                }
                *p++ = ',';
            }
        }
    } else {
        /* Timestamps in ns share their leading digits with their neighbours: the digits
           above the last ten are written once per change, not per number. */
        const int64_t *t = b.buf;
        uint64_t hi_of = UINT64_MAX;
        char hi[32] = {0};
        int hi_len = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t v = t[i];
            if (v >= 10000000000LL) {
                uint64_t u = (uint64_t)v, top = u / 10000000000ULL, low = u - top * 10000000000ULL;
                if (top != hi_of) {
                    hi_len = (int)(write_u64(hi, top) - hi);
                    hi_of = top;
                }
                memcpy(p, hi, 16); /* (hi_len <= 9; the buffer has room) */
                p += hi_len;
                memcpy(p, DIGITS2 + 2 * (low / 100000000), 2);
                write8(p + 2, (uint32_t)(low % 100000000));
                p += 10;
            } else {
                p = write_i64(p, v);
            }
            *p++ = ',';
        }
    }
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&b);
    /* Not shrunk to fit: the caller takes a view of the first ``used`` bytes. A shrunk
       block is freed smaller than the next answer asks for, so malloc maps fresh pages
       for every answer (their faults cost as much as writing the digits); one freed
       whole is handed out again. (The last comma is not counted.) */
    return Py_BuildValue("(Nn)", out, (Py_ssize_t)(p - p0 - (n > 0)));
}

/* csv_lines(prefix, ts, vs, iso, max_len) -> bytes | None: ``prefix time,value\n`` per
   reading (NaN: an empty value); None for what the Python code writes instead (a
   value infinite or longer than ``max_len`` bytes: csvfast.py's slow path). */
static PyObject *csv_lines(PyObject *Py_UNUSED(module), PyObject *args) {
    const char *prefix;
    Py_ssize_t plen, max_len;
    PyObject *ts_o, *vs_o;
    int iso;
    if (!PyArg_ParseTuple(args, "y#OOpn", &prefix, &plen, &ts_o, &vs_o, &iso, &max_len) ||
        need_tables() < 0)
        return NULL;
    Py_buffer tb, vb;
    if (get_arrays(ts_o, vs_o, &tb, &vb) < 0) return NULL;
    Py_ssize_t n = tb.len / 8;
    const int64_t *t = tb.buf;
    const double *v = vb.buf;
    PyObject *out = NULL;
    int refuse = 0; /* (every int64 of ns is within years 1677..2262: ISO always fits) */
    for (Py_ssize_t i = 0; i < n && !refuse; i++) refuse = isinf(v[i]);
    if (refuse) {
        PyBuffer_Release(&tb);
        PyBuffer_Release(&vb);
        Py_RETURN_NONE;
    }
    out = PyBytes_FromStringAndSize(NULL, n * (plen + 30 + 1 + 24 + 1) + 64);
    if (out == NULL) {
        PyBuffer_Release(&tb);
        PyBuffer_Release(&vb);
        return NULL;
    }
    char *p = PyBytes_AS_STRING(out), *p0 = p;
    MinuteCache mc = {INT64_MIN, {0}, {INT64_MIN, {0}}};
    char head[32] = {0}; /* a short prefix is copied as one fixed-size block */
    int short_prefix = plen <= (Py_ssize_t)sizeof head;
    if (short_prefix) memcpy(head, prefix, (size_t)plen);
    Py_BEGIN_ALLOW_THREADS;
    int64_t m[SHORT_BLOCK];
    for (Py_ssize_t i0 = 0; i0 < n && !refuse; i0 += SHORT_BLOCK) {
        Py_ssize_t k = n - i0 < SHORT_BLOCK ? n - i0 : SHORT_BLOCK;
        positional6(v + i0, k, m);
        for (Py_ssize_t j = 0; j < k; j++) {
            Py_ssize_t i = i0 + j;
            if (short_prefix) /* (garbage past plen is overwritten; 64 bytes of room) */
                memcpy(p, head, sizeof head);
            else
                memcpy(p, prefix, (size_t)plen);
            p += plen;
            p = iso ? write_iso_cached(p, t[i], &mc) : write_i64(p, t[i]);
            *p++ = ',';
            if (!isnan(v[i])) {
                char *start = p;
                p = m[j] >= 0 ? write_positional(p, v[i], m[j]) : write_double(p, v[i]);
                if (p - start > max_len) {
                    refuse = 1;
                    break;
                }
            }
            *p++ = '\n';
        }
    }
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&tb);
    PyBuffer_Release(&vb);
    if (refuse) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    if (_PyBytes_Resize(&out, p - p0) < 0) return NULL;
    return out;
}

/* init_pow10(table: bytes): 617 (hi, lo) little-endian pairs, g(e) for e = -292..324 */
static PyObject *init_pow10(PyObject *Py_UNUSED(module), PyObject *args) {
    const char *buf;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "y#", &buf, &len)) return NULL;
    if (len != POW10_COUNT * 16) {
        PyErr_Format(PyExc_ValueError, "expected %d bytes", POW10_COUNT * 16);
        return NULL;
    }
    for (int i = 0; i < POW10_COUNT; i++) {
        memcpy(&POW10_HI[i], buf + 16 * i, 8);
        memcpy(&POW10_LO[i], buf + 16 * i + 8, 8);
    }
    pow10_ready = 1;
    Py_RETURN_NONE;
}

/* format_double(v) -> str: one double as the encoders write it (for tests). */
static PyObject *format_double(PyObject *Py_UNUSED(module), PyObject *arg) {
    double v = PyFloat_AsDouble(arg);
    if (v == -1.0 && PyErr_Occurred()) return NULL;
    if (need_tables() < 0) return NULL;
    if (!isfinite(v)) return PyUnicode_FromString("null");
    char buf[96];
    char *end = write_double(buf, v);
    return PyUnicode_FromStringAndSize(buf, end - buf);
}

static PyMethodDef encode_methods[] = {
    {"json_numbers", json_numbers, METH_VARARGS,
     "json_numbers(array, floats) -> (buffer, used): JSON numbers joined by commas, no GIL held"},
    {"csv_lines", csv_lines, METH_VARARGS,
     "csv_lines(prefix, ts, vs, iso) -> bytes | None: DCDB CSV lines, no GIL held"},
    {"init_pow10", init_pow10, METH_VARARGS, "init_pow10(table): Schubfach's powers of ten"},
    {"format_double", format_double, METH_O, "format_double(v) -> str"},
    {NULL, NULL, 0, NULL},
};

int encode_init(PyObject *module) {
    if (PyModule_AddIntConstant(module, "HAVE_DOUBLES", HAVE_U128) < 0) return -1;
    return PyModule_AddFunctions(module, encode_methods);
}

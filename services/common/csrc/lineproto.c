/* The line-protocol fast path in C: whole /write bodies, one pass per line.
 *
 * The same job as services/collect_agent/line_protocol/fast.py (the numpy
 * parser, kept as the fallback): take the plain lines exactly as InfluxDB 1.6's
 * rules would (scan.py is the reference), hand every other line, with its line
 * number and the lines it swallows, back to the reference parser. A line is
 * taken only if it is
 *
 *     measurement(,tagkey=tagvalue)* SP field=value(,field=value)* [SP digits]
 *
 * with no backslash, tab or NUL, no empty token, no '=' or '"' in a name, quotes
 * only around a whole string value (opening right after '=', closing right
 * before ',', a space or the line's end), numbers the reference would read to
 * the same double, and a series and fields the reference names the same way
 * (the Python callbacks decide that the first time a series or field is seen;
 * their answers are kept in two hash tables). For such a line InfluxDB's
 * scanner pairs the quotes as they look and no newline is quoted, so the line
 * ends at its first newline. Every other line takes the general path: its end
 * is found by InfluxDB's own scanning rule (line_end), as the reference does.
 *
 * Floats: up to 19 mantissa digits and a power of ten within 10^22 are one
 * exact IEEE multiplication or division of two exact doubles (correctly
 * rounded); everything else goes through PyOS_string_to_double, the function
 * behind Python's float(), so every value is bit for bit float(token).
 */
#include "native.h"

#include <math.h>
#include <string.h>

/* byte classes outside quotes */
enum { K_TEXT, K_SP, K_COMMA, K_EQ, K_NL, K_QUOTE, K_BAD };
static unsigned char KIND[256];
/* inside a quoted string value: 0 text, 1 the closing quote, 2 what the fast path leaves */
static unsigned char IN_QUOTES[256];

static const double POW10[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

#if defined(__FLT_EVAL_METHOD__) && __FLT_EVAL_METHOD__ != 0
#define EXACT_DOUBLES 0 /* extended-precision arithmetic would round twice */
#else
#define EXACT_DOUBLES 1
#endif

#define MAX_KEY 1024   /* longest series key the tables keep; longer lines go to the reference */
#define MAX_FIELD 256  /* longest field key they keep */
#define MAX_ARENA ((size_t)64 << 20)

/* ------------------------------------------------------------------ hash tables */

#define INLINE_KEY 32

typedef struct {
    uint64_t hash; /* 0: empty */
    PyObject *value;
    /* series: the name head (str) or NULL when the reference must take its lines;
       field: the sensor name (str) or NULL likewise */
    uint32_t off, len; /* the whole key in the arena */
    int32_t owner;     /* field entries: the series' id; series entries: -1 */
    int32_t id;        /* series entries: the series' id */
    unsigned char head[INLINE_KEY]; /* its first bytes: most keys compare without the arena */
} Slot;                             /* 64 bytes, one cache line */

typedef struct {
    Slot *slots;
    size_t mask;
    size_t used;
} Table;

typedef struct {
    PyObject_HEAD
    Table series, fields;
    unsigned char *arena;
    size_t alen, acap;
    int32_t nseries;
    int busy; /* a parse is under way: the callbacks run Python code, which must not
                 parse with or clear these tables (their slots and names are in use) */
    uint64_t seed;
    PyObject *head_fn; /* key bytes -> str | None */
    PyObject *name_fn; /* (head, field bytes) -> str | None */
} LineTables;

static uint64_t hash_bytes(uint64_t h, const unsigned char *p, size_t n) {
    size_t len = n;
    h ^= (uint64_t)n * 0x9E3779B97F4A7C15ULL;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    if (n) { /* the last word: overlapping the one before it, or byte by byte when short */
        uint64_t w = 0;
        if (len >= 8) {
            memcpy(&w, p + n - 8, 8);
        } else {
            for (size_t j = 0; j < n; j++) w |= (uint64_t)p[j] << (8 * j);
        }
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
    }
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ULL;
    h ^= h >> 32;
    return h ? h : 1;
}

static Slot *slots_new(size_t cap) {
    Slot *slots = aligned_alloc(64, cap * sizeof(Slot)); /* a slot per cache line */
    if (slots == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memset(slots, 0, cap * sizeof(Slot));
    return slots;
}

static int table_init(Table *t, size_t cap) {
    t->slots = slots_new(cap);
    if (t->slots == NULL) return -1;
    t->mask = cap - 1;
    t->used = 0;
    return 0;
}

static void table_free(Table *t) {
    if (t->slots == NULL) return;
    for (size_t i = 0; i <= t->mask; i++) Py_CLEAR(t->slots[i].value);
    free(t->slots);
    t->slots = NULL;
    t->used = 0;
}

static inline void table_prefetch(const Table *t, uint64_t h) {
    __builtin_prefetch(&t->slots[h & t->mask]);
}

static Slot *table_find(Table *t, const unsigned char *arena, uint64_t h, int32_t owner,
                        const unsigned char *key, uint32_t len) {
    size_t i = h & t->mask;
    uint32_t in = len < INLINE_KEY ? len : INLINE_KEY;
    for (;;) {
        Slot *s = &t->slots[i];
        if (s->hash == 0) return s;
        if (s->hash == h && s->len == len && s->owner == owner &&
            memcmp(s->head, key, in) == 0 &&
            (len <= INLINE_KEY ||
             memcmp(arena + s->off + INLINE_KEY, key + INLINE_KEY, len - INLINE_KEY) == 0))
            return s;
        i = (i + 1) & t->mask;
    }
}

static int table_grow(Table *t) {
    size_t cap = 2 * (t->mask + 1);
    Slot *old = t->slots;
    size_t old_cap = t->mask + 1;
    Slot *slots = slots_new(cap);
    if (slots == NULL) return -1;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].hash == 0) continue;
        size_t j = old[i].hash & (cap - 1);
        while (slots[j].hash) j = (j + 1) & (cap - 1);
        slots[j] = old[i];
    }
    free(old);
    t->slots = slots;
    t->mask = cap - 1;
    return 0;
}

/* A new entry in the empty slot ``s`` found for (h, owner, key); returns the slot
   (it moves when the table grows) or NULL on error. */
static Slot *table_put(LineTables *self, Table *t, Slot *s, uint64_t h, int32_t owner,
                       const unsigned char *key, uint32_t len, PyObject *value) {
    if (self->alen + len > self->acap) {
        size_t cap = self->acap ? 2 * self->acap : 1 << 16;
        while (cap < self->alen + len) cap *= 2;
        unsigned char *arena = PyMem_Realloc(self->arena, cap);
        if (arena == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        self->arena = arena;
        self->acap = cap;
    }
    memcpy(self->arena + self->alen, key, len);
    memcpy(s->head, key, len < INLINE_KEY ? len : INLINE_KEY);
    s->hash = h;
    s->off = (uint32_t)self->alen;
    s->len = len;
    s->owner = owner;
    s->id = owner < 0 ? self->nseries++ : -1;
    Py_XINCREF(value);
    s->value = value;
    self->alen += len;
    t->used++;
    if (2 * t->used > t->mask + 1) {
        if (table_grow(t) < 0) return NULL;
        return table_find(t, self->arena, h, owner, key, len);
    }
    return s;
}

static int tables_reset(LineTables *self) {
    table_free(&self->series);
    table_free(&self->fields);
    self->alen = 0;
    self->nseries = 0;
    if (table_init(&self->series, 1024) < 0) return -1;
    return table_init(&self->fields, 1024);
}

/* ------------------------------------------------------------------ tokens */

static int parse_integer(const unsigned char *p, Py_ssize_t len, double *out) {
    /* -?digits followed by i, or digits followed by u; up to 18 digits */
    unsigned char suffix = p[len - 1];
    const unsigned char *q = p + len - 1;
    int neg = 0;
    if (*p == '-') {
        if (suffix == 'u') return 0; /* the reference decides "-5u" */
        neg = 1;
        p++;
    }
    Py_ssize_t nd = q - p;
    if (nd < 1 || nd > 18) return 0;
    int64_t m = 0;
    for (; p < q; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (d > 9) return 0;
        m = m * 10 + d;
    }
    *out = (double)(neg ? -m : m);
    return 1;
}

static int parse_float(const unsigned char *s, Py_ssize_t len, double *out) {
    const unsigned char *p = s, *end = s + len;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    uint64_t m = 0;
    int nd = 0, nf = 0;
    while (p < end && (unsigned)(*p - '0') < 10) {
        m = m * 10 + (unsigned)(*p - '0');
        nd++;
        p++;
    }
    if (p < end && *p == '.') {
        p++;
        while (p < end && (unsigned)(*p - '0') < 10) {
            m = m * 10 + (unsigned)(*p - '0');
            nd++;
            nf++;
            p++;
        }
    }
    if (nd == 0) return 0;
    int e = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) {
            eneg = *p == '-';
            p++;
        }
        int ed = 0;
        while (p < end && (unsigned)(*p - '0') < 10) {
            if (e < 100000) e = e * 10 + (*p - '0');
            ed++;
            p++;
        }
        if (!ed) return 0;
        if (eneg) e = -e;
    }
    if (p != end) return 0;
    if (EXACT_DOUBLES && nd <= 19) {
        int e10 = e - nf;
        if (m == 0) {
            *out = neg ? -0.0 : 0.0;
            return 1;
        }
        if (m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
            double v = (double)m;
            v = e10 < 0 ? v / POW10[-e10] : v * POW10[e10];
            *out = neg ? -v : v;
            return 1;
        }
    }
    char buf[64];
    if (len >= (Py_ssize_t)sizeof buf) return 0;
    memcpy(buf, s, (size_t)len);
    buf[len] = 0;
    char *stop = NULL;
    double v = PyOS_string_to_double(buf, &stop, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (stop != buf + len || isinf(v)) return 0;
    *out = v;
    return 1;
}

static int parse_value(const unsigned char *p, Py_ssize_t len, double *out) {
    unsigned char c = p[0];
    if ((unsigned)(c - '0') < 10 || c == '-' || c == '.') {
        unsigned char last = p[len - 1];
        if (last == 'i' || last == 'u') return parse_integer(p, len, out);
        return parse_float(p, len, out);
    }
    switch (len) {
    case 1:
        if (c == 't' || c == 'T') return *out = 1.0, 1;
        if (c == 'f' || c == 'F') return *out = 0.0, 1;
        return 0;
    case 4:
        if (!memcmp(p, "true", 4) || !memcmp(p, "True", 4) || !memcmp(p, "TRUE", 4))
            return *out = 1.0, 1;
        return 0;
    case 5:
        if (!memcmp(p, "false", 5) || !memcmp(p, "False", 5) || !memcmp(p, "FALSE", 5))
            return *out = 0.0, 1;
        return 0;
    }
    return 0;
}

/* InfluxDB's scanner: where the line starting at i ends (scan.line_end). */
static Py_ssize_t line_end(const unsigned char *b, Py_ssize_t n, Py_ssize_t i) {
    int quoted = 0, fields = 0;
    Py_ssize_t equals = 0, commas = 0;
    while (i < n) {
        unsigned char c = b[i];
        if (c == '\\' && i + 2 < n) {
            i += 2;
            continue;
        }
        if (c == ' ') fields = 1;
        if (fields) {
            if (!quoted && c == '=') {
                equals++;
                i++;
                continue;
            }
            if (!quoted && c == ',') {
                commas++;
                i++;
                continue;
            }
            if (c == '"' && equals > commas) {
                quoted = !quoted;
                i++;
                continue;
            }
        }
        if (c == '\n' && !quoted) break;
        i++;
    }
    return i;
}

/* ------------------------------------------------------------------ output */

typedef struct {
    int64_t *ts, *line;
    double *vs;
    PyObject **names; /* borrowed from the tables (not cleared during a parse) */
    size_t n, cap;
} Out;

static int out_room(Out *o) {
    if (o->n < o->cap) return 0;
    size_t cap = o->cap ? 2 * o->cap : 4096;
    int64_t *ts = PyMem_Realloc(o->ts, cap * sizeof *ts);
    if (ts) o->ts = ts;
    int64_t *line = PyMem_Realloc(o->line, cap * sizeof *line);
    if (line) o->line = line;
    double *vs = PyMem_Realloc(o->vs, cap * sizeof *vs);
    if (vs) o->vs = vs;
    PyObject **names = PyMem_Realloc(o->names, cap * sizeof *names);
    if (names) o->names = names;
    if (!ts || !line || !vs || !names) {
        PyErr_NoMemory();
        return -1;
    }
    o->cap = cap;
    return 0;
}

static void out_free(Out *o) {
    PyMem_Free(o->ts);
    PyMem_Free(o->line);
    PyMem_Free(o->vs);
    PyMem_Free(o->names);
}

/* ------------------------------------------------------------------ one line */

enum { TAKEN, PUNT, FAILED };

typedef struct {
    const unsigned char *b; /* the body; b[n] is the NUL every bytes object ends with */
    Py_ssize_t n;
    long long scale, default_ns;
    unsigned long long max_stamp;
} Body;

typedef struct {
    Py_ssize_t at, len; /* the last timestamp converted: where its digits are */
    long long ns;
} Stamp;

/* Whether the 8 bytes at p are all ASCII digits. */
static inline int all_digits(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return (w & 0xF0F0F0F0F0F0F0F0ULL) == 0x3030303030303030ULL &&
           ((w + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) == 0x3030303030303030ULL;
}

/* 1 to 19 ASCII digits as an integer, eight at a time where they fit a word. */
static uint64_t digits(const unsigned char *p, Py_ssize_t len) {
    uint64_t v = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w -= 0x3030303030303030ULL;
        w = (w * 10) + (w >> 8); /* pairs of digits in every other byte */
        w = (((w & 0x000000FF000000FFULL) * (100 + (1000000ULL << 32))) +
             (((w >> 16) & 0x000000FF000000FFULL) * (1 + (10000ULL << 32)))) >>
            32;
        v = v * 100000000ULL + (uint32_t)w;
        p += 8;
        len -= 8;
    }
#endif
    while (len-- > 0) v = v * 10 + (unsigned)(*p++ - '0');
    return v;
}

static inline uint64_t series_hash(const LineTables *self, const unsigned char *key,
                                   Py_ssize_t len) {
    return hash_bytes(self->seed, key, (size_t)len);
}

/* A field's hash from its series' key hash and its own bytes (so it can be known, and
   its slot fetched, before the series is looked up). */
static inline uint64_t field_hash(uint64_t series_h, const unsigned char *key, Py_ssize_t len) {
    return hash_bytes(series_h * 0xC2B2AE3D27D4EB4FULL + 0x165667B19E3779F9ULL, key, (size_t)len);
}

static Slot *series_of(LineTables *self, uint64_t h, const unsigned char *key, Py_ssize_t len) {
    Slot *s = table_find(&self->series, self->arena, h, -1, key, (uint32_t)len);
    if (s->hash) return s;
    PyObject *raw = PyBytes_FromStringAndSize((const char *)key, len);
    if (raw == NULL) return NULL;
    PyObject *head = PyObject_CallOneArg(self->head_fn, raw);
    Py_DECREF(raw);
    if (head == NULL) return NULL;
    Slot *got = table_put(self, &self->series, s, h, -1, key, (uint32_t)len,
                          head == Py_None ? NULL : head);
    Py_DECREF(head);
    return got;
}

static Slot *field_of(LineTables *self, Slot *series, uint64_t h, const unsigned char *key,
                      Py_ssize_t len) {
    int32_t owner = series->id;
    Slot *s = table_find(&self->fields, self->arena, h, owner, key, (uint32_t)len);
    if (s->hash) return s;
    PyObject *head = series->value;
    Py_INCREF(head);
    PyObject *raw = PyBytes_FromStringAndSize((const char *)key, len);
    if (raw == NULL) {
        Py_DECREF(head);
        return NULL;
    }
    PyObject *name = PyObject_CallFunctionObjArgs(self->name_fn, head, raw, NULL);
    Py_DECREF(raw);
    Py_DECREF(head);
    if (name == NULL) return NULL;
    Slot *got = table_put(self, &self->fields, s, h, owner, key, (uint32_t)len,
                          name == Py_None ? NULL : name);
    Py_DECREF(name);
    return got;
}

/* What the scan of a line found, for the lookups that follow (see LineTables_parse). */
typedef struct {
    long long lineno, ts;
    Py_ssize_t pos, key_len, end; /* end: its newline (or the body's end) */
    uint64_t h;                   /* its series key's hash */
    Py_ssize_t first, count;      /* its numeric fields in the field records */
    Py_ssize_t strings;
} LineRec;

typedef struct {
    Py_ssize_t k0, klen;
    uint64_t h;
    double v;
} FieldRec;

#define BLOCK 256 /* lines scanned, and their slots fetched, before they are looked up */

typedef struct {
    LineRec lines[BLOCK];
    FieldRec *fields;
    Py_ssize_t nlines, nfields, fcap;
} Block;

static int block_field(Block *bl, FieldRec **f) {
    if (bl->nfields == bl->fcap) {
        Py_ssize_t cap = bl->fcap ? 2 * bl->fcap : 1024;
        FieldRec *fields = PyMem_Realloc(bl->fields, (size_t)cap * sizeof *fields);
        if (fields == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        bl->fields = fields;
        bl->fcap = cap;
    }
    *f = &bl->fields[bl->nfields++];
    return 0;
}

/* Scan the line at ``pos``: on TAKEN its record (and its fields') is the next of the
   block and *at is its newline (or n); on PUNT *at is where the scan stopped (within
   the line). The series and field tables are not consulted yet; their slots are
   fetched into the cache for the lookups that follow. */
static int scan_line(LineTables *self, const Body *bd, Py_ssize_t pos, long long lineno,
                     Block *bl, Py_ssize_t *at, Stamp *stamp) {
    const unsigned char *b = bd->b;
    Py_ssize_t n = bd->n, i = pos;
    Py_ssize_t mark = bl->nfields;
    int k;
#define STOP(where)             \
    do {                        \
        *at = (where);          \
        bl->nfields = mark;     \
        return PUNT;            \
    } while (0)
#define KIND_AT(j) ((j) == n ? K_NL : KIND[b[j]])
    while (KIND[b[i]] == K_TEXT) i++;
    if (i == pos) STOP(i);
    k = KIND_AT(i);
    while (k == K_COMMA) {
        Py_ssize_t k0 = ++i;
        while (KIND[b[i]] == K_TEXT) i++;
        if (i == k0 || KIND_AT(i) != K_EQ) STOP(i);
        Py_ssize_t v0 = ++i;
        while (KIND[b[i]] == K_TEXT) i++;
        if (i == v0) STOP(i);
        k = KIND_AT(i);
    }
    if (k != K_SP || i - pos > MAX_KEY) STOP(i);
    LineRec *rec = &bl->lines[bl->nlines];
    rec->lineno = lineno;
    rec->pos = pos;
    rec->key_len = i - pos;
    rec->h = series_hash(self, b + pos, i - pos);
    table_prefetch(&self->series, rec->h);
    rec->first = mark;
    rec->strings = 0;
    i++;
    for (;;) {
        Py_ssize_t k0 = i;
        while (KIND[b[i]] == K_TEXT) i++;
        Py_ssize_t klen = i - k0;
        if (klen == 0 || KIND_AT(i) != K_EQ || klen > MAX_FIELD) STOP(i);
        if (klen == 4 && memcmp(b + k0, "time", 4) == 0) STOP(i); /* skipped by InfluxDB */
        i++;
        if (i < n && b[i] == '"') {
            Py_ssize_t j = i + 1;
            while (IN_QUOTES[b[j]] == 0) j++;
            if (j == n || b[j] != '"') STOP(j);
            i = j + 1;
            rec->strings++;
        } else {
            Py_ssize_t v0 = i;
            while (KIND[b[i]] == K_TEXT) i++;
            double v;
            if (i == v0 || !parse_value(b + v0, i - v0, &v)) STOP(i);
            FieldRec *f;
            if (block_field(bl, &f) < 0) return FAILED;
            f->k0 = k0;
            f->klen = klen;
            f->h = field_hash(rec->h, b + k0, klen);
            f->v = v;
            table_prefetch(&self->fields, f->h);
        }
        k = KIND_AT(i);
        if (k != K_COMMA) break;
        i++;
    }
    long long ts = bd->default_ns;
    if (k == K_SP) {
        Py_ssize_t t0 = ++i;
        while (i + 8 <= n && all_digits(b + i)) i += 8;
        while ((unsigned)(b[i] - '0') < 10) i++; /* (b[n] is NUL) */
        Py_ssize_t len = i - t0;
        if (len == 0 || len > 19 || KIND_AT(i) != K_NL) STOP(i);
        if (len == stamp->len && memcmp(b + t0, b + stamp->at, (size_t)len) == 0) {
            ts = stamp->ns; /* lines sampled together: the same stamp as the line before */
        } else {
            uint64_t v = digits(b + t0, len);
            if (v > bd->max_stamp) STOP(i);
            ts = (long long)v * bd->scale;
            stamp->at = t0;
            stamp->len = len;
            stamp->ns = ts;
        }
    } else if (k != K_NL) {
        STOP(i);
    }
    rec->ts = ts;
    rec->end = i;
    rec->count = bl->nfields - mark;
    bl->nlines++;
    *at = i;
    return TAKEN;
#undef STOP
#undef KIND_AT
}

/* Look up the series and fields of the block's lines (their slots fetched by the scan)
   and write the readings of every line whose names the fast path has; the others go to
   ``rest`` for the reference parser. */
static int resolve_block(LineTables *self, const Body *bd, Block *bl, Out *out,
                         PyObject *rest, Py_ssize_t *lines, Py_ssize_t *strings) {
    const unsigned char *b = bd->b;
    for (Py_ssize_t li = 0; li < bl->nlines; li++) {
        LineRec *rec = &bl->lines[li];
        Slot *series = series_of(self, rec->h, b + rec->pos, rec->key_len);
        if (series == NULL) return -1;
        int ok = series->value != NULL;
        size_t mark = out->n;
        for (Py_ssize_t j = 0; ok && j < rec->count; j++) {
            FieldRec *f = &bl->fields[rec->first + j];
            Slot *slot = field_of(self, series, f->h, b + f->k0, f->klen);
            if (slot == NULL) return -1;
            if (slot->value == NULL) {
                ok = 0;
                break;
            }
            if (out_room(out) < 0) return -1;
            __builtin_prefetch(slot->value, 1); /* its reference count, when listed */
            out->names[out->n] = slot->value;
            out->vs[out->n] = f->v;
            out->ts[out->n] = rec->ts;
            out->line[out->n] = rec->lineno;
            out->n++;
        }
        if (ok) {
            ++*lines;
            *strings += rec->strings;
            continue;
        }
        out->n = mark;
        PyObject *item = Py_BuildValue("(Lnn)", rec->lineno, rec->pos, rec->end);
        if (item == NULL || PyList_Append(rest, item) < 0) {
            Py_XDECREF(item);
            return -1;
        }
        Py_DECREF(item);
    }
    bl->nlines = bl->nfields = 0;
    return 0;
}

static Py_ssize_t skip_whitespace(const unsigned char *b, Py_ssize_t n, Py_ssize_t i) {
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == 0)) i++;
    return i;
}

static Py_ssize_t count_newlines(const unsigned char *b, Py_ssize_t a, Py_ssize_t e) {
    Py_ssize_t c = 0;
    while (a < e) {
        const unsigned char *nl = memchr(b + a, '\n', (size_t)(e - a));
        if (nl == NULL) break;
        c++;
        a = nl - b + 1;
    }
    return c;
}

/* ------------------------------------------------------------------ the type */

static PyObject *LineTables_parse(LineTables *self, PyObject *args) {
    PyObject *body_obj;
    long long scale, default_ns;
    unsigned long long max_stamp;
    Py_ssize_t max_entries;
    if (!PyArg_ParseTuple(args, "SLLKn", &body_obj, &scale, &default_ns, &max_stamp,
                          &max_entries))
        return NULL;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "LineTables.parse called during a parse");
        return NULL;
    }
    if ((Py_ssize_t)(self->series.used + self->fields.used) > max_entries ||
        self->alen > MAX_ARENA) {
        if (tables_reset(self) < 0) return NULL;
    }
    Body bd = {(const unsigned char *)PyBytes_AS_STRING(body_obj), PyBytes_GET_SIZE(body_obj),
               scale, default_ns, max_stamp};
    const unsigned char *b = bd.b;
    Py_ssize_t n = bd.n, pos = 0, lines = 0, strings = 0;
    long long lineno = 1;
    Out out = {0};
    Stamp stamp = {0, 0, 0};
    Block *bl = PyMem_Calloc(1, sizeof(Block));
    PyObject *rest = PyList_New(0), *result = NULL;
    if (rest == NULL || bl == NULL) {
        Py_XDECREF(rest);
        PyMem_Free(bl);
        return PyErr_NoMemory();
    }
    Py_INCREF(body_obj); /* a callback must not free it under us */
    self->busy = 1;
    while (pos < n) {
        if (bl->nlines == BLOCK && resolve_block(self, &bd, bl, &out, rest, &lines, &strings) < 0)
            goto done;
        unsigned char c0 = b[pos];
        if (c0 == '\n') {
            lineno++;
            pos++;
            continue;
        }
        Py_ssize_t at = pos;
        int r = PUNT;
        if (KIND[c0] == K_TEXT && c0 != '#') {
            r = scan_line(self, &bd, pos, lineno, bl, &at, &stamp);
            if (r == FAILED) goto done;
        }
        if (r == TAKEN) {
            lineno++;
            pos = at + 1;
            continue;
        }
        /* the general path: the reference parser decides this line */
        const unsigned char *nl = memchr(b + at, '\n', (size_t)(n - at));
        Py_ssize_t e = nl ? nl - b : n, end = e;
        if (memchr(b + pos, '\\', (size_t)(e - pos)) || memchr(b + pos, '"', (size_t)(e - pos)))
            end = line_end(b, n, pos);
        Py_ssize_t first = skip_whitespace(b, n, pos);
        if (first < end && b[first] != '#') {
            Py_ssize_t stop = b[end - 1] == '\n' ? end - 1 : end;
            PyObject *item = Py_BuildValue("(Lnn)", lineno, first, stop);
            if (item == NULL || PyList_Append(rest, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
        }
        lineno += count_newlines(b, pos, end) + 1;
        pos = end + 1;
    }
    if (resolve_block(self, &bd, bl, &out, rest, &lines, &strings) < 0) goto done;
    if (PyList_Sort(rest) < 0) goto done; /* (lines punted by the lookups come later) */
    PyObject *names = PyList_New((Py_ssize_t)out.n);
    if (names == NULL) goto done;
    for (size_t r = 0; r < out.n; r++) {
        Py_INCREF(out.names[r]);
        PyList_SET_ITEM(names, (Py_ssize_t)r, out.names[r]);
    }
    Py_ssize_t size = (Py_ssize_t)(out.n * 8);
    result = Py_BuildValue("(NNNNnnO)", names,
                           PyByteArray_FromStringAndSize((const char *)out.ts, size),
                           PyByteArray_FromStringAndSize((const char *)out.vs, size),
                           PyByteArray_FromStringAndSize((const char *)out.line, size), lines,
                           strings, rest);
done:
    self->busy = 0;
    Py_DECREF(body_obj);
    Py_DECREF(rest);
    out_free(&out);
    PyMem_Free(bl->fields);
    PyMem_Free(bl);
    return result;
}

static PyObject *LineTables_clear(LineTables *self, PyObject *Py_UNUSED(ignored)) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "LineTables.clear called during a parse");
        return NULL;
    }
    if (tables_reset(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static Py_ssize_t LineTables_len(LineTables *self) {
    return (Py_ssize_t)(self->series.used + self->fields.used);
}

static int LineTables_traverse(LineTables *self, visitproc visit, void *arg) {
    Py_VISIT(self->head_fn);
    Py_VISIT(self->name_fn);
    return 0;
}

static int LineTables_clear_refs(LineTables *self) {
    Py_CLEAR(self->head_fn);
    Py_CLEAR(self->name_fn);
    return 0;
}

static void LineTables_dealloc(LineTables *self) {
    PyObject_GC_UnTrack(self);
    LineTables_clear_refs(self);
    table_free(&self->series);
    table_free(&self->fields);
    PyMem_Free(self->arena);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int LineTables_init(LineTables *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"head", "name", "seed", NULL};
    PyObject *head, *name;
    unsigned long long seed;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOK", kwlist, &head, &name, &seed)) return -1;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "LineTables.__init__ called during a parse");
        return -1;
    }
    Py_INCREF(head);
    Py_INCREF(name);
    Py_XSETREF(self->head_fn, head);
    Py_XSETREF(self->name_fn, name);
    self->seed = seed | 1;
    return tables_reset(self);
}

static PyMethodDef LineTables_methods[] = {
    {"parse", (PyCFunction)LineTables_parse, METH_VARARGS,
     "parse(body, scale, default_ns, max_stamp, max_entries) -> (sensors, timestamps, values, "
     "line numbers, lines, string fields, rest): the readings of the lines taken (arrays as "
     "bytearrays of int64/float64), and (line number, start, end) of every other line"},
    {"clear", (PyCFunction)LineTables_clear, METH_NOARGS, "forget every series and field"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods LineTables_seq = {.sq_length = (lenfunc)LineTables_len};

PyTypeObject LineTablesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "services.common._native.LineTables",
    .tp_doc = "LineTables(head, name, seed): the line-protocol fast path and the names it "
              "has learnt",
    .tp_basicsize = sizeof(LineTables),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)LineTables_init,
    .tp_dealloc = (destructor)LineTables_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_traverse = (traverseproc)LineTables_traverse,
    .tp_clear = (inquiry)LineTables_clear_refs,
    .tp_methods = LineTables_methods,
    .tp_as_sequence = &LineTables_seq,
};

int lineproto_init(PyObject *module) {
    for (int c = 0; c < 256; c++) KIND[c] = K_TEXT;
    KIND[' '] = K_SP;
    KIND[','] = K_COMMA;
    KIND['='] = K_EQ;
    KIND['\n'] = K_NL;
    KIND['"'] = K_QUOTE;
    KIND['\\'] = KIND['\t'] = KIND[0] = K_BAD;
    IN_QUOTES['"'] = 1;
    IN_QUOTES['\\'] = IN_QUOTES['\n'] = IN_QUOTES['\t'] = IN_QUOTES[0] = 2;
    if (PyType_Ready(&LineTablesType) < 0) return -1;
    Py_INCREF(&LineTablesType);
    if (PyModule_AddObject(module, "LineTables", (PyObject *)&LineTablesType) < 0) {
        Py_DECREF(&LineTablesType);
        return -1;
    }
    return 0;
}

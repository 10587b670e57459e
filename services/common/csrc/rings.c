/* The sensor cache's ring writes in C (services/common/rings.py keeps the numpy code).
 *
 * ring_ids: sensor names to ring ids through the rings' dict, without a Python call
 * per name. ring_growth: which sensors a batch would overflow (rings.py moves them to
 * a larger capacity first, in numpy). ring_put: every reading into its sensor's
 * ring, in arrival order: the same slots, positions and counts as the numpy code.
 */
#include "native.h"

#include <string.h>

typedef struct {
    Py_buffer views[8];
    int used;
} Views;

static void views_release(Views *v) {
    for (int i = 0; i < v->used; i++) PyBuffer_Release(&v->views[i]);
    v->used = 0;
}

/* A C-contiguous buffer of ``n`` items of ``size`` bytes (n < 0: any count). */
static void *view_of(Views *v, PyObject *obj, Py_ssize_t size, Py_ssize_t n, int writable,
                     const char *what) {
    if (v->used == (int)(sizeof v->views / sizeof v->views[0])) {
        PyErr_SetString(PyExc_RuntimeError, "too many buffers");
        return NULL;
    }
    Py_buffer *b = &v->views[v->used];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, flags) < 0) return NULL;
    v->used++;
    if (b->itemsize != size || (n >= 0 && b->len != n * size)) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items of %zd bytes", what, n, size);
        return NULL;
    }
    return b->buf;
}

/* ring_ids(ids: dict[str, int], names: list[str], out: int64[len(names)]) -> int:
   fills ``out`` and returns len(names), or the index of the first unknown name. */
static PyObject *ring_ids(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *ids, *names, *out_obj;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyDict_Type, &ids, &PyList_Type, &names, &out_obj))
        return NULL;
    Py_ssize_t m = PyList_GET_SIZE(names);
    Views v = {.used = 0};
    int64_t *out = view_of(&v, out_obj, 8, m, 1, "out");
    if (out == NULL) {
        views_release(&v);
        return NULL;
    }
    PyObject **items = ((PyListObject *)names)->ob_item;
    Py_ssize_t i = 0;
    for (; i < m; i++) {
        if (i + 16 < m) __builtin_prefetch(items[i + 16]); /* its cached hash */
        PyObject *got = PyDict_GetItemWithError(ids, items[i]);
        if (got == NULL) {
            if (PyErr_Occurred()) {
                views_release(&v);
                return NULL;
            }
            break;
        }
        out[i] = PyLong_AsLongLong(got);
    }
    views_release(&v);
    return PyLong_FromSsize_t(i);
}

/* ring_growth(per: int64[m], n: int64[S], cls: int64[S], caps: int64[C], cap: int,
   scratch: int32[S] (zeros, left zeros)) -> (ids bytes, counts bytes): the sensors
   whose readings in this batch would overflow a ring smaller than ``cap``, each once,
   with its count of readings, in order of first appearance. */
static PyObject *ring_growth(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *per_o, *n_o, *cls_o, *caps_o, *scratch_o;
    long long cap;
    if (!PyArg_ParseTuple(args, "OOOOLO", &per_o, &n_o, &cls_o, &caps_o, &cap, &scratch_o))
        return NULL;
    Views v = {.used = 0};
    PyObject *result = NULL;
    const int64_t *per = view_of(&v, per_o, 8, -1, 0, "per");
    const int64_t *n = per ? view_of(&v, n_o, 8, -1, 0, "n") : NULL;
    const int64_t *cls = n ? view_of(&v, cls_o, 8, -1, 0, "cls") : NULL;
    const int64_t *caps = cls ? view_of(&v, caps_o, 8, -1, 0, "caps") : NULL;
    int32_t *scratch = caps ? view_of(&v, scratch_o, 4, -1, 1, "scratch") : NULL;
    if (scratch == NULL) goto done;
    Py_ssize_t m = v.views[0].len / 8, sensors = v.views[1].len / 8, classes = v.views[3].len / 8;
    if (v.views[2].len / 8 < sensors || v.views[4].len / 4 < sensors) {
        PyErr_SetString(PyExc_ValueError, "cls and scratch must cover every sensor");
        goto done;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        if (per[i] < 0 || per[i] >= sensors || cls[per[i]] < 0 || cls[per[i]] >= classes) {
            PyErr_SetString(PyExc_IndexError, "sensor id or class out of range");
            goto done;
        }
        scratch[per[i]]++;
    }
    PyObject *ids = PyByteArray_FromStringAndSize(NULL, 0);
    PyObject *counts = PyByteArray_FromStringAndSize(NULL, 0);
    if (ids == NULL || counts == NULL) {
        Py_XDECREF(ids);
        Py_XDECREF(counts);
        goto done;
    }
    int failed = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t s = per[i];
        int64_t k = scratch[s];
        if (k == 0) continue; /* seen already */
        scratch[s] = 0;
        int64_t c = caps[cls[s]];
        int64_t need = n[s] + k < cap ? n[s] + k : cap;
        if (need > c && !failed) {
            Py_ssize_t at = PyByteArray_GET_SIZE(ids);
            if (PyByteArray_Resize(ids, at + 8) < 0 || PyByteArray_Resize(counts, at + 8) < 0) {
                failed = 1;
                continue;
            }
            memcpy(PyByteArray_AS_STRING(ids) + at, &s, 8);
            memcpy(PyByteArray_AS_STRING(counts) + at, &k, 8);
        }
    }
    if (failed) {
        Py_DECREF(ids);
        Py_DECREF(counts);
        goto done;
    }
    result = Py_BuildValue("(NN)", ids, counts);
done:
    views_release(&v);
    return result;
}

/* ring_put(per, ts, vs, cls, row, pos, n, caps, class_ts: list, class_vs: list) -> None:
   reading i goes to slot pos[s] of sensor s = per[i] (column row[s] of the arrays of
   its capacity class cls[s]), then pos[s] advances and n[s] grows up to the capacity.
   Every sensor's ring already has room (ring_growth). */
static PyObject *ring_put(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *per_o, *ts_o, *vs_o, *cls_o, *row_o, *pos_o, *n_o, *caps_o, *cts, *cvs;
    if (!PyArg_ParseTuple(args, "OOOOOOOOO!O!", &per_o, &ts_o, &vs_o, &cls_o, &row_o, &pos_o,
                          &n_o, &caps_o, &PyList_Type, &cts, &PyList_Type, &cvs))
        return NULL;
    Views v = {.used = 0}, w = {.used = 0};
    PyObject *result = NULL;
    enum { MAX_CLASSES = 32 };
    int64_t *class_ts[MAX_CLASSES];
    double *class_vs[MAX_CLASSES];
    Py_ssize_t class_cols[MAX_CLASSES];
    Py_buffer cbufs[2 * MAX_CLASSES];
    int nbufs = 0;
    const int64_t *per = view_of(&v, per_o, 8, -1, 0, "per");
    Py_ssize_t m = per ? v.views[0].len / 8 : 0;
    const int64_t *ts = per ? view_of(&v, ts_o, 8, m, 0, "ts") : NULL;
    const double *vs = ts ? view_of(&v, vs_o, 8, m, 0, "vs") : NULL;
    const int64_t *cls = vs ? view_of(&v, cls_o, 8, -1, 0, "cls") : NULL;
    const int64_t *row = cls ? view_of(&v, row_o, 8, -1, 0, "row") : NULL;
    int64_t *pos = row ? view_of(&w, pos_o, 8, -1, 1, "pos") : NULL;
    int64_t *n = pos ? view_of(&w, n_o, 8, -1, 1, "n") : NULL;
    const int64_t *caps = n ? view_of(&v, caps_o, 8, -1, 0, "caps") : NULL;
    if (caps == NULL) goto done;
    Py_ssize_t classes = v.views[5].len / 8, sensors = v.views[3].len / 8;
    if (v.views[4].len / 8 < sensors || w.views[0].len / 8 < sensors ||
        w.views[1].len / 8 < sensors) {
        PyErr_SetString(PyExc_ValueError, "row, pos and n must cover every sensor");
        goto done;
    }
    if (classes > MAX_CLASSES || PyList_GET_SIZE(cts) != classes ||
        PyList_GET_SIZE(cvs) != classes) {
        PyErr_SetString(PyExc_ValueError, "one ts and one vs array per capacity class");
        goto done;
    }
    for (Py_ssize_t c = 0; c < classes; c++) {
        for (int which = 0; which < 2; which++) {
            PyObject *arr = PyList_GET_ITEM(which ? cvs : cts, c);
            Py_buffer *b = &cbufs[nbufs];
            if (PyObject_GetBuffer(arr, b, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_ND) < 0)
                goto done;
            nbufs++;
            if (b->ndim != 2 || b->shape[0] != caps[c] || b->itemsize != 8) {
                PyErr_SetString(PyExc_ValueError, "a class array is not (capacity, columns)");
                goto done;
            }
            if (which) {
                class_vs[c] = b->buf;
                if (b->shape[1] != class_cols[c]) {
                    PyErr_SetString(PyExc_ValueError, "ts and vs arrays differ");
                    goto done;
                }
            } else {
                class_ts[c] = b->buf;
                class_cols[c] = b->shape[1];
            }
        }
    }
    for (Py_ssize_t i = 0; i < m; i++) { /* checked first: a bad id writes nothing */
        int64_t s = per[i];
        if (s < 0 || s >= sensors || cls[s] < 0 || cls[s] >= classes || row[s] < 0 ||
            row[s] >= class_cols[cls[s]]) {
            PyErr_SetString(PyExc_IndexError, "sensor id, class or column out of range");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t s = per[i], c = cls[s], cap = caps[c], p = pos[s];
        Py_ssize_t at = (Py_ssize_t)p * class_cols[c] + row[s];
        class_ts[c][at] = ts[i];
        class_vs[c][at] = vs[i];
        pos[s] = p + 1 == cap ? 0 : p + 1;
        if (n[s] < cap) n[s]++;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    for (int i = 0; i < nbufs; i++) PyBuffer_Release(&cbufs[i]);
    views_release(&v);
    views_release(&w);
    return result;
}

static PyMethodDef rings_methods[] = {
    {"ring_ids", ring_ids, METH_VARARGS, "ring_ids(ids, names, out) -> names found"},
    {"ring_growth", ring_growth, METH_VARARGS,
     "ring_growth(per, n, cls, caps, cap, scratch) -> (ids, counts) to move"},
    {"ring_put", ring_put, METH_VARARGS,
     "ring_put(per, ts, vs, cls, row, pos, n, caps, class_ts, class_vs)"},
    {NULL, NULL, 0, NULL},
};

int rings_init(PyObject *module) { return PyModule_AddFunctions(module, rings_methods); }

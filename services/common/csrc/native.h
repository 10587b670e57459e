/* Kelvin's compiled core: declarations shared by the sources of services.common._native. */
#ifndef KELVIN_NATIVE_H
#define KELVIN_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Bumped whenever a function's arguments or results change: the Python side refuses
   a module built from older sources (services/common/native.py). */
#define KELVIN_NATIVE_ABI 2

extern PyTypeObject LineTablesType;
int lineproto_init(PyObject *module);
int rings_init(PyObject *module);
int encode_init(PyObject *module);

#endif

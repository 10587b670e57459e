/* services.common._native: Kelvin's optional compiled core (see services/common/native.py). */
#include "native.h"

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "services.common._native",
    .m_doc = "Kelvin's compiled core: the line-protocol fast path, the sensor cache's ring "
             "writes, JSON and CSV readings (the Python code is the fallback, with the same "
             "results)",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "ABI", KELVIN_NATIVE_ABI) < 0 || lineproto_init(m) < 0 ||
        rings_init(m) < 0 ||
        encode_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

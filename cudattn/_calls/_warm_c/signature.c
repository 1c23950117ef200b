/* A call signature's operand part, as bytes: what `call.Call.run` and `run` key recorded plans by.
 *
 * The operand part was a tuple of (type, shape, strides, dtype, device, read-only) tuples per
 * operand, and hashing and comparing that nest on every call cost most of a microsecond; the same
 * facts written into one bytes object cost a fifth of that. Both paths write them here, so that a
 * plan the Python path records serves the compiled one. Per operand: absent (one byte), or present,
 * its type (by address: a recorded call holds its signature's objects, so that no other type takes
 * that address while the plan lives), its dtype as a code (equal dtypes, one code), its device, its
 * read-only flag, then its shape and strides, each after its length (integers in as few bytes as
 * they need: `put_int`). Then the types of the entry's flags (so that True, 1 and 1.0, equal and of
 * equal hash, stay apart). Any count of operands is written (`run` takes at most MAX_OPERANDS; the
 * Python path keys more: a merge of many parts). What cannot be written (a dimension count over
 * SIG_DIMS, a non-integer extent, an unhashable dtype) fails: a TypeError, which makes the call's
 * signature unkeyable, as an unhashable tuple was. */
#include "warm.h"

/* Codes of the dtypes met: equal dtypes share one (the dictionary compares them), the objects met
 * most are found by address first. Held for the process: a program meets a handful. Codes come
 * from a counter taken before the dictionary is asked to store one, so that two dtypes never share
 * a code even where comparing them ran Python code and let another thread in meanwhile. */
static PyObject *g_dtype_codes;
static long g_next_dtype_code;
#define DTYPES_SEEN 16
static PyObject *g_dtype_seen[DTYPES_SEEN];
static uint32_t g_dtype_seen_code[DTYPES_SEEN];
static int g_n_dtype_seen;

static int dtype_code(PyObject *d, uint32_t *out) {
    for (int i = 0; i < g_n_dtype_seen; i++)
        if (g_dtype_seen[i] == d) {
            *out = g_dtype_seen_code[i];
            return 0;
        }
    if (g_dtype_codes == NULL && (g_dtype_codes = PyDict_New()) == NULL) return -1;
    PyObject *c = PyDict_GetItemWithError(g_dtype_codes, d);  /* borrowed */
    if (c == NULL) {
        if (PyErr_Occurred()) return -1;  /* unhashable */
        c = PyLong_FromLong(g_next_dtype_code++);
        int bad = c == NULL || PyDict_SetItem(g_dtype_codes, d, c) < 0;
        Py_XDECREF(c);  /* the dictionary holds it */
        if (bad) return -1;
        c = PyDict_GetItemWithError(g_dtype_codes, d);
        if (c == NULL) return -1;
    }
    long v = PyLong_AsLong(c);
    if (v < 0) return -1;
    *out = (uint32_t)v;
    if (g_n_dtype_seen < DTYPES_SEEN) {
        Py_INCREF(d);
        g_dtype_seen[g_n_dtype_seen] = d;
        g_dtype_seen_code[g_n_dtype_seen++] = (uint32_t)v;
    }
    return 0;
}

static int too_much(const char *what) {
    PyErr_Format(PyExc_TypeError, "cudattn: a call signature with %s cannot be keyed", what);
    return -1;
}

static void put(Sig *s, const void *p, size_t n) {
    memcpy(s->buf + s->n, p, n);
    s->n += (Py_ssize_t)n;
}

/* A signed integer in 1 to 10 bytes (zigzag, then 7 bits a byte, the high bit saying more follow):
 * extents and strides are mostly small, and fewer bytes hash sooner. */
static void put_int(Sig *s, long long v) {
    unsigned long long z = ((unsigned long long)v << 1) ^ (unsigned long long)(v >> 63);
    while (z >= 0x80) {
        s->buf[s->n++] = (unsigned char)(z | 0x80);
        z >>= 7;
    }
    s->buf[s->n++] = (unsigned char)z;
}

/* A tuple of integers, after its length. */
static int put_ints(Sig *s, PyObject *t) {
    if (!PyTuple_Check(t)) return too_much("a shape or strides that is no tuple");
    Py_ssize_t n = PyTuple_Size(t);
    if (n > SIG_DIMS) return too_much("more dimensions than 16");
    s->buf[s->n++] = (unsigned char)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PyTuple_GetItem(t, i));
        if (v == -1 && PyErr_Occurred()) return -1;
        put_int(s, v);
    }
    return 0;
}

void sig_start(Sig *s, unsigned char *buf, Py_ssize_t cap) {
    s->n = 0;
    s->cap = cap;
    s->buf = buf;
}

/* Room for one more operand, the flags' room kept. */
static int room(const Sig *s) {
    return s->n + SIG_OPERAND_BYTES + SIG_FLAGS_BYTES <= s->cap ? 0 : too_much("more operands than its room");
}

int sig_absent(Sig *s) {
    if (room(s) < 0) return -1;
    s->buf[s->n++] = 0;
    return 0;
}

int sig_operand(Sig *s, PyObject *type, PyObject *shape, PyObject *strides, PyObject *dtype, long long device,
                PyObject *readonly) {
    if (room(s) < 0) return -1;
    uint32_t code;
    if (dtype_code(dtype, &code) < 0) return -1;
    int ro = PyObject_IsTrue(readonly);
    if (ro < 0) return -1;
    uintptr_t t = (uintptr_t)type;
    s->buf[s->n++] = 1;
    put(s, &t, sizeof t);
    put_int(s, code);
    put_int(s, device);
    s->buf[s->n++] = (unsigned char)ro;
    return put_ints(s, shape) < 0 || put_ints(s, strides) < 0 ? -1 : 0;
}

int sig_flag_types(Sig *s, PyObject *flags) {
    Py_ssize_t n = PyTuple_Size(flags);
    if (n < 0) return -1;
    if (n > SIG_FLAGS) return too_much("more than 32 flags");
    s->buf[s->n++] = (unsigned char)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        uintptr_t t = (uintptr_t)Py_TYPE(PyTuple_GetItem(flags, i));
        put(s, &t, sizeof t);
    }
    return 0;
}

PyObject *sig_bytes(const Sig *s) { return PyBytes_FromStringAndSize((const char *)s->buf, s->n); }

/* signature(sig, flags) -> bytes: `Call.sig` (per operand None or (type, shape, strides, dtype,
 * device, read-only)) and the flags' types, as `run` writes them. */
PyObject *signature_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "signature(sig: tuple, flags: tuple)");
        return NULL;
    }
    PyObject *sig = args[0], *result = NULL;
    Py_ssize_t n = PyTuple_Size(sig);
    unsigned char stack[SIG_BYTES(MAX_OPERANDS)], *buf = stack;  /* any count of operands: a merge's parts */
    if (n > MAX_OPERANDS && (buf = PyMem_Malloc((size_t)SIG_BYTES(n))) == NULL) return PyErr_NoMemory();
    Sig s;
    sig_start(&s, buf, n > MAX_OPERANDS ? SIG_BYTES(n) : (Py_ssize_t)sizeof stack);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyTuple_GetItem(sig, i);
        if (e == Py_None) {
            if (sig_absent(&s) < 0) goto done;
            continue;
        }
        if (!PyTuple_Check(e) || PyTuple_Size(e) != 6) {
            too_much("an operand entry that is not (type, shape, strides, dtype, device, read-only)");
            goto done;
        }
        long long dev = PyLong_AsLongLong(PyTuple_GetItem(e, 4));
        if ((dev == -1 && PyErr_Occurred()) ||
            sig_operand(&s, PyTuple_GetItem(e, 0), PyTuple_GetItem(e, 1), PyTuple_GetItem(e, 2),
                        PyTuple_GetItem(e, 3), dev, PyTuple_GetItem(e, 5)) < 0)
            goto done;
    }
    if (sig_flag_types(&s, args[1]) == 0) result = sig_bytes(&s);
done:
    if (buf != stack) PyMem_Free(buf);
    return result;
}

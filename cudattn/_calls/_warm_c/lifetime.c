/* The keep-alive holds of a warm call (`_arrays.lifetime.hold` and `.release_done`), made on the
 * module's own state without its Python frames: `_free_events` (per device, events to reuse), `_held`
 * (a deque of (event, its free list, refs), oldest first) and `_lock`, through this module's bound
 * event entry points (whatever `lifetime._record` and `_query` are). Where the module's function was
 * replaced (a test's stand-in), the entry points are not bound, the call's stream may capture, no
 * event is free to reuse, or a record or query fails, the Python function is called instead: it does
 * the rest under the same rules, and names any error. A release that finds the lock held elsewhere
 * releases nothing (a later call does), as it never waits. */
#include "warm.h"

#define CUDA_ERROR_NOT_READY 600
#define CAPTURE_MODE_RELAXED 2

/* `lock.acquire(blocking)`: 1 taken, 0 not, -1 error. */
static int acquire(PyObject *lock, int blocking) {
    PyObject *got = PyObject_CallMethodObjArgs(lock, s_acquire, blocking ? Py_True : Py_False, NULL);
    if (got == NULL) return -1;
    int taken = got == Py_True;
    Py_DECREF(got);
    return taken;
}

/* `lock.release()`, an exception already set kept (the call's own error then dropped): 0, or -1 with
 * an exception set. */
static int unlock(PyObject *lock) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = PyObject_CallMethodObjArgs(lock, s_release, NULL);
    Py_XDECREF(r);
    if (type != NULL) {
        PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return -1;
    }
    return r != NULL ? 0 : -1;
}

/* `lifetime.check(err, what)`: the driver's error raised as the Python path names it. -1. */
static int raise_driver_error(int err, const char *what) {
    PyObject *r = PyObject_CallMethod(g_lifetime_mod, "check", "is", err, what);
    Py_XDECREF(r);
    if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "%s failed (%d)", what, err);
    return -1;
}

/* `hold(consumer, refs, dev, capturing=False)`, the stream known not to capture where
 * `outside_capture` (else the Python function asks). 0, or -1 with an exception. */
int hold_refs(PyObject *consumer_o, unsigned long long consumer, PyObject *refs, PyObject *dev, int outside_capture) {
    PyObject *fn = module_global(g_lifetime_mod, s_hold);
    PyObject *free_events = module_global(g_lifetime_mod, s_free_events);
    PyObject *held = module_global(g_lifetime_mod, s_held), *lock = module_global(g_lifetime_mod, s_lock);
    PyObject *free = free_events != NULL && PyDict_Check(free_events) ? PyDict_GetItemWithError(free_events, dev) : NULL;
    soft_clear();
    Py_ssize_t nf = free != NULL && PyList_Check(free) ? PyList_Size(free) : 0;
    if (!outside_capture || fn != g_lifetime_hold || g_record == NULL || held == NULL || lock == NULL || nf == 0)
        goto python;
    PyObject *ev_o = PyList_GetItem(free, nf - 1);  /* borrowed */
    unsigned long long ev;
    if (ev_o == NULL || !as_u64(ev_o, &ev)) goto python;
    Py_INCREF(ev_o);
    Py_INCREF(free);
    Py_INCREF(held);
    Py_INCREF(lock);
    int ok = PyList_SetSlice(free, nf - 1, nf, NULL) == 0;  /* taken: no other thread reuses it */
    if (ok) {
        record_fn record = g_record;
        int err;
        Py_BEGIN_ALLOW_THREADS  /* a full launch queue can hold the record */
        err = record((void *)(uintptr_t)ev, (void *)(uintptr_t)consumer);
        Py_END_ALLOW_THREADS
        if (err) {  /* back to the free list; the Python function records again and names the error */
            PyList_Append(free, ev_o);
            ok = 0;
        }
    }
    PyObject *entry = ok ? PyTuple_Pack(3, ev_o, free, refs) : NULL;
    int taken = entry != NULL ? acquire(lock, 1) : -1;  /* blocking, as the Python function's `with _lock` */
    PyObject *r = taken == 1 ? PyObject_CallMethodObjArgs(held, s_append, entry, NULL) : NULL;
    int appended = r != NULL;
    Py_XDECREF(r);
    if (taken == 1 && unlock(lock) < 0) appended = 0;
    Py_XDECREF(entry);
    Py_DECREF(ev_o);
    Py_DECREF(free);
    Py_DECREF(held);
    Py_DECREF(lock);
    if (appended) return 0;
    if (PyErr_Occurred()) return -1;  /* an append or a lock that failed: raised */
python:;
    PyObject *res = PyObject_CallMethodObjArgs(g_lifetime_mod, s_hold, consumer_o, refs, dev,
                                               outside_capture ? Py_False : Py_None, NULL);
    if (res == NULL) return -1;
    Py_DECREF(res);
    return 0;
}

/* `release_done()`: the holds whose events have completed dropped, oldest first, their events
 * reused; the references dropped after the lock is let go (a freed cudattn array queues its free).
 * 0, or -1 with an exception. */
int release_holds(void) {
    PyObject *fn = module_global(g_lifetime_mod, s_release_done);
    PyObject *held = module_global(g_lifetime_mod, s_held), *lock = module_global(g_lifetime_mod, s_lock);
    query_fn query = g_query;  /* one pair for the whole release (Python code runs between the calls) */
    exchange_fn exchange = g_exchange;
    if (fn != g_lifetime_release || query == NULL || exchange == NULL || held == NULL || lock == NULL)
        goto python;
    Py_ssize_t n = PyObject_Length(held);
    if (n <= 0) return n < 0 ? -1 : 0;
    Py_INCREF(held);
    Py_INCREF(lock);
    int taken = acquire(lock, 0);  /* held elsewhere: a later call releases (never waited for) */
    if (taken <= 0) {
        Py_DECREF(held);
        Py_DECREF(lock);
        return taken < 0 ? -1 : 0;
    }
    int prev = CAPTURE_MODE_RELAXED;  /* event queries never invalidate a capture on another stream */
    int exchange_err = exchange(&prev), failed = 0;
    PyObject *done = exchange_err ? NULL : PyList_New(0);
    while (done != NULL && !failed && PyObject_Length(held) > 0) {
        PyObject *entry = PySequence_GetItem(held, 0);
        PyObject *ev_o = entry != NULL && PyTuple_Check(entry) && PyTuple_Size(entry) == 3 ? PyTuple_GetItem(entry, 0)
                                                                                          : NULL;
        unsigned long long ev;
        if (ev_o == NULL || !as_u64(ev_o, &ev)) {
            Py_XDECREF(entry);
            failed = 1;
            break;
        }
        int err = query((void *)(uintptr_t)ev);
        if (err) {  /* still running; or failed, and the Python function queries again and names the error */
            Py_DECREF(entry);
            failed = err != CUDA_ERROR_NOT_READY;
            break;
        }
        PyObject *left = PyObject_CallMethodObjArgs(held, s_popleft, NULL);  /* the entry read: `_held`
                                                                              * changes only under the lock */
        failed = left != entry || PyList_Append(PyTuple_GetItem(entry, 1), ev_o) < 0 ||
                 PyList_Append(done, PyTuple_GetItem(entry, 2)) < 0;
        Py_XDECREF(left);
        Py_DECREF(entry);
    }
    if (done == NULL && !exchange_err) failed = 1;  /* no list: an exception set */
    unlock(lock);
    int restore_err = 0;
    if (!exchange_err) {
        int mode = prev;
        restore_err = exchange(&mode);
    }
    Py_DECREF(lock);
    Py_DECREF(held);
    Py_XDECREF(done);  /* the finished holds' references, outside the lock */
    if (PyErr_Occurred()) return -1;
    if (exchange_err) return raise_driver_error(exchange_err, "cuThreadExchangeStreamCaptureMode");
    if (restore_err) return raise_driver_error(restore_err, "cuThreadExchangeStreamCaptureMode");
    if (!failed) return 0;
python:;
    PyObject *r = PyObject_CallMethodObjArgs(g_lifetime_mod, s_release_done, NULL);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* hold(consumer, refs, device, outside_capture) and release_holds(): the two above as a warm call makes
 * them after its launch, for tests (the event entry points a test's stand-ins). */
PyObject *hold_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!g_configured) {
        PyErr_SetString(PyExc_TypeError, "hold() after configure()");
        return NULL;
    }
    unsigned long long consumer;
    int outside = nargs == 4 ? PyObject_IsTrue(args[3]) : -1;
    if (nargs != 4 || !as_u64(args[0], &consumer) || !PyTuple_Check(args[1]) || !PyLong_Check(args[2]) ||
        outside < 0) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "hold(consumer: int, refs: tuple, device: int, outside_capture: bool)");
        }
        return NULL;
    }
    if (hold_refs(args[0], consumer, args[1], args[2], outside) < 0) return NULL;
    Py_RETURN_NONE;
}

PyObject *release_py(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (!g_configured) {
        PyErr_SetString(PyExc_TypeError, "release_holds() after configure()");
        return NULL;
    }
    if (release_holds() < 0) return NULL;
    Py_RETURN_NONE;
}

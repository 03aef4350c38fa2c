/* The native face of the in-process torch backend: Triton's backend entry points, handed to Python.
 *
 * tritonserver loads libtriton_torch_inprocess.so like any backend. This file only starts an interpreter
 * in the server's own process (no stub process, no shared-memory round trip) and forwards each entry
 * point, with its pointers as integers, to triton_models.inprocess_backend, which does the work through
 * Triton's C API (ctypes). A Python exception becomes a TRITONSERVER_Error: the server stays up.
 *
 * Built on the serving host by server/triton/inprocess_build.py (it needs the host's C compiler, Python headers
 * and libpython): PYTHON_EXECUTABLE is the interpreter whose environment (venv included) the backend uses,
 * PYTHON_LIBRARY its libpython, promoted to global symbols so that extension modules (torch) resolve.
 */
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

#include "image_path.h"
#include "metrics.h"
#include "native.h"
#include "ragged_path.h"
#include "tokenize_path.h"

static PyObject* backend_module = NULL;

static TRITONSERVER_Error* internal(const char* what) { return TRITONSERVER_ErrorNew(ERROR_INTERNAL, what); }

static TRITONSERVER_Error* python_error(const char* where) {
  PyObject *type = NULL, *exc = NULL, *trace = NULL;
  PyErr_Fetch(&type, &exc, &trace);
  PyErr_NormalizeException(&type, &exc, &trace);
  PyObject* text = exc ? PyObject_Str(exc) : NULL;
  const char* message = text ? PyUnicode_AsUTF8(text) : NULL;
  char buffer[2048];
  snprintf(buffer, sizeof buffer, "torch_inprocess %s: %s", where, message ? message : "unknown Python error");
  PyErr_Clear();
  Py_XDECREF(text);
  Py_XDECREF(exc);
  Py_XDECREF(type);
  Py_XDECREF(trace);
  return internal(buffer);
}

static TRITONSERVER_Error* start_python(void) {
  if (backend_module != NULL) return NULL;
  if (dlopen(PYTHON_LIBRARY, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) == NULL) {
    return internal("torch_inprocess: could not make libpython's symbols global (" PYTHON_LIBRARY ")");
  }
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.install_signal_handlers = 0; /* signals stay tritonserver's */
  config.parse_argv = 0;
  PyStatus status = PyConfig_SetBytesString(&config, &config.executable, PYTHON_EXECUTABLE);
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status)) return internal("torch_inprocess: the Python interpreter did not start");
  backend_module = PyImport_ImportModule("tpserve.triton_models.inprocess.backend");
  TRITONSERVER_Error* err = backend_module ? NULL : python_error("import tpserve.triton_models.inprocess.backend");
  PyEval_SaveThread(); /* the GIL is taken per call from here on */
  return err;
}

/* name(*pointers) in Python; it returns 0 or the address of a TRITONSERVER_Error it made. */
static __thread int thread_state_kept = 0;

static TRITONSERVER_Error* forward(const char* name, int count, uintptr_t a, uintptr_t b, uintptr_t c) {
  PyGILState_STATE gil = PyGILState_Ensure();
  if (!thread_state_kept) { /* one more count, never given back: this thread's state lives across calls */
    PyGILState_Ensure();
    thread_state_kept = 1;
  }
  TRITONSERVER_Error* err = NULL;
  PyObject* result = NULL;
  if (count == 1) result = PyObject_CallMethod(backend_module, name, "K", (unsigned long long)a);
  if (count == 3) {
    result = PyObject_CallMethod(backend_module, name, "KKK", (unsigned long long)a, (unsigned long long)b,
                                 (unsigned long long)c);
  }
  if (result == NULL) {
    err = python_error(name);
  } else {
    err = (TRITONSERVER_Error*)(uintptr_t)PyLong_AsUnsignedLongLong(result);
    Py_DECREF(result);
    if (PyErr_Occurred()) err = python_error(name);
  }
  PyGILState_Release(gil);
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_Initialize(void* backend) {
  TRITONSERVER_Error* err = start_python();
  if (err == NULL) err = forward("backend_initialize", 1, (uintptr_t)backend, 0, 0);
  if (err == NULL) ipm_start();
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_Finalize(void* backend) {
  TRITONSERVER_Error* err = forward("backend_finalize", 1, (uintptr_t)backend, 0, 0);
  ipm_stop();
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(void* model) {
  return forward("model_initialize", 1, (uintptr_t)model, 0, 0);
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(void* model) {
  return forward("model_finalize", 1, (uintptr_t)model, 0, 0);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(void* instance) {
  TRITONSERVER_Error* err = forward("instance_initialize", 1, (uintptr_t)instance, 0, 0);
  if (err == NULL) ipm_instance_open(instance);
  return err;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(void* instance) {
  TRITONSERVER_Error* err = forward("instance_finalize", 1, (uintptr_t)instance, 0, 0);
  ipm_instance_close(instance); /* after: a native path's last batches report as it closes */
  return err;
}

/* image_path.c (fixed-shape models), ragged_path.c (sequence models) and
 * tokenize_path.c (the tokenize step): a batch of an instance
 * that took a native path is served there, without the GIL. */

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(void* instance, void** requests, const uint32_t count) {
  if (ipn_execute(instance, requests, count) || ipr_execute(instance, requests, count) ||
      ipt_execute(instance, requests, count)) {
    return NULL;
  }
  return forward("instance_execute", 3, (uintptr_t)instance, (uintptr_t)requests, (uintptr_t)count);
}

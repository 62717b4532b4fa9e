"""Shared test setup: import tkern from this source tree, and small helpers."""

import ctypes
import os
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PYTHON_DIR = os.path.join(REPO, "python")
HEADER = os.path.join(REPO, "include", "tkern.h")
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)


class FakeCudaArray:
    """An object exposing only __cuda_array_interface__ over host memory filled with a
    sentinel byte: libtkern validates arguments without dereferencing them, so the binding's
    checks and the library's argument errors can be tested without a GPU."""

    SENTINEL = 0xA5

    def __init__(self, shape, typestr="<f2", strides=None, nbytes=None):
        itemsize = int(typestr[2:])
        count = 1
        for s in shape:
            count *= s
        size = nbytes if nbytes is not None else max(count * itemsize, 1)
        self.buffer = (ctypes.c_uint8 * size)(*([self.SENTINEL] * size))
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "strides": strides,
            "data": (ctypes.addressof(self.buffer), False), "version": 3,
        }

    def untouched(self):
        return all(b == self.SENTINEL for b in self.buffer)

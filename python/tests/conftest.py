"""Shared test setup: import tkern from this source tree (or, with TKERN_TEST_INSTALLED=1, the
installed package, which must then not be the source tree's), and small helpers."""

import ctypes
import os
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PYTHON_DIR = os.path.join(REPO, "python")
HEADER = os.path.join(REPO, "include", "tkern.h")
INSTALLED = os.environ.get("TKERN_TEST_INSTALLED") == "1"
if not INSTALLED and PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

import tkern  # noqa: E402

PACKAGE_DIR = os.path.dirname(os.path.abspath(tkern.__file__))
SOURCE_TREE = os.path.realpath(PYTHON_DIR) + os.sep
if INSTALLED and os.path.realpath(PACKAGE_DIR).startswith(SOURCE_TREE):
    raise RuntimeError(f"TKERN_TEST_INSTALLED=1 but tkern was imported from the source tree "
                       f"({PACKAGE_DIR}): run pytest outside it, without python/ on the path")


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

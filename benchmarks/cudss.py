"""A small ctypes binding of NVIDIA cuDSS, the sparse direct solver to beat (anchor).

Only what the side-by-side needs: one SPD matrix (lower triangle, CSR, 0-based) or a
non-uniform batch of them, analysis, factorization, solve, and the statistics cuDSS reports.
The library is not part of vbatch; ../shared/anchors/cudss/README.md puts it on the GPU machine
(``/root/cudss/libcudss.so.1``). It needs libcublas and libnvrtc, which the CUDA wheels beside
CuPy hold; they are loaded first.
"""

from __future__ import annotations

import ctypes
import glob
import os

import cupy
import numpy as np
import scipy.sparse as sp

R_64F, R_32F, R_32I = 1, 0, 10  # cudaDataType_t
MTYPE_SPD, MVIEW_LOWER, BASE_ZERO, COL_MAJOR = 3, 1, 0, 0
ANALYSIS, FACTORIZATION = 3, 4
SOLVE = (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9)
DATA_INFO, DATA_LU_NNZ, DATA_FLOPS = 0, 1, 26

_VP = ctypes.c_void_p
_I64 = ctypes.c_int64


def _preload() -> None:
    """libcublas and libnvrtc from the nvidia wheels (cuDSS links against them)."""
    try:
        import nvidia
    except ImportError:
        return
    for root in nvidia.__path__:
        for pat in ("cu13/lib/libcublasLt.so*", "cu13/lib/libcublas.so*", "cu13/lib/libnvrtc.so*",
                    "*/lib/libcublasLt.so*", "*/lib/libcublas.so*", "*/lib/libnvrtc.so*"):
            for p in sorted(glob.glob(os.path.join(root, pat))):
                try:
                    ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass


class CuDSS:
    """One handle, one config, one data object: ``analysis``, ``factor``, ``solve``."""

    def __init__(self, lib: str = "/root/cudss/libcudss.so.1"):
        _preload()
        self.lib = ctypes.CDLL(lib)
        self.h, self.cfg, self.data = _VP(), _VP(), _VP()
        self._ok(self.lib.cudssCreate(ctypes.byref(self.h)), "create")
        self._ok(self.lib.cudssConfigCreate(ctypes.byref(self.cfg)), "config")
        self._ok(self.lib.cudssDataCreate(self.h, ctypes.byref(self.data)), "data")
        self.keep: list = []

    @staticmethod
    def _ok(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"cuDSS {what}: status {status}")

    # ------------------------------------------------------------------ operands
    def matrix(self, A: sp.spmatrix) -> None:
        """One SPD matrix (its lower triangle), and x, b of one column."""
        low = sp.csr_matrix(sp.tril(A))
        low.sort_indices()
        n = low.shape[0]
        ptr = cupy.asarray(low.indptr.astype(np.int32))
        idx = cupy.asarray(low.indices.astype(np.int32))
        val = cupy.asarray(low.data.astype(np.float64))
        self.x = cupy.zeros(n)
        self.b = cupy.ones(n)
        self.keep += [ptr, idx, val]
        self.val = val
        self.A, self.X, self.B = _VP(), _VP(), _VP()
        self._ok(self.lib.cudssMatrixCreateCsr(
            ctypes.byref(self.A), _I64(n), _I64(n), _I64(low.nnz), _VP(ptr.data.ptr), _VP(0),
            _VP(idx.data.ptr), _VP(val.data.ptr), R_32I, R_32I, R_64F, MTYPE_SPD, MVIEW_LOWER,
            BASE_ZERO), "matrix")
        for m, arr in ((self.X, self.x), (self.B, self.b)):
            self._ok(self.lib.cudssMatrixCreateDn(ctypes.byref(m), _I64(n), _I64(1), _I64(n),
                                                  _VP(arr.data.ptr), R_64F, COL_MAJOR), "dense")

    def batch(self, mats: list) -> None:
        """A non-uniform batch: pointer arrays on the device, sizes on the host."""
        lows = [sp.csr_matrix(sp.tril(A)) for A in mats]
        k = len(lows)
        ns = np.array([m.shape[0] for m in lows], np.int32)
        nnz = np.array([m.nnz for m in lows], np.int32)
        ptrs = [cupy.asarray(m.indptr.astype(np.int32)) for m in lows]
        idxs = [cupy.asarray(m.indices.astype(np.int32)) for m in lows]
        vals = [cupy.asarray(m.data.astype(np.float64)) for m in lows]
        xs = [cupy.zeros(int(n)) for n in ns]
        bs = [cupy.ones(int(n)) for n in ns]
        self.keep += [ptrs, idxs, vals, xs, bs]
        self.x, self.b = xs, bs

        def table(arrs):
            t = cupy.asarray(np.array([a.data.ptr for a in arrs], dtype=np.uint64))
            self.keep.append(t)
            return _VP(t.data.ptr)

        ones = np.ones(k, np.int32)
        self.keep += [ns, nnz, ones]
        self.A, self.X, self.B = _VP(), _VP(), _VP()
        self._ok(self.lib.cudssMatrixCreateBatchCsr(
            ctypes.byref(self.A), _I64(k), _VP(ns.ctypes.data), _VP(ns.ctypes.data),
            _VP(nnz.ctypes.data), table(ptrs), _VP(0), table(idxs), table(vals), R_32I, R_32I,
            R_64F, MTYPE_SPD, MVIEW_LOWER, BASE_ZERO), "batch matrix")
        for m, arrs in ((self.X, xs), (self.B, bs)):
            self._ok(self.lib.cudssMatrixCreateBatchDn(
                ctypes.byref(m), _I64(k), _VP(ns.ctypes.data), _VP(ones.ctypes.data),
                _VP(ns.ctypes.data), table(arrs), R_32I, R_64F, COL_MAJOR), "batch dense")

    # ------------------------------------------------------------------ phases
    def run(self, phase: int) -> None:
        cupy.cuda.runtime.deviceSynchronize()
        self._ok(self.lib.cudssExecute(self.h, phase, self.cfg, self.data, self.A, self.X,
                                       self.B), f"execute phase {phase}")
        cupy.cuda.runtime.deviceSynchronize()

    def get(self, param: int, ctype=ctypes.c_int64) -> int:
        v = ctype(0)
        w = ctypes.c_size_t(0)
        self._ok(self.lib.cudssDataGet(self.h, self.data, param, ctypes.byref(v),
                                       ctypes.sizeof(v), ctypes.byref(w)), f"get {param}")
        return int(v.value)

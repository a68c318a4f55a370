"""BLAS and LAPACK for the CPU backend: scipy's own library, called through ctypes, one pool.

Why not scipy's Python wrappers (``scipy.linalg.lapack.dpotrf``)? They hold the GIL for the whole
call, so threads running whole problems side by side gained nothing: 400 factorizations of order
200 took 53 ms on one thread and 57 ms on two (2-core VM, 2026-11-21). A ctypes call releases the
GIL for the duration of the foreign call: the same 400 took 55 ms on one thread and 32 ms on two.
Each ctypes call costs about 0.9 us of Python, against 0.6 us for the f2py wrapper.

Why not numpy for part of it? numpy and scipy wheels each carry their own OpenBLAS with its own
thread pool; a backend that alternated between them (numpy matmul for the update, scipy potrf for
the panel) made the two pools fight over the cores: 6.8-13.5 s for a batch that takes 0.37 s with
one thread each (docs/decisions.md#cpu-one-blas). Everything here goes through one library, the one
``scipy.linalg.cython_blas`` / ``cython_lapack`` call, whose C entry points scipy exports as
capsules (``__pyx_capi__``): their signatures use C ``int`` (LP64) and take every argument by
pointer, Fortran style.

Thread control: :class:`BlasThreads` sets the BLAS libraries' thread counts through threadpoolctl,
so that whole problems can run one per core with a single-threaded BLAS each, and a problem large
enough to need the whole machine gets the library's own threads.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

import numpy as np

_LAPACK = ("potrf", "lacpy", "laset", "getrf")
_BLAS = ("trsm", "trmm", "syrk", "herk", "gemm")
_PREFIX = {np.dtype(np.float64): "d", np.dtype(np.float32): "s",
           np.dtype(np.complex128): "z", np.dtype(np.complex64): "c"}
# a scalar's (real) parts; a complex one is two
_SCALAR = {np.dtype(np.float64): ctypes.c_double, np.dtype(np.float32): ctypes.c_float,
           np.dtype(np.complex128): ctypes.c_double, np.dtype(np.complex64): ctypes.c_float}

_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _entry(module, name: str, nargs: int, chars: int):
    """The C function behind ``module.__pyx_capi__[name]`` as a ctypes function: ``chars``
    leading ``char *`` arguments, then ``nargs - chars`` pointers passed as integer addresses."""
    cap = module.__pyx_capi__[name]
    ptr = _get_pointer(cap, _get_name(cap))
    args = [ctypes.c_char_p] * chars + [ctypes.c_void_p] * (nargs - chars)
    proto = ctypes.CFUNCTYPE(None, *args)
    return proto(ptr)


# name -> (number of arguments, number of leading char* arguments)
_ARITY = {
    "potrf": (5, 1), "lacpy": (7, 1), "laset": (7, 1), "getrf": (6, 0),
    "trsm": (11, 4), "trmm": (11, 4), "syrk": (10, 2), "herk": (10, 2), "gemm": (13, 2),
}


@functools.cache
def routines(dtype) -> dict:
    """``{"potrf": f, ...}`` for float64 (d), float32 (s), complex128 (z) or complex64 (c).
    ``potrf`` is the Hermitian factor for complex types; ``herk`` is ``syrk`` for real ones
    (with their real alpha and beta, and "C" read as "T")."""
    import scipy.linalg.cython_blas as cblas
    import scipy.linalg.cython_lapack as clapack

    p = _PREFIX[np.dtype(dtype)]
    out = {}
    for name in _LAPACK:
        out[name] = _entry(clapack, p + name, *_ARITY[name])
    for name in _BLAS:
        if name == "herk" and np.dtype(dtype).kind != "c":
            out[name] = out["syrk"]
            continue
        out[name] = _entry(cblas, p + name, *_ARITY[name])
    return out


class Scalars:
    """Scalar arguments for BLAS in one ctypes array, ``n`` slots of the dtype (a complex
    slot is its two parts; its first is a real scalar of the same precision, as HERK's alpha
    and beta are read): :meth:`put` a value, pass :meth:`at`'s address."""

    def __init__(self, dtype, n: int):
        dt = np.dtype(dtype)
        self.parts = 2 if dt.kind == "c" else 1
        self.isz = dt.itemsize
        self.arr = (_SCALAR[dt] * (n * self.parts))()
        self.addr = ctypes.addressof(self.arr)

    def put(self, k: int, v) -> None:
        if self.parts == 2:
            v = complex(v)
            self.arr[2 * k], self.arr[2 * k + 1] = v.real, v.imag
        else:
            self.arr[k] = v

    def at(self, k: int) -> int:
        return self.addr + k * self.isz


class Calls:
    """One thread's caller: scalar arguments live in its own ctypes arrays (a call passes their
    addresses), so concurrent threads never share an argument. Element-size offsets are in
    elements; addresses are plain ints.

    The methods name what they do to the *logical* matrix X stored with element (r, c) at
    ``r + c * ld`` (order F) or ``r * ld + c`` (order C). Row-major X is column-major X^T, so for
    order C every call is the transposed one: lower <-> upper, A B^T <-> B^T A, and so on.
    """

    def __init__(self, dtype, order: str):
        self.f = routines(dtype)
        self.isz = np.dtype(dtype).itemsize
        self._dt = np.dtype(dtype)
        self.row = order == "C"
        self._i = (ctypes.c_int * 8)()
        self._s = Scalars(dtype, 4)
        self._ia = ctypes.addressof(self._i)
        self._sa = self._s.addr
        for k, v in enumerate((1.0, -1.0, 0.0)):  # one, minus one, zero
            self._s.put(k, v)
        self.lo, self.up = (b"U", b"L") if self.row else (b"L", b"U")

    # addresses of the scalar slots
    def _ints(self, *vals: int) -> list[int]:
        i = self._i
        for k, v in enumerate(vals):
            i[k] = v
        return [self._ia + 4 * k for k in range(len(vals))]

    def at(self, base: int, ld: int, r: int, c: int) -> int:
        """Address of X(r, c)."""
        return base + ((c + r * ld) if self.row else (r + c * ld)) * self.isz

    def view(self, a: int, n: int, ld: int) -> np.ndarray:
        """X[:n, :n] at ``a`` as a writable numpy view (for the few scalar fix-ups BLAS has no
        call for)."""
        size = (n - 1) * ld + n if n else 0
        flat = np.frombuffer((ctypes.c_char * (size * self.isz)).from_address(a), self._dt) \
            if size else np.zeros(0, self._dt)
        if not n:
            return flat.reshape(0, 0)
        return np.lib.stride_tricks.as_strided(
            flat, (n, n), (ld * self.isz, self.isz) if self.row else (self.isz, ld * self.isz))

    # ------------------------------------------------------------------ operations on X
    def potrf_lower(self, a: int, n: int, ld: int) -> int:
        """Cholesky of X's leading n x n block (lower triangle read and written); LAPACK info."""
        pn, pld, pinfo = self._ints(n, ld, 0)
        self.f["potrf"](self.lo, pn, a, pld, pinfo)
        return self._i[2]

    def copy(self, uplo: str, src: int, dst: int, m: int, n: int, ld_src: int, ld_dst: int):
        """X_dst[:m, :n] = X_src[:m, :n]; uplo "L" (lower trapezoid), "U" or "A"."""
        if m <= 0 or n <= 0:
            return
        u = {"L": self.lo, "U": self.up, "A": b"A"}[uplo]
        if self.row:
            m, n = n, m
        pm, pn, pls, pld = self._ints(m, n, ld_src, ld_dst)
        self.f["lacpy"](u, pm, pn, src, pls, dst, pld)

    def zero(self, uplo: str, a: int, m: int, n: int, ld: int):
        """Zero X[:m, :n]: "A" all of it, "U" strictly above its diagonal, "L" strictly below.
        ``a`` points at X[0, 0] of the block."""
        if m <= 0 or n <= 0:
            return
        if uplo == "A":
            u = b"A"
        else:
            # laset's "U"/"L" also set the diagonal (to beta); shift by one row or column to
            # leave it alone: strictly upper of X from (0, 1), strictly lower from (1, 0).
            if uplo == "U":
                a, n = self.at(a, ld, 0, 1), n - 1
            else:
                a, m = self.at(a, ld, 1, 0), m - 1
            if m <= 0 or n <= 0:
                return
            u = self.up if uplo == "U" else self.lo
        if self.row:
            m, n = n, m
        pm, pn, pld = self._ints(m, n, ld)
        z = self._sa + 2 * self.isz
        self.f["laset"](u, pm, pn, z, z, a, pld)

    # (Cholesky's: A = L L^H, which real types read as L L^T, "C" as "T")
    def syrk_lower(self, c: int, a: int, n: int, k: int, ld: int):
        """lower(X_c[:n, :n]) -= X_a[:n, :k] X_a[:n, :k]^H."""
        if n <= 0 or k <= 0:
            return
        pn, pk, pld = self._ints(n, k, ld)
        one, minus = self._sa, self._sa + self.isz
        self.f["herk"](self.lo, b"C" if self.row else b"N", pn, pk, minus, a, pld, one, c, pld)

    def gemm_nt(self, c: int, a: int, b: int, m: int, n: int, k: int, ld: int):
        """X_c[:m, :n] -= X_a[:m, :k] X_b[:n, :k]^H."""
        if m <= 0 or n <= 0 or k <= 0:
            return
        one, minus = self._sa, self._sa + self.isz
        if self.row:  # C^T -= conj(B) A^T: (n x m) = (k x n)^H (k x m)
            pm, pn, pk, pld = self._ints(n, m, k, ld)
            self.f["gemm"](b"C", b"N", pm, pn, pk, minus, b, pld, a, pld, one, c, pld)
        else:
            pm, pn, pk, pld = self._ints(m, n, k, ld)
            self.f["gemm"](b"N", b"C", pm, pn, pk, minus, a, pld, b, pld, one, c, pld)

    def trsm_right_lower_t(self, b: int, t: int, m: int, n: int, ld: int):
        """X_b[:m, :n] = X_b[:m, :n] T^-H with T = lower(X_t[:n, :n])."""
        if m <= 0 or n <= 0:
            return
        one = self._sa
        if self.row:  # B^T = conj(L)^-1 B^T, L^T upper in the column-major view
            pm, pn, pld = self._ints(n, m, ld)
            self.f["trsm"](b"L", b"U", b"C", b"N", pm, pn, one, t, pld, b, pld)
        else:
            pm, pn, pld = self._ints(m, n, ld)
            self.f["trsm"](b"R", b"L", b"C", b"N", pm, pn, one, t, pld, b, pld)


    def getrf(self, a: int, m: int, n: int, ld: int, ipiv: int) -> int:
        """LU with partial pivoting of the column-major ``m x n`` matrix at ``a`` (LAPACK's
        ``getrf``: there is no row-major form, callers copy); 1-based pivots into the int32
        array at ``ipiv``; LAPACK info."""
        pm, pn, pld, pinfo = self._ints(m, n, max(ld, 1), 0)
        self.f["getrf"](pm, pn, a, pld, ipiv, pinfo)
        return self._i[3]

    def trsm_left_lower_unit(self, b: int, t: int, m: int, n: int, ld: int):
        """X_b[:m, :n] = L^-1 X_b[:m, :n] with L the unit lower triangle of X_t[:m, :m]."""
        if m <= 0 or n <= 0:
            return
        one = self._sa
        if self.row:  # B^T = B^T L^-T, L^T upper in the column-major view
            pm, pn, pld = self._ints(n, m, ld)
            self.f["trsm"](b"R", b"U", b"N", b"U", pm, pn, one, t, pld, b, pld)
        else:
            pm, pn, pld = self._ints(m, n, ld)
            self.f["trsm"](b"L", b"L", b"N", b"U", pm, pn, one, t, pld, b, pld)


class BlasThreads:
    """The thread counts of the BLAS libraries loaded in this process (threadpoolctl).

    ``narrow()`` sets every BLAS library to one thread, for whole problems running one per core;
    ``wide()`` and ``restore()`` set back the counts it found, ``wide()`` for a problem that
    needs the whole machine. Process-wide for a pthreads OpenBLAS (pip's wheels); where the
    library's count is per thread (an OpenMP OpenBLAS, MKL), the setting reaches only the
    launching thread, not the pool's.
    Every BLAS library is set, not only scipy's: ours is the only one this backend calls, and one
    thread in a library nobody calls costs nothing, whereas matching the right one of two OpenBLAS
    builds by path is fragile. ``size`` is the number of threads the backend runs problems on: the
    BLAS's own configured count (so ``OPENBLAS_NUM_THREADS=1`` keeps vbatch on one core too),
    capped by the cores this process may use.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._libs = []
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # a core dependency; tolerate its absence with no thread control
            ThreadpoolController = None
        if ThreadpoolController is not None:
            # The BLAS this backend calls is scipy's (cython_lapack, loaded on first use):
            # loaded here first, or only numpy's was found where scipy.linalg had not been
            # imported yet, and narrow() left the one that runs the calls at its own count
            # (500 problems of U[1, 512], 2-core VM: 400-530 ms a call against 150-210).
            import scipy.linalg.cython_lapack  # noqa: F401

            ctl = ThreadpoolController()
            self._libs = [lc for lc in ctl.lib_controllers if lc.user_api == "blas"]
        self._orig = [lc.num_threads for lc in self._libs]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        blas = max(self._orig) if self._orig else 1
        self.size = max(1, min(int(cores or 1), int(blas)))
        # (more BLAS threads than cores: a chunk alone still takes one)
        self.oversubscribed = blas > self.size
        self._state = None
        self._saved = self._orig

    def _set(self, counts) -> None:
        # threadpoolctl 3.8 lets only the first thread that sets a pthreads OpenBLAS's count
        # (while that thread lives) set it again; others silently do nothing. A launch runs on
        # its runtime's worker or the caller's thread, one launch at a time (the backend's run
        # lock): each change takes control and gives it back. (A second runtime's calls ran at
        # a third of the speed: the first runtime's idle worker held control.)
        for lc, n in zip(self._libs, counts):
            clear = getattr(lc, "clear_controlling_thread", None)
            if clear is not None:
                clear(force=True)
            lc.set_num_threads(n)
            if clear is not None:
                clear()

    def narrow(self) -> None:
        if self._state != "narrow":
            # (the counts as they are now, not as at start-up: a caller's own limit, a
            # `threadpool_limits` block around the call, is given back as it was)
            self._saved = [lc.num_threads for lc in self._libs]
            self._set([1] * len(self._libs))
            self._state = "narrow"

    def wide(self) -> None:
        # (only a narrowed state is set back: the counts before it are the wide ones)
        if self._state == "narrow":
            self._set(self._saved)
        self._state = "wide"

    def restore(self) -> None:
        if self._state == "narrow":
            self._set(self._saved)
        self._state = None

"""MAGMA's variable-size batched routines through ctypes, for the benchmarks' anchor columns.

The library is ``libmagma_vb.so``, the subset of MAGMA (icl-utk-edu/magma) that
../shared/anchors/magma/ extracts into ``.magma/`` and builds on the GPU machine
(``bash .magma/build.sh`` writes ``.magma/build/libmagma_vb.so``). It runs in this process, on
CuPy's current stream and cuBLAS handle, on the very device buffers of a ``vbatch.PackedBatch``:

    mg = Magma(".magma/build/libmagma_vb.so")
    call = mg.prepare_potrf(batch)          # device metadata, built once (not timed)
    info = mg.potrf_vbatched(call)          # in place; the only thing to time
    mg.close()

Every routine comes as a pair: ``prepare_<op>(...)`` builds the device arrays MAGMA reads (one
pointer per matrix, and ``magma_int_t`` size and leading-dimension arrays of length k + 1; MAGMA's
docs give them k + 1 entries and its non-``max`` variants use the last) and returns a
:class:`Prepared`; ``<op>_vbatched(prepared)`` makes the one C call. All routines are the
``*_max_nocheck`` variants: the host passes the largest sizes, MAGMA checks nothing, so the
prepare step checks shapes instead. Everything is column-major (``order="F"``).

The C signatures were written from MAGMA's sources at the commit extract.sh pins (v2.10.0-23,
c64e52ab8), not from its headers alone: ``include/magma_dvbatched.h`` lists
``magmablas_dgemm_vbatched_max_nocheck``'s ``max_m, max_n, max_k`` before ``batchCount``, but
the definition (``magmablas/zgemm_vbatched.cpp``) and every caller take ``batchCount`` first.
``magma_int_t`` is ``int`` (no ``MAGMA_ILP64`` in this build) and MAGMA's enums are ``int``.

POTRF is what the Cholesky harness (``cuda_potrf.py --magma``) runs and checks; GETRF is what
the sweep runs (``sweep.py run --ops getrf``), its pivots checked against LAPACK's on a few
matrices of each cell (zgetrf's for complex types). GETRF needs a build of the subset with
MAGMA's LU added to extract.sh's lists: the z sources ``src/z{getrf,getrf_nopiv,getf2,
getf2_nopiv}_vbatched.cpp``, ``src/zgetrf{,_nopiv}_panel_vbatched.cpp``,
``magmablas/zgetf2{,_nopiv}_kernels_var.cu`` and ``magmablas/zlaswp_vbatched.cu`` (generated
in s and d, and in c with z kept for the complex types), ``magmablas/getrf_setup_pivinfo.cu``
and ``magmablas/set_pointer.cu`` as they are, and the headers they include (``shuffle.cuh``,
``zgetf2{,_nopiv}_devicefunc.cuh``, ``zlaswp_device.cuh``). In all four precisions, with the
complex BLAS files below: 126 units, 144 s with 12 jobs on a 16-core host.
GEMM and TRSM are what the BLAS harness (``cuda_blas.py --magma``) runs and checks against
numpy; their signatures were re-read against ``magmablas/dgemm_vbatched.cpp`` and
``dtrsm_vbatched.cpp`` (argument count, order and types match). Complex GEMM and TRSM (z, c:
the same signatures with ``magmaDoubleComplex``/``magmaFloatComplex`` scalars, passed as structs)
need a subset extracted in all four precisions for MAGMA's BLAS files (their z sources kept,
codegen's c, s and d beside them; ``zherk_vbatched_core.cu`` for complex SYRK). SYRK is still
an unused, untested binding. MAGMA has no ``potrs_vbatched`` (its headers declare only the
fixed-size ``magma_Xpotrs_batched``), so the BLAS harness solves with two TRSM calls.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

# magma_types.h: magma_uplo_t, magma_trans_t, magma_diag_t, magma_side_t
UPLO = {"U": 121, "L": 122}
TRANS = {"N": 111, "T": 112}
DIAG = {"N": 131, "U": 132}
SIDE = {"L": 141, "R": 142}

_INT = ctypes.c_int  # magma_int_t, and every MAGMA enum
_PTR = ctypes.c_void_p  # device pointers, pointer arrays, queues, streams, handles
_STR = ctypes.c_char_p
class _Complex(ctypes.Structure):
    """magmaDoubleComplex (cuDoubleComplex: two doubles, passed by value as a struct)."""

    _fields_ = [("re", ctypes.c_double), ("im", ctypes.c_double)]


class _ComplexFloat(ctypes.Structure):
    """magmaFloatComplex (cuFloatComplex)."""

    _fields_ = [("re", ctypes.c_float), ("im", ctypes.c_float)]


_REAL = {"d": ctypes.c_double, "s": ctypes.c_float, "z": _Complex, "c": _ComplexFloat}
_PREFIX = {np.dtype(np.float64): "d", np.dtype(np.float32): "s",
           np.dtype(np.complex128): "z", np.dtype(np.complex64): "c"}
_INT_MAX = 2**31 - 1


def _signatures(x: str) -> dict[str, tuple[Any, list]]:
    """restype and argtypes of precision ``x`` ("d", "s", "z", "c") routines, from their
    definitions (z and c: gemm, syrk, trsm, with complex scalars)."""
    real = _REAL[x]
    return {
        # src/zpotrf_vbatched.cpp: magma_int_t magma_Xpotrf_vbatched_max_nocheck(
        #   magma_uplo_t uplo, magma_int_t *n, T **dA_array, magma_int_t *ldda,
        #   magma_int_t *info_array, magma_int_t batchCount, magma_int_t max_n,
        #   magma_queue_t queue)
        f"magma_{x}potrf_vbatched_max_nocheck": (
            _INT, [_INT, _PTR, _PTR, _PTR, _PTR, _INT, _INT, _PTR]),
        # magmablas/zgemm_vbatched.cpp: void magmablas_Xgemm_vbatched_max_nocheck(
        #   magma_trans_t transA, magma_trans_t transB, magma_int_t *m, magma_int_t *n,
        #   magma_int_t *k, T alpha, T const * const * dA_array, magma_int_t *ldda,
        #   T const * const * dB_array, magma_int_t *lddb, T beta, T **dC_array,
        #   magma_int_t *lddc, magma_int_t batchCount, magma_int_t max_m, magma_int_t max_n,
        #   magma_int_t max_k, magma_queue_t queue)
        f"magmablas_{x}gemm_vbatched_max_nocheck": (
            None, [_INT, _INT, _PTR, _PTR, _PTR, real, _PTR, _PTR, _PTR, _PTR, real, _PTR, _PTR,
                   _INT, _INT, _INT, _INT, _PTR]),
        # magmablas/{d,s}syrk_vbatched_core.cu: void magmablas_Xsyrk_vbatched_max_nocheck(
        #   magma_uplo_t uplo, magma_trans_t trans, magma_int_t *n, magma_int_t *k, T alpha,
        #   T const * const * dA_array, magma_int_t *ldda, T beta, T **dC_array,
        #   magma_int_t *lddc, magma_int_t batchCount, magma_int_t max_n, magma_int_t max_k,
        #   magma_queue_t queue)
        f"magmablas_{x}syrk_vbatched_max_nocheck": (
            None, [_INT, _INT, _PTR, _PTR, real, _PTR, _PTR, real, _PTR, _PTR, _INT, _INT, _INT,
                   _PTR]),
        # magmablas/ztrsm_vbatched.cpp: void magmablas_Xtrsm_vbatched_max_nocheck(
        #   magma_side_t side, magma_uplo_t uplo, magma_trans_t transA, magma_diag_t diag,
        #   magma_int_t max_m, magma_int_t max_n, magma_int_t *m, magma_int_t *n, T alpha,
        #   T **dA_array, magma_int_t *ldda, T **dB_array, magma_int_t *lddb,
        #   magma_int_t batchCount, magma_queue_t queue)
        f"magmablas_{x}trsm_vbatched_max_nocheck": (
            None, [_INT, _INT, _INT, _INT, _INT, _INT, _PTR, _PTR, real, _PTR, _PTR, _PTR, _PTR,
                   _INT, _PTR]),
        # src/zgetrf_vbatched.cpp: magma_int_t magma_Xgetrf_vbatched_max_nocheck_work(
        #   magma_int_t *m, magma_int_t *n, magma_int_t max_m, magma_int_t max_n,
        #   magma_int_t max_minmn, magma_int_t max_mxn, T **dA_array, magma_int_t *ldda,
        #   magma_int_t **dipiv_array, magma_int_t *info_array, void *work,
        #   magma_int_t *lwork, magma_int_t batchCount, magma_queue_t queue)
        # (lwork is host memory: *lwork < 0 asks for the workspace's bytes)
        f"magma_{x}getrf_vbatched_max_nocheck_work": (
            _INT, [_PTR, _PTR, _INT, _INT, _INT, _INT, _PTR, _PTR, _PTR, _PTR, _PTR,
                   ctypes.POINTER(_INT), _INT, _PTR]),
        # control/get_batched_crossover.cpp: magma_int_t magma_get_Xpotrf_vbatched_crossover()
        f"magma_get_{x}potrf_vbatched_crossover": (_INT, []),
    }


_COMMON = {
    # include/magma_auxiliary.h, interface_cuda/interface.cpp
    "magma_init": (_INT, []),
    "magma_finalize": (_INT, []),
    # control/auxiliary.cpp: void magma_version(magma_int_t *major, *minor, *micro)
    "magma_version": (None, [_PTR, _PTR, _PTR]),
    # void magma_queue_create_from_cuda_internal(magma_device_t device, cudaStream_t stream,
    #   cublasHandle_t cublas, cusparseHandle_t cusparse, magma_queue_t *queue_ptr,
    #   const char *func, const char *file, int line)
    "magma_queue_create_from_cuda_internal": (
        None, [_INT, _PTR, _PTR, _PTR, ctypes.POINTER(_PTR), _STR, _STR, _INT]),
    # void magma_queue_destroy_internal(magma_queue_t, const char*, const char*, int), same sync
    "magma_queue_destroy_internal": (None, [_PTR, _STR, _STR, _INT]),
    "magma_queue_sync_internal": (None, [_PTR, _STR, _STR, _INT]),
}


@dataclass
class Prepared:
    """One MAGMA call with its arguments fixed: ``fn(*args)`` is the whole call.

    ``keep`` holds the device arrays the arguments point into (they must outlive the call);
    ``info`` is POTRF's per-matrix info (int32, length k), else None."""

    routine: str
    fn: Any
    args: tuple
    keep: tuple
    k: int
    info: Any = None


def _args(args: tuple, types: list) -> tuple:
    """``args`` as ``types`` (a complex scalar as MAGMA's struct; a queue as it is)."""
    def one(v, t):
        if isinstance(v, _PTR):
            return v
        if isinstance(t, type) and issubclass(t, ctypes.Structure):
            z = complex(v)
            return t(z.real, z.imag)
        return t(v)

    return tuple(one(v, t) for v, t in zip(args, types))


def _dev_ints(values: np.ndarray, what: str):
    """A device magma_int_t array of length len(values) + 1 (the last slot: the maximum)."""
    import cupy

    v = np.asarray(values, dtype=np.int64)
    if v.size and (v.min() < 0 or v.max() > _INT_MAX):
        raise ValueError(f"{what} out of magma_int_t range")
    out = np.zeros(v.size + 1, dtype=np.int32)
    out[:-1] = v
    out[-1] = v.max() if v.size else 0
    return cupy.asarray(out)


def _dev_pointers(batch):
    """A device array of k pointers, matrix i at ``data + offset[i]`` (in bytes)."""
    import cupy

    base = int(batch.data.data.ptr)
    ptrs = np.asarray(batch.offset, dtype=np.int64) * batch.dtype.itemsize + base
    return cupy.asarray(ptrs.view(np.uint64))


def _check_cupy(*batches) -> str:
    """The precision letter of same-dtype, same-k, device batches; else ValueError."""
    dts = {b.dtype for b in batches}
    ks = {b.k for b in batches}
    if len(dts) != 1 or len(ks) != 1:
        raise ValueError(f"operands differ in dtype or batch size: {dts}, {ks}")
    dt = dts.pop()
    if dt not in _PREFIX:
        raise ValueError(f"MAGMA binding supports float64, float32 and their complex types, "
                         f"got {dt}")
    for b in batches:
        if b.kind != "cupy":
            raise ValueError("MAGMA needs device (cupy) batches")
    return _PREFIX[dt]


def _col_major(b, what: str) -> None:
    if b.order != "F":
        raise ValueError(f"{what}: MAGMA is column-major, this batch is order {b.order!r}")


def _maxi(v: np.ndarray) -> int:
    return int(v.max()) if len(v) else 0


class Magma:
    """``libmagma_vb.so`` loaded, initialized, and one MAGMA queue on CuPy's current stream.

    The queue wraps the stream current at construction and CuPy's cuBLAS handle of the current
    device (MAGMA sets that stream on the handle; CuPy sets its own stream on the handle before
    each of its cuBLAS calls). MAGMA creates, and destroys in :meth:`close`, a cuSPARSE handle
    of its own (it is given NULL). Use it from the stream it was made on."""

    def __init__(self, path: str):
        import cupy

        self.path = path
        # CuPy's handle first: that loads CuPy's libcublas, which the library's DT_NEEDED
        # libcublas.so.N then resolves to (same SONAME), so both use one cuBLAS.
        self.device = cupy.cuda.Device().id
        self.stream = cupy.cuda.get_current_stream().ptr
        self.cublas = cupy.cuda.device.get_cublas_handle()
        self.lib = ctypes.CDLL(path)
        self._bound: dict[str, Any] = {}
        for name, sig in _COMMON.items():
            self._fn(name, sig)
        ret = self._fn("magma_init")()
        if ret != 0:
            raise RuntimeError(f"magma_init() returned {ret}")
        self._inited = True
        q = _PTR()
        self._fn("magma_queue_create_from_cuda_internal")(
            self.device, self.stream, self.cublas, None, ctypes.byref(q),
            b"Magma", b"benchmarks/magma.py", 0)
        if not q.value:
            self.close()
            raise RuntimeError("magma_queue_create_from_cuda returned no queue")
        self.queue = q

    # ------------------------------------------------------------------ plumbing
    def _fn(self, name: str, sig: tuple[Any, list] | None = None):
        fn = self._bound.get(name)
        if fn is None:
            if sig is None:
                sig = _COMMON[name]
            fn = getattr(self.lib, name)
            fn.restype, fn.argtypes = sig
            self._bound[name] = fn
        return fn

    @staticmethod
    def routine_name(op: str, dtype) -> str:
        """The C name of ``op``'s (potrf, gemm, syrk, trsm) ``*_vbatched_max_nocheck`` routine."""
        x = dtype if isinstance(dtype, str) and dtype in _REAL else _PREFIX[np.dtype(dtype)]
        if op == "getrf":  # (the variant given its workspace: nothing allocated per call)
            return f"magma_{x}getrf_vbatched_max_nocheck_work"
        lib = "magma" if op == "potrf" else "magmablas"
        return f"{lib}_{x}{op}_vbatched_max_nocheck"

    def has(self, op: str, dtype) -> bool:
        """Whether the loaded library exports ``op``'s routine for ``dtype`` (a build of another
        subset may lack it)."""
        return hasattr(self.lib, self.routine_name(op, dtype))

    def _routine(self, x: str, op: str):
        name = self.routine_name(op, x)
        return name, self._fn(name, _signatures(x)[name])

    def version(self) -> str:
        v = [ctypes.c_int() for _ in range(3)]
        self._fn("magma_version")(*[ctypes.byref(i) for i in v])
        return ".".join(str(i.value) for i in v)

    def potrf_crossover(self, dtype) -> int:
        """max_n above which POTRF leaves its fused path (and allocates on every call)."""
        x = _PREFIX[np.dtype(dtype)]
        name = f"magma_get_{x}potrf_vbatched_crossover"
        return int(self._fn(name, _signatures(x)[name])())

    def sync(self) -> None:
        """magma_queue_sync: GEMM, SYRK and TRSM return without one (POTRF ends with one)."""
        self._fn("magma_queue_sync_internal")(self.queue, b"Magma.sync", b"benchmarks/magma.py",
                                              0)

    def close(self) -> None:
        q = getattr(self, "queue", None)
        if q is not None and q.value:
            self._fn("magma_queue_destroy_internal")(q, b"Magma.close", b"benchmarks/magma.py", 0)
        self.queue = None
        if getattr(self, "_inited", False):
            self._fn("magma_finalize")()
            self._inited = False

    def __enter__(self) -> "Magma":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ POTRF
    def prepare_potrf(self, batch, uplo: str = "L") -> Prepared:
        """``magma_Xpotrf_vbatched_max_nocheck(MagmaLower, n, dA_array, ldda, info, k, max_n,
        queue)`` on ``batch`` in place.

        ``batch``: square, float64 or float32, on the device. Order "F"; order "C" is accepted
        for symmetric input (row-major storage of a symmetric matrix is its column-major
        storage), but then the factor L is column-major: read row-major, the buffer holds L^T
        in its upper triangle. MAGMA supports only the lower triangle. MAGMA writes ``info``
        only for matrices that fail, so zero it (``prepared.info.fill(0)``) before reusing it
        after a failure; it is zeroed here."""
        import cupy

        if uplo != "L":
            raise ValueError("MAGMA's potrf_vbatched supports only uplo='L'")
        x = _check_cupy(batch)
        if not batch.square:
            raise ValueError("potrf needs square matrices")
        n = np.asarray(batch.n)
        d_n, d_ld = _dev_ints(n, "n"), _dev_ints(batch.ld, "ld")
        d_a = _dev_pointers(batch)
        info = cupy.zeros(batch.k, dtype=np.int32)
        name, fn = self._routine(x, "potrf")
        args = (UPLO["L"], d_n.data.ptr, d_a.data.ptr, d_ld.data.ptr, info.data.ptr, batch.k,
                _maxi(n), self.queue)
        args = _args(args, fn.argtypes)
        return Prepared(name, fn, args, (batch.data, d_n, d_ld, d_a, info), batch.k, info)

    def potrf_vbatched(self, call: Prepared):
        """The call, synchronous (MAGMA ends it with a queue sync). Returns the info array."""
        ret = call.fn(*call.args)
        if ret != 0:
            raise RuntimeError(f"{call.routine} returned {ret}")
        return call.info

    # ------------------------------------------------------------------ GETRF
    def prepare_getrf(self, batch) -> Prepared:
        """``magma_Xgetrf_vbatched_max_nocheck_work(m, n, max_m, max_n, max_minmn, max_mxn,
        dA_array, ldda, dipiv_array, info, work, &lwork, k, queue)``: LU with partial pivoting
        in place on ``batch`` (column-major, any m x n), its workspace asked for and allocated
        here, once. ``prepared.ipiv`` holds the pivots (1-based, LAPACK's), ``min(m, n)`` from
        each matrix's ``prepared.ipiv_offset``; ``prepared.info`` is zeroed here (MAGMA writes
        only failures). Asynchronous: synchronize the stream."""
        import cupy

        x = _check_cupy(batch)
        _col_major(batch, "A")
        m, n = np.asarray(batch.m, np.int64), np.asarray(batch.n, np.int64)
        r = np.minimum(m, n)
        d_m, d_n, d_ld = _dev_ints(m, "m"), _dev_ints(n, "n"), _dev_ints(batch.ld, "ld")
        d_a = _dev_pointers(batch)
        off = np.concatenate([[0], np.cumsum(np.maximum(r, 1))]).astype(np.int64)
        ipiv = cupy.zeros(int(off[-1]) or 1, dtype=np.int32)
        d_piv = cupy.asarray((np.uint64(ipiv.data.ptr) + off[:-1].astype(np.uint64) * 4))
        info = cupy.zeros(batch.k, dtype=np.int32)
        name, fn = self._routine(x, "getrf")
        maxes = (_maxi(m), _maxi(n), _maxi(r), _maxi(m * n))
        lwork = _INT(-1)
        fn(None, None, *maxes, None, None, None, None, None, ctypes.byref(lwork), batch.k,
           self.queue)
        work = cupy.empty(max(int(lwork.value), 1), dtype=np.uint8)
        args = (d_m.data.ptr, d_n.data.ptr, *maxes, d_a.data.ptr, d_ld.data.ptr,
                d_piv.data.ptr, info.data.ptr, work.data.ptr, ctypes.pointer(lwork), batch.k,
                self.queue)
        args = tuple(v if isinstance(v, (_PTR, ctypes._Pointer)) else t(v)
                     for v, t in zip(args, fn.argtypes))
        call = Prepared(name, fn, args, (batch.data, d_m, d_n, d_ld, d_a, ipiv, d_piv, work,
                                         lwork), batch.k, info)
        call.ipiv, call.ipiv_offset = ipiv, off[:-1]
        return call

    def getrf_vbatched(self, call: Prepared):
        """The call (asynchronous on the queue's stream). Returns the info array."""
        ret = call.fn(*call.args)
        if ret != 0:
            raise RuntimeError(f"{call.routine} returned {ret}")
        return call.info

    # ------------------------------------------------------------------ GEMM
    def prepare_gemm(self, a, b, c, trans_a: str = "N", trans_b: str = "N",
                     alpha: float = 1.0, beta: float = 1.0) -> Prepared:
        """C_i = alpha op(A_i) op(B_i) + beta C_i, in place on ``c``; op = "N" or "T".

        ``magmablas_Xgemm_vbatched_max_nocheck(transA, transB, m, n, k, alpha, dA, ldda, dB,
        lddb, beta, dC, lddc, batchCount, max_m, max_n, max_k, queue)``: batchCount BEFORE the
        max sizes (the header has them after; the definition and MAGMA's callers do not).
        Asynchronous on the queue's stream: call :meth:`sync` or synchronize the stream."""
        x = _check_cupy(a, b, c)
        for o, w in ((a, "A"), (b, "B"), (c, "C")):
            _col_major(o, w)
        m, n = np.asarray(c.m), np.asarray(c.n)
        ka = np.asarray(a.n if trans_a == "N" else a.m)
        ma = np.asarray(a.m if trans_a == "N" else a.n)
        kb = np.asarray(b.m if trans_b == "N" else b.n)
        nb = np.asarray(b.n if trans_b == "N" else b.m)
        if not (np.array_equal(ma, m) and np.array_equal(nb, n) and np.array_equal(ka, kb)):
            raise ValueError("gemm: op(A) is m x k, op(B) k x n, C m x n, per problem")
        d_m, d_n, d_k = _dev_ints(m, "m"), _dev_ints(n, "n"), _dev_ints(ka, "k")
        lda, ldb, ldc = _dev_ints(a.ld, "lda"), _dev_ints(b.ld, "ldb"), _dev_ints(c.ld, "ldc")
        pa, pb, pc = _dev_pointers(a), _dev_pointers(b), _dev_pointers(c)
        name, fn = self._routine(x, "gemm")
        args = (TRANS[trans_a], TRANS[trans_b], d_m.data.ptr, d_n.data.ptr, d_k.data.ptr, alpha,
                pa.data.ptr, lda.data.ptr, pb.data.ptr, ldb.data.ptr, beta, pc.data.ptr,
                ldc.data.ptr, c.k, _maxi(m), _maxi(n), _maxi(ka), self.queue)
        args = _args(args, fn.argtypes)
        keep = (a.data, b.data, c.data, d_m, d_n, d_k, lda, ldb, ldc, pa, pb, pc)
        return Prepared(name, fn, args, keep, c.k)

    # ------------------------------------------------------------------ SYRK
    def prepare_syrk(self, a, c, uplo: str = "L", trans: str = "N", alpha: float = 1.0,
                     beta: float = 1.0) -> Prepared:
        """C_i = alpha A_i A_i^T + beta C_i (trans "N", A_i n x k) or alpha A_i^T A_i + beta C_i
        (trans "T", A_i k x n), the ``uplo`` triangle of C only, in place on ``c``.

        ``magmablas_Xsyrk_vbatched_max_nocheck(uplo, trans, n, k, alpha, dA, ldda, beta, dC,
        lddc, batchCount, max_n, max_k, queue)``. Asynchronous, as GEMM."""
        x = _check_cupy(a, c)
        _col_major(a, "A")
        _col_major(c, "C")
        if not c.square:
            raise ValueError("syrk: C must be square")
        n = np.asarray(c.n)
        na = np.asarray(a.m if trans == "N" else a.n)
        kk = np.asarray(a.n if trans == "N" else a.m)
        if not np.array_equal(na, n):
            raise ValueError("syrk: op(A) must have C's rows")
        d_n, d_k = _dev_ints(n, "n"), _dev_ints(kk, "k")
        lda, ldc = _dev_ints(a.ld, "lda"), _dev_ints(c.ld, "ldc")
        pa, pc = _dev_pointers(a), _dev_pointers(c)
        name, fn = self._routine(x, "syrk")
        args = (UPLO[uplo], TRANS[trans], d_n.data.ptr, d_k.data.ptr, alpha, pa.data.ptr,
                lda.data.ptr, beta, pc.data.ptr, ldc.data.ptr, c.k, _maxi(n), _maxi(kk),
                self.queue)
        args = _args(args, fn.argtypes)
        return Prepared(name, fn, args, (a.data, c.data, d_n, d_k, lda, ldc, pa, pc), c.k)

    # ------------------------------------------------------------------ TRSM
    def prepare_trsm(self, a, b, side: str = "L", uplo: str = "L", trans: str = "N",
                     diag: str = "N", alpha: float = 1.0) -> Prepared:
        """Solve op(A_i) X_i = alpha B_i (side "L") or X_i op(A_i) = alpha B_i (side "R"), X
        over B in place; A_i triangular (``uplo``), m x m or n x n for B_i m x n.

        ``magmablas_Xtrsm_vbatched_max_nocheck(side, uplo, transA, diag, max_m, max_n, m, n,
        alpha, dA, ldda, dB, lddb, batchCount, queue)``: here the max sizes come FIRST.
        Asynchronous, as GEMM."""
        x = _check_cupy(a, b)
        _col_major(a, "A")
        _col_major(b, "B")
        if not a.square:
            raise ValueError("trsm: A must be square")
        m, n = np.asarray(b.m), np.asarray(b.n)
        if not np.array_equal(np.asarray(a.n), m if side == "L" else n):
            raise ValueError("trsm: A must be m x m (side L) or n x n (side R)")
        d_m, d_n = _dev_ints(m, "m"), _dev_ints(n, "n")
        lda, ldb = _dev_ints(a.ld, "lda"), _dev_ints(b.ld, "ldb")
        pa, pb = _dev_pointers(a), _dev_pointers(b)
        name, fn = self._routine(x, "trsm")
        args = (SIDE[side], UPLO[uplo], TRANS[trans], DIAG[diag], _maxi(m), _maxi(n),
                d_m.data.ptr, d_n.data.ptr, alpha, pa.data.ptr, lda.data.ptr, pb.data.ptr,
                ldb.data.ptr, b.k, self.queue)
        args = _args(args, fn.argtypes)
        return Prepared(name, fn, args, (a.data, b.data, d_m, d_n, lda, ldb, pa, pb), b.k)

    # ------------------------------------------------------------------ the calls
    @staticmethod
    def gemm_vbatched(call: Prepared) -> None:
        call.fn(*call.args)

    @staticmethod
    def syrk_vbatched(call: Prepared) -> None:
        call.fn(*call.args)

    @staticmethod
    def trsm_vbatched(call: Prepared) -> None:
        call.fn(*call.args)

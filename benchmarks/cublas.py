"""cuBLAS through ctypes, for the benchmarks' anchor columns: the calls CuPy does not expose.

    blas = Cublas(find_libcublas())                 # after CuPy has loaded its cuBLAS
    blas.gemm_strided_batched("float64", m, n, k, 1.0, a, lda, sa, b, ldb, sb, 1.0, c, ldc, sc,
                              count)                # column-major, NN, strides in elements
    blas.trsm_batched("float64", SIDE_LEFT, FILL_LOWER, OP_N, DIAG_NON_UNIT, m, n, 1.0,
                      a_ptrs, lda, b_ptrs, ldb, count)
    call = GroupedCall(...); blas.gemm_grouped(call)  # cublasGemmGroupedBatchedEx
    blas.close()

Every pointer is a plain int (a device address); ``a_ptrs``/``b_ptrs`` are device arrays of
device pointers. The handle is this module's own (``cublasCreate``), bound to the stream given
at construction, in host pointer mode (scalars and the grouped call's per-group arrays are host
memory, as the cuBLAS docs and NVIDIA's CUDALibrarySamples GemmGroupedBatchedEx example have it).

**Which library.** CuPy loads a ``libcublas.so.N`` (from the CUDA toolkit or from the nvidia-*
pip packages, depending on the install). :func:`find_libcublas` returns that very file, read
from ``/proc/self/maps`` once CuPy has created its handle, so both use one cuBLAS; only when no
cuBLAS is mapped yet does it look in the nvidia-* packages, ``$CUDA_HOME``/``$CUDA_PATH`` and
the linker's path.

Signatures and enum values (cublas_api.h, library_types.h; the same in CUDA 12 and 13):
``cublasDgemmStridedBatched(handle, transa, transb, m, n, k, const double *alpha,
const double *A, int lda, long long strideA, const double *B, int ldb, long long strideB,
const double *beta, double *C, int ldc, long long strideC, int batchCount)``;
``cublasDtrsmBatched(handle, side, uplo, trans, diag, m, n, const double *alpha,
const double *const A[], int lda, double *const B[], int ldb, int batchCount)``;
``cublasGemmGroupedBatchedEx(handle, const cublasOperation_t transa_array[], transb_array[],
const int m_array[], n_array[], k_array[], const void *alpha_array, const void *const Aarray[],
cudaDataType_t Atype, const int lda_array[], const void *const Barray[], cudaDataType_t Btype,
const int ldb_array[], const void *beta_array, void *const Carray[], cudaDataType_t Ctype,
const int ldc_array[], int group_count, const int group_size[], cublasComputeType_t)``
(cuBLAS >= 12.5). The ``S`` variants take ``float``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OP_N, OP_T = 0, 1  # cublasOperation_t
SIDE_LEFT, SIDE_RIGHT = 0, 1  # cublasSideMode_t
FILL_LOWER, FILL_UPPER = 0, 1  # cublasFillMode_t
DIAG_NON_UNIT, DIAG_UNIT = 0, 1  # cublasDiagType_t
POINTER_MODE_HOST = 0  # cublasPointerMode_t
CUDA_R_32F, CUDA_R_64F = 0, 1  # cudaDataType_t
COMPUTE_32F, COMPUTE_64F = 68, 70  # cublasComputeType_t (32F: no TF32 down-conversion)

_P, _I, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
_PREFIX = {"float64": "D", "float32": "S"}
_SCALAR = {"float64": ctypes.c_double, "float32": ctypes.c_float}
_DATA_TYPE = {"float64": CUDA_R_64F, "float32": CUDA_R_32F}
_COMPUTE = {"float64": COMPUTE_64F, "float32": COMPUTE_32F}
GROUPED = "cublasGemmGroupedBatchedEx"
GROUPED_MIN_VERSION = 120500  # cublasGetVersion's encoding: major * 10000 + minor * 100 + patch

_STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE",
           8: "ARCH_MISMATCH", 11: "MAPPING_ERROR", 13: "EXECUTION_FAILED",
           14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED", 16: "LICENSE_ERROR"}


def _is_cublas(path: str) -> bool:
    """``libcublas.so`` or ``libcublas.so.N[.M...]``, not libcublasLt."""
    base = os.path.basename(path)
    return base == "libcublas.so" or base.startswith("libcublas.so.")


def mapped_libcublas(maps_text: str) -> list[str]:
    """The libcublas files mapped in a process, in order of appearance, from the text of its
    ``/proc/<pid>/maps`` (the path is the sixth field)."""
    out: list[str] = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            if _is_cublas(path) and path not in out:
                out.append(path)
    return out


def candidate_libcublas() -> list[str]:
    """Files that may be libcublas when none is loaded yet: the nvidia-* pip packages (CUDA 12
    ``nvidia/cublas/lib``, CUDA 13 ``nvidia/cu13/lib``), ``$CUDA_HOME``/``$CUDA_PATH``, the
    usual toolkit folder, then the linker's search (``ctypes.util.find_library``)."""
    dirs: list[str] = []
    try:
        import nvidia  # the namespace package of the nvidia-* wheels

        for p in nvidia.__path__:
            dirs += sorted(glob.glob(os.path.join(p, "*", "lib")))
    except ImportError:
        pass
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            dirs += [os.path.join(os.environ[env], d) for d in ("lib64", "lib")]
    dirs += ["/usr/local/cuda/lib64"]
    found: list[str] = []
    for d in dirs:
        for f in sorted(glob.glob(os.path.join(d, "libcublas.so*")), reverse=True):
            if _is_cublas(f) and f not in found:
                found.append(f)
    lib = ctypes.util.find_library("cublas")
    if lib:
        found.append(lib)
    return found


def find_libcublas() -> tuple[str, str]:
    """``(path, how it was found)``. Call it after CuPy has created its cuBLAS handle
    (``cupy.cuda.device.get_cublas_handle()``), so that the answer is CuPy's own library.

    Raises ``FileNotFoundError`` naming every place looked in."""
    try:
        with open("/proc/self/maps") as f:
            mapped = mapped_libcublas(f.read())
    except OSError:
        mapped = []
    if mapped:
        how = "mapped in this process (CuPy's)"
        if len(mapped) > 1:
            how += f"; {len(mapped)} mapped: {', '.join(mapped)}"
        return mapped[0], how
    cands = candidate_libcublas()
    if cands:
        return cands[0], "searched (none mapped yet): " + ", ".join(cands)
    raise FileNotFoundError("libcublas: none mapped in this process, none in the nvidia-* "
                            "packages, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda/lib64 or the "
                            "linker's path")


@dataclass
class GroupedCall:
    """One ``cublasGemmGroupedBatchedEx`` call, ``C_j := alpha_g op(A_j) op(B_j) + beta_g C_j``,
    everything column-major. Per group (host arrays, length G): ``m``, ``n``, ``k``, ``lda``,
    ``ldb``, ``ldc``, ``alpha``, ``beta``, ``group_size``; ``trans_a``/``trans_b`` per group
    too (OP_N/OP_T). Per problem (device arrays of sum(group_size) pointers, given by address):
    ``a_ptrs``, ``b_ptrs``, ``c_ptrs``. ``keep`` holds whatever those addresses live in."""

    dtype: str
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    lda: np.ndarray
    ldb: np.ndarray
    ldc: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    group_size: np.ndarray
    a_ptrs: int
    b_ptrs: int
    c_ptrs: int
    trans_a: np.ndarray | None = None
    trans_b: np.ndarray | None = None
    keep: tuple = ()
    _args: tuple | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        g = len(self.m)
        as_i32 = ("m", "n", "k", "lda", "ldb", "ldc", "group_size")
        for name in as_i32:
            v = np.ascontiguousarray(getattr(self, name), dtype=np.int32)
            if v.shape != (g,):
                raise ValueError(f"GroupedCall.{name} has shape {v.shape}, expected ({g},)")
            setattr(self, name, v)
        for name in ("trans_a", "trans_b"):
            v = getattr(self, name)
            v = np.full(g, OP_N, np.int32) if v is None else np.ascontiguousarray(v, np.int32)
            setattr(self, name, v)
        for name in ("alpha", "beta"):
            v = np.ascontiguousarray(np.broadcast_to(getattr(self, name), (g,)),
                                     dtype=np.dtype(self.dtype))
            setattr(self, name, v)

    @property
    def problems(self) -> int:
        return int(self.group_size.sum())


class CublasError(RuntimeError):
    pass


class Cublas:
    """libcublas loaded (``path``), one handle of its own on ``stream`` (a ``cudaStream_t`` as an
    int; 0 is the legacy default stream)."""

    def __init__(self, path: str, stream: int = 0):
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.handle = _P()
        self._bound: dict[str, Any] = {}
        self._call("Create", [ctypes.POINTER(_P)], ctypes.byref(self.handle))
        try:
            self._call("SetStream", [_P, _P], self.handle, stream)
            self._call("SetPointerMode", [_P, _I], self.handle, POINTER_MODE_HOST)
            v = _I()
            self._call("GetVersion", [_P, ctypes.POINTER(_I)], self.handle, ctypes.byref(v))
            self.version = int(v.value)
        except Exception:
            self.close()
            raise

    # ------------------------------------------------------------------ plumbing
    def has(self, name: str) -> bool:
        return hasattr(self.lib, name)

    def _fn(self, name: str, argtypes: list):
        fn = self._bound.get(name)
        if fn is None:
            # The handle functions are exported as cublasX_v2 (cublas_v2.h maps cublasX to it).
            for cand in (f"cublas{name}_v2", f"cublas{name}", name):
                if hasattr(self.lib, cand):
                    fn = getattr(self.lib, cand)
                    break
            else:
                raise CublasError(f"{self.path} exports no cublas{name}_v2 / cublas{name}")
            fn.restype = _I
            fn.argtypes = argtypes
            self._bound[name] = fn
        return fn

    def _call(self, name: str, argtypes: list, *args) -> None:
        status = self._fn(name, argtypes)(*args)
        if status != 0:
            raise CublasError(f"cublas{name} returned {status} "
                              f"(CUBLAS_STATUS_{_STATUS.get(status, '?')})")

    def version_string(self) -> str:
        v = self.version
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"

    def grouped_status(self) -> str | None:
        """None when the grouped GEMM can run, else why not."""
        if self.version < GROUPED_MIN_VERSION:
            return (f"cuBLAS {self.version_string()} has no {GROUPED} (needs 12.5 or later; "
                    f"{self.path})")
        if not self.has(GROUPED):
            return f"{self.path} (cuBLAS {self.version_string()}) does not export {GROUPED}"
        return None

    def close(self) -> None:
        if getattr(self, "handle", None) is not None and self.handle.value:
            self._call("Destroy", [_P], self.handle)
        self.handle = None

    def __enter__(self) -> "Cublas":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ the calls
    def gemm_strided_batched(self, dtype: str, m: int, n: int, k: int, alpha: float, a: int,
                             lda: int, stride_a: int, b: int, ldb: int, stride_b: int,
                             beta: float, c: int, ldc: int, stride_c: int, count: int) -> None:
        """``C_i := alpha A_i B_i + beta C_i`` (no transposes), ``X_i`` at ``x + i * stride_x``
        elements, column-major."""
        t = _SCALAR[dtype]
        name = f"{_PREFIX[dtype]}gemmStridedBatched"
        argtypes = [_P, _I, _I, _I, _I, _I, _P, _P, _I, _LL, _P, _I, _LL, _P, _P, _I, _LL, _I]
        al, be = t(alpha), t(beta)
        self._call(name, argtypes, self.handle, OP_N, OP_N, m, n, k, ctypes.addressof(al), a,
                   lda, stride_a, b, ldb, stride_b, ctypes.addressof(be), c, ldc, stride_c,
                   count)

    def trsm_batched(self, dtype: str, side: int, uplo: int, trans: int, diag: int, m: int,
                     n: int, alpha: float, a_ptrs: int, lda: int, b_ptrs: int, ldb: int,
                     count: int) -> None:
        """``op(A_i) X_i = alpha B_i`` (side left) or ``X_i op(A_i) = alpha B_i``, X over B;
        ``a_ptrs``/``b_ptrs``: device arrays of ``count`` device pointers."""
        t = _SCALAR[dtype]
        name = f"{_PREFIX[dtype]}trsmBatched"
        argtypes = [_P, _I, _I, _I, _I, _I, _I, _P, _P, _I, _P, _I, _I]
        al = t(alpha)
        self._call(name, argtypes, self.handle, side, uplo, trans, diag, m, n,
                   ctypes.addressof(al), a_ptrs, lda, b_ptrs, ldb, count)

    def gemm_grouped(self, call: GroupedCall) -> None:
        """The one ``cublasGemmGroupedBatchedEx`` call; its host arguments are marshalled once,
        on the first call, and kept on ``call``."""
        if call._args is None:
            dt = _DATA_TYPE[call.dtype]
            call._args = (
                self.handle, call.trans_a.ctypes.data, call.trans_b.ctypes.data,
                call.m.ctypes.data, call.n.ctypes.data, call.k.ctypes.data,
                call.alpha.ctypes.data, call.a_ptrs, dt, call.lda.ctypes.data,
                call.b_ptrs, dt, call.ldb.ctypes.data, call.beta.ctypes.data,
                call.c_ptrs, dt, call.ldc.ctypes.data, len(call.m),
                call.group_size.ctypes.data, _COMPUTE[call.dtype])
        argtypes = [_P, _P, _P, _P, _P, _P, _P, _P, _I, _P, _P, _I, _P, _P, _P, _I, _P, _I, _P,
                    _I]
        fn = self._fn(GROUPED, argtypes)
        status = fn(*call._args)
        if status != 0:
            raise CublasError(f"{GROUPED} returned {status} "
                              f"(CUBLAS_STATUS_{_STATUS.get(status, '?')})")


if __name__ == "__main__":  # where is it, and which version (needs CuPy and a GPU)
    import cupy

    cupy.cuda.device.get_cublas_handle()
    path, how = find_libcublas()
    with Cublas(path) as blas:
        print(f"{path}: cuBLAS {blas.version_string()} ({how}); grouped GEMM: "
              f"{blas.grouped_status() or 'available'}")

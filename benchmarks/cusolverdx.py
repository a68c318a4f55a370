"""cuSOLVERDx's Cholesky, the small-size anchor of the POTRF sweep (``sweep.py --cusolverdx``).

cuSOLVERDx (NVIDIA MathDx) builds a Cholesky of one fixed order into a kernel: a CUDA block
factors ``batches_per_block`` matrices in shared memory. nvmath-python's device API exposes it
to numba-cuda kernels (``nvmath.device.Solver(function="potrf", ...)``). It has no ragged form, so
this anchor does what a user of it would: sizes go to 8-wide buckets, and each bucket is one
launch of a kernel that reads its matrices where they lie in a column-major ``PackedBatch``
(offset and leading dimension per matrix), pads each to the bucket's order with the identity in
shared memory, factors, and writes the factors back in place:

    dx = CuSolverDx(".dxsite")                 # the wheels of ../shared/anchors/cusolverdx
    call = dx.prepare_potrf(batch)             # buckets and kernels (compiled here, not timed)
    ms = dx.time_potrf(call, reps, restore)    # GPU time of the launches, ms per call

Its times are **GPU time** (CUDA events around the launches, queued behind a spin kernel so
that the host has issued every launch before the first event): numba-cuda's launch path costs
tens of microseconds a launch from Python, which a C++ user of cuSOLVERDx does not pay. The
anchor is then as strong as the library can be, and stronger than the wall-clock times the
sweep gives vbatch and MAGMA.

Setting up (../shared/anchors/cusolverdx/README.md): the wheel group g1 (nvmath-python,
numba-cuda, libmathdx, cuda-bindings/core/pathfinder) installed with ``--target`` into a folder
(``.dxsite``); the image's numba underneath. Compiling costs ~10 s a bucket and dtype.
"""

from __future__ import annotations

import ctypes
import glob
import os
import site
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

BUCKET = 8


def _setup(dxsite: str):
    """Import numba-cuda and nvmath's device API from ``dxsite`` (a ``--target`` install):
    its .pth files run (numba-cuda's makes ``numba.cuda`` its own), CUDA_HOME points at the
    toolkit for libnvvm, and libmathdx is loaded by path (cuda.pathfinder does not search a
    ``--target`` folder)."""
    dxsite = os.path.abspath(dxsite)
    if not os.path.isdir(dxsite):
        raise SystemExit(f"--cusolverdx: no folder {dxsite} (install the wheel group g1 there)")
    if dxsite not in sys.path:
        sys.path.insert(0, dxsite)
    site.addsitedir(dxsite)
    if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")):
        for cand in ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-1*"), reverse=True)]:
            if os.path.isdir(os.path.join(cand, "nvvm")):
                os.environ["CUDA_HOME"] = cand
                break
    os.environ.setdefault("LIBMATHDX_ENABLE_PCH", "1")  # (libmathdx's NVRTC, ~40% faster)
    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
    from cuda import pathfinder

    pathfinder.load_nvidia_dynamic_lib("nvrtc")
    for sub in ("nvidia/cu13/lib", "nvidia/cu12/lib"):
        so = os.path.join(dxsite, sub, "libmathdx.so.0")
        if os.path.isfile(so):
            ctypes.CDLL(so, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
            break
    if "row_stack" not in np.__dict__:  # (numba-cuda 0.30 still names it; numpy 2.4 dropped it)
        np.row_stack = np.vstack
    import numba.cuda

    if "numba_cuda" not in (numba.cuda.__file__ or ""):
        raise SystemExit(f"--cusolverdx: numba.cuda is {numba.cuda.__file__}, not numba-cuda")
    import nvmath
    import nvmath.device  # noqa: F401 - registers its numba extensions

    return numba.cuda, nvmath.__version__


@dataclass
class _Kernel:
    nb: int
    bpb: int
    block: tuple
    smem: int
    compiled: Any
    seconds: float


@dataclass
class Prepared:
    """One batch's buckets: (kernel, count, device arrays of offsets, orders, leading
    dimensions, info) per bucket, largest first; what the launches hold."""

    buckets: list
    data: Any
    keep: list = field(default_factory=list)


class CuSolverDx:
    def __init__(self, dxsite: str):
        self.cuda, self.version = _setup(dxsite)
        import cupy

        self.cupy = cupy
        dev = cupy.cuda.Device()
        self.smem_max = int(dev.attributes["MaxSharedMemoryPerBlockOptin"])
        self.khz = int(dev.attributes["ClockRate"])
        self._kernels: dict = {}
        self._spin = cupy.RawKernel(
            "extern \"C\" __global__ void spin(long long cycles) {"
            " long long t0 = clock64(); while (clock64() - t0 < cycles) { } }", "spin")

    def max_order(self, dtype) -> int:
        """The largest bucket whose one matrix fits in a block's shared memory."""
        nb = int(np.sqrt(self.smem_max / np.dtype(dtype).itemsize)) // BUCKET * BUCKET
        return nb

    def kernel(self, nb: int, dtype) -> _Kernel:
        key = (nb, np.dtype(dtype).name)
        hit = self._kernels.get(key)
        if hit is None:
            hit = self._kernels[key] = self._build(nb, np.dtype(dtype))
        return hit

    def _build(self, nb: int, dtype) -> _Kernel:
        from numba import types
        from nvmath.device import Solver

        cuda = self.cuda
        t0 = time.perf_counter()
        bpb = "suggested"
        if nb * nb * dtype.itemsize * 2 > self.smem_max:
            bpb = 1  # (two matrices a block would not fit)
        s = Solver(function="potrf", size=(nb, nb), precision=dtype.type, execution="Block",
                   fill_mode="lower", arrangement=("col_major", "col_major"),
                   batches_per_block=bpb, block_dim="suggested")
        per, block = int(s.batches_per_block), tuple(int(x) for x in s.block_dim)
        vt, nn = s.value_type, nb * nb
        one, zero = vt(1), vt(0)

        @cuda.jit
        def potrf_bucket(a, off, n, ld, count, info):
            # matrices first .. first + per - 1 of the bucket, padded to nb x nb in shared memory
            sm = cuda.shared.array(shape=(0,), dtype=vt, alignment=16)
            tid = cuda.threadIdx.x + cuda.blockDim.x * (
                cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)
            step = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z
            first = cuda.blockIdx.x * per
            for e in range(tid, per * nn, step):
                g = first + e // nn
                j = (e % nn) // nb
                i = e % nb
                v = one if i == j else zero
                if g < count and i < n[g] and j < n[g]:
                    v = a[off[g] + i + j * ld[g]]
                sm[e] = v
            cuda.syncthreads()
            s.execute(sm, info[first:])
            cuda.syncthreads()
            for e in range(tid, per * nn, step):
                g = first + e // nn
                j = (e % nn) // nb
                i = e % nb
                if g < count and i < n[g] and j < n[g]:
                    a[off[g] + i + j * ld[g]] = sm[e]

        real = types.float64 if dtype == np.float64 else types.float32
        sig = (types.Array(real, 1, "C"), types.Array(types.int64, 1, "C"),
               types.Array(types.int32, 1, "C"), types.Array(types.int32, 1, "C"), types.int64,
               types.Array(types.int32, 1, "C"))
        compiled = potrf_bucket.compile(sig)
        smem = per * nn * dtype.itemsize
        if smem > 48 * 1024:
            self._allow_smem(compiled, smem)
        return _Kernel(nb, per, block, smem, (potrf_bucket, compiled), time.perf_counter() - t0)

    @staticmethod
    def _allow_smem(compiled, nbytes: int) -> None:
        """Opt the kernel in to more than 48 KiB of dynamic shared memory (numba-cuda's
        kernels are CUkernel handles; older ones CUfunction)."""
        from numba.cuda.cudadrv.driver import binding, driver

        fn = compiled._codelibrary.get_cufunc()
        attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        try:
            driver.cuKernelSetAttribute(attr, nbytes, fn.handle, fn.device.id)
        except Exception:  # noqa: BLE001 - the CUfunction form of the same call
            driver.cuFuncSetAttribute(fn.handle, attr, nbytes)

    def prepare_potrf(self, batch) -> Prepared:
        """The buckets of a column-major ``PackedBatch`` (every order at most
        :meth:`max_order`), largest first, their kernels compiled."""
        cupy, cuda = self.cupy, self.cuda
        if batch.order != "F":
            raise ValueError("cuSOLVERDx's anchor reads column-major packs")
        n = np.asarray(batch.n, np.int64)
        top = self.max_order(batch.dtype)
        if len(n) and n.max() > top:
            raise ValueError(f"order {int(n.max())} is past cuSOLVERDx's largest bucket {top}")
        bucket = np.maximum(-(-n // BUCKET), 1) * BUCKET
        data = cuda.as_cuda_array(batch.data)
        out = Prepared([], data)
        for nb in sorted(set(bucket[n > 0].tolist()), reverse=True):
            kern = self.kernel(nb, batch.dtype)
            idx = np.flatnonzero((bucket == nb) & (n > 0))
            arrs = (cupy.asarray(np.asarray(batch.offset, np.int64)[idx]),
                    cupy.asarray(n[idx].astype(np.int32)),
                    cupy.asarray(np.asarray(batch.ld)[idx].astype(np.int32)),
                    cupy.zeros(-(-len(idx) // kern.bpb) * kern.bpb, np.int32))
            out.keep.append(arrs)
            out.buckets.append((kern, len(idx), *(cuda.as_cuda_array(x) for x in arrs)))
        return out

    def launch(self, call: Prepared) -> None:
        for kern, count, off, n, ld, info in call.buckets:
            grid = -(-count // kern.bpb)
            kern.compiled[0][grid, kern.block, 0, kern.smem](call.data, off, n, ld, count, info)

    def info(self, call: Prepared) -> int:
        """Failed matrices in the last call (all the anchor's inputs are SPD: 0)."""
        return int(sum(int((self.cupy.asarray(b[5]) != 0).sum()) for b in call.buckets))

    def time_potrf(self, call: Prepared, reps: int, restore) -> float:
        """Median GPU time (ms) of the call's launches, ``restore()`` (untimed) before each,
        after one warm-up call."""
        cupy = self.cupy
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        restore()
        self.launch(call)
        cupy.cuda.Device().synchronize()
        ts = []
        for _ in range(reps):
            restore()
            cupy.cuda.Device().synchronize()
            # (the spin covers the host's issue of every launch: 25 us a bucket is generous)
            self._spin((1,), (1,), (np.int64(self.khz * (0.2 + 0.05 * len(call.buckets))),))
            e0.record()
            self.launch(call)
            e1.record()
            e1.synchronize()
            ts.append(cupy.cuda.get_elapsed_time(e0, e1))
        return float(np.median(ts))

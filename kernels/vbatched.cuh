// vbatch: what every vbatched kernel starts with.
//
// A launch covers rows [lo, hi) of its plan's task table; block b of the launch (gridDim.x)
// takes task lo + b. A task row is VB_TASK_COLS ints: the problem (the caller's index) and the
// task's arguments (a0, a1, ...; what they mean is the operation's). Per-problem arrays, uploaded
// once per batch layout, are indexed by the problem.
//
// Compiled behind the generated preamble (kernels/cuda_build.py: VB_TASK_COLS and the other
// constants Python and the kernels share), before the operation's .cu file.

#pragma once

namespace vb {

struct Task {
  int q;   // the problem
  int a0;  // the task's arguments
  int a1;
  int a2;
};

// The task of warp `warp` of a launch that runs `per_block` tasks per block (several small tasks
// in one block, each warp its own): task lo + blockIdx.x * per_block + warp. False when past hi.
__device__ __forceinline__ bool warp_task(const int* tasks, int lo, int hi, int per_block, int warp,
                                          Task& t) {
  const int row = lo + (int)blockIdx.x * per_block + warp;
  if (row >= hi) return false;
  const int* r = tasks + (long long)row * VB_TASK_COLS;
  t.q = r[0];
  t.a0 = r[1];
  t.a1 = r[2];
  t.a2 = r[3];
  return true;
}

// The block's task; false when the block is past the launch's range (a grid rounded up).
__device__ __forceinline__ bool block_task(const int* tasks, int lo, int hi, Task& t) {
  return warp_task(tasks, lo, hi, 1, 0, t);
}

// A problem's matrix in a packed buffer: offset and leading dimension (64-bit: a batch may pass
// 2^31 elements), order n. meta = offset[K], ld[K]; imeta = n[K].
struct Matrix {
  long long off, ld;
  int n;
};

__device__ __forceinline__ Matrix matrix_of(const long long* meta, const int* imeta, int K, int q) {
  Matrix m;
  m.off = meta[q];
  m.ld = meta[K + q];
  m.n = imeta[q];
  return m;
}

// Element (r, c) of a matrix with leading dimension ld: row-major (ROW) or column-major.
template <bool ROW>
__device__ __forceinline__ long long at(int r, int c, long long ld) {
  return ROW ? (long long)r * ld + c : (long long)r + (long long)c * ld;
}

}  // namespace vb

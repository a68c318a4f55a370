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

// Complex numbers (numpy's complex64 and complex128: re then im). Trivially constructible, so
// that arrays of them can live in shared memory; every operation a kernel templated on T uses
// (T(0), +, *, fma, comparisons with zero) is defined for them, and the helpers below (conj,
// real parts, shuffles) are identities or plain for real types.
using ::fma;  // (beside the complex one below, which would hide it)

template <typename R>
struct __align__(2 * sizeof(R)) cx {
  R re, im;
  cx() = default;
  __device__ __forceinline__ constexpr cx(R r, R i = R(0)) : re(r), im(i) {}
};
template <typename R>
__device__ __forceinline__ cx<R> operator+(cx<R> a, cx<R> b) { return {a.re + b.re, a.im + b.im}; }
template <typename R>
__device__ __forceinline__ cx<R> operator-(cx<R> a, cx<R> b) { return {a.re - b.re, a.im - b.im}; }
template <typename R>
__device__ __forceinline__ cx<R> operator-(cx<R> a) { return {-a.re, -a.im}; }
template <typename R>
__device__ __forceinline__ cx<R> operator*(cx<R> a, cx<R> b) {
  return {fma(a.re, b.re, -a.im * b.im), fma(a.re, b.im, a.im * b.re)};
}
template <typename R>
__device__ __forceinline__ cx<R> operator/(cx<R> a, cx<R> b) {
  // (Smith's scaling: no overflow of |b|^2 for large b)
  if (fabs(b.re) >= fabs(b.im)) {
    const R r = b.im / b.re, d = b.re + b.im * r;
    return {(a.re + a.im * r) / d, (a.im - a.re * r) / d};
  }
  const R r = b.re / b.im, d = b.re * r + b.im;
  return {(a.re * r + a.im) / d, (a.im * r - a.re) / d};
}
template <typename R>
__device__ __forceinline__ cx<R> operator*(cx<R> a, R b) { return {a.re * b, a.im * b}; }
template <typename R>
__device__ __forceinline__ cx<R>& operator+=(cx<R>& a, cx<R> b) { return a = a + b; }
template <typename R>
__device__ __forceinline__ cx<R>& operator-=(cx<R>& a, cx<R> b) { return a = a - b; }
template <typename R>
__device__ __forceinline__ cx<R>& operator*=(cx<R>& a, cx<R> b) { return a = a * b; }
template <typename R>
__device__ __forceinline__ bool operator==(cx<R> a, cx<R> b) { return a.re == b.re && a.im == b.im; }
template <typename R>
__device__ __forceinline__ bool operator!=(cx<R> a, cx<R> b) { return !(a == b); }
template <typename R>
__device__ __forceinline__ bool operator==(cx<R> a, R b) { return a.re == b && a.im == R(0); }
template <typename R>
__device__ __forceinline__ bool operator!=(cx<R> a, R b) { return !(a == b); }
template <typename R>
__device__ __forceinline__ cx<R> fma(cx<R> a, cx<R> b, cx<R> c) {
  return {fma(a.re, b.re, fma(-a.im, b.im, c.re)), fma(a.re, b.im, fma(a.im, b.re, c.im))};
}

template <typename T>
struct is_cx { static constexpr bool value = false; };
template <typename R>
struct is_cx<cx<R>> { static constexpr bool value = true; };
// The real type of T (T itself, or a complex type's parts).
template <typename T>
struct real_of { using type = T; };
template <typename R>
struct real_of<cx<R>> { using type = R; };
template <typename T>
using real_t = typename real_of<T>::type;

// |v| as LAPACK's pivot searches measure it: |re| + |im| for a complex number (izamax's cabs1).
template <typename T>
__device__ __forceinline__ T cabs1(T v) { return fabs(v); }
template <typename R>
__device__ __forceinline__ R cabs1(cx<R> v) { return fabs(v.re) + fabs(v.im); }

// v conjugated where c says (real types: v).
template <typename T>
__device__ __forceinline__ T conj_if(T v, bool c) { return v; }
template <typename R>
__device__ __forceinline__ cx<R> conj_if(cx<R> v, bool c) { return {v.re, c ? -v.im : v.im}; }
template <typename T>
__device__ __forceinline__ T conj(T v) { return conj_if(v, true); }
// v's real part, as the real type (a Hermitian pivot).
template <typename T>
__device__ __forceinline__ T re(T v) { return v; }
template <typename R>
__device__ __forceinline__ R re(cx<R> v) { return v.re; }
// v's real part, as a T (a Hermitian matrix's diagonal).
template <typename T>
__device__ __forceinline__ T real_part(T v) { return v; }
template <typename R>
__device__ __forceinline__ cx<R> real_part(cx<R> v) { return {v.re, R(0)}; }

// A scalar of the call (alpha, beta: held as complex double) in the kernel's type: its real part
// for a real type (a real call's imaginary parts are zero).
template <typename T>
__device__ __forceinline__ T scalar(cx<double> a) { return T(a.re); }
template <>
__device__ __forceinline__ cx<float> scalar<cx<float>>(cx<double> a) {
  return {float(a.re), float(a.im)};
}
template <>
__device__ __forceinline__ cx<double> scalar<cx<double>>(cx<double> a) { return a; }

// Warp shuffles of any element type (a complex one moves its two halves).
template <typename T>
__device__ __forceinline__ T shfl(T v, int lane, int width = 32) {
  return __shfl_sync(0xffffffffu, v, lane, width);
}
template <typename R>
__device__ __forceinline__ cx<R> shfl(cx<R> v, int lane, int width = 32) {
  return {__shfl_sync(0xffffffffu, v.re, lane, width),
          __shfl_sync(0xffffffffu, v.im, lane, width)};
}
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int d) {
  return __shfl_xor_sync(0xffffffffu, v, d);
}
template <typename R>
__device__ __forceinline__ cx<R> shfl_xor(cx<R> v, int d) {
  return {__shfl_xor_sync(0xffffffffu, v.re, d), __shfl_xor_sync(0xffffffffu, v.im, d)};
}

// Element (r, c) of a matrix with leading dimension ld: row-major (ROW) or column-major.
template <bool ROW>
__device__ __forceinline__ long long at(int r, int c, long long ld) {
  return ROW ? (long long)r * ld + c : (long long)r + (long long)c * ld;
}

}  // namespace vb

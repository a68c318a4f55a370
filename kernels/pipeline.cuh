// vbatch: device helpers the tiled kernels of every family share: asynchronous copies into
// shared memory, the double-buffered K loop, and the FP64 tensor-core instruction (DMMA).
//
// Compiled after vbatched.cuh and before the family's .cu file (kernels/cuda_build.py).

#pragma once

namespace vb {

// A compile-time flag as a value, for generic lambdas (NVRTC has no <type_traits>).
template <bool V>
struct Flag {
  static constexpr bool value = V;
};

// ------------------------------------------------------------------ asynchronous copies (sm_80+)
// One element per copy, zero-filled when `pred` is false (src-size 0 reads nothing).
template <int BYTES>
__device__ __forceinline__ void cp_async_zfill(void* smem, const void* gmem, bool pred) {
  unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
  int src_size = pred ? BYTES : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(sa), "l"(gmem), "n"(BYTES),
               "r"(src_size));
}
// One element per copy, always read (the caller knows it lies inside its operand).
template <int BYTES>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(sa), "l"(gmem), "n"(BYTES));
}
__device__ __forceinline__ void prefetch_l2(const void* gmem) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// The double-buffered K loop of the tiled GEMMs: chunk kc + 1 is staged (cp.async) while chunk
// kc is multiplied. stage(buf, k0) issues and commits one chunk; multiply(buf) consumes one.
// Ends with __syncthreads, so the caller may reuse the staging buffers at once.
template <int KB, typename Stage, typename Multiply>
__device__ __forceinline__ void k_pipeline(int K, Stage stage, Multiply multiply) {
  const int nk = (K + KB - 1) / KB;
  if (nk == 0) return;
  stage(0, 0);
  for (int kc = 0; kc < nk; ++kc) {
    if (kc + 1 < nk) {
      stage((kc + 1) & 1, (kc + 1) * KB);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    multiply(kc & 1);
    __syncthreads();
  }
}

// The same loop with S stages (S >= 2): chunks kc + 1 .. kc + S - 1 are in flight while chunk kc
// is multiplied, and one barrier per chunk suffices (the slot refilled at chunk kc is the one
// multiplied at kc - 1, which every thread has left once it passes that chunk's barrier).
// stage(buf, k0) issues and commits one chunk; every iteration commits one group, empty past
// the end, so that wait_group counts stay exact.
template <int KB, int S, typename Stage, typename Multiply>
__device__ __forceinline__ void k_pipeline_n(int K, Stage stage, Multiply multiply) {
  const int nk = (K + KB - 1) / KB;
  if (nk == 0) return;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < nk) stage(s, s * KB);
    else cp_async_commit();
  }
  for (int kc = 0; kc < nk; ++kc) {
    cp_async_wait<S - 2>();
    __syncthreads();
    const int next = kc + S - 1;
    if (next < nk) stage(next % S, next * KB);
    else cp_async_commit();
    multiply(kc % S);
  }
  cp_async_wait<0>();
  __syncthreads();
}

// ------------------------------------------------------------------ FP64 tensor cores
// mma.sync with f64 operands (DMMA) is the only FP64 tensor-core path (wgmma has no f64). On the
// H200 the m8n8k4 shape peaks at 32.9 TFLOP/s and m16n8k8 at 66.0, the chip's FP64 peak
// (docs/decisions.md#blas-dmma-tiles, a microbenchmark: 8 independent accumulators per warp, 528 blocks of 8 warps,
// 2026-11-21), so new code uses m16n8k8. Fragments follow the PTX layouts, with g = lane / 4
// and t = lane % 4:
//   m8n8k4:  A a = A[g][t]; B b = B[t][g]; C c{0,1} = C[g][2t + {0,1}].
//   m16n8k8: A a{0,1,2,3} = A[g, g+8, g, g+8][t, t, t+4, t+4]; B b{0,1} = B[t, t+4][g];
//            C c{0,1,2,3} = C[g, g, g+8, g+8][2t, 2t+1, 2t, 2t+1].
__device__ __forceinline__ void dmma_m8n8k4(double& d0, double& d1, double a, double b) {
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
               : "+d"(d0), "+d"(d1)
               : "d"(a), "d"(b));
}

__device__ __forceinline__ void dmma_m16n8k8(double (&d)[4], const double (&a)[4],
                                             const double (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // Ampere has no f64 m16n8k8 (ptxas: "requires .target sm_90 or higher"). Its fragments are four
  // m8n8k4 fragments in the layouts above: rows g (c0, c1) and g + 8 (c2, c3), k in t and t + 4.
  dmma_m8n8k4(d[0], d[1], a[0], b[0]);
  dmma_m8n8k4(d[0], d[1], a[2], b[1]);
  dmma_m8n8k4(d[2], d[3], a[1], b[0]);
  dmma_m8n8k4(d[2], d[3], a[3], b[1]);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
      : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
#endif
}

// Where element (o, k) of a staged DMMA operand tile lives in shared memory: O rows (of A, or
// columns of B) by KB. KCONT: k is the contiguous dimension in global memory, so staging threads
// run along k and the tile is o-major with rows padded to KB + 4; else k-major, padded to O + 8.
// Either pad makes a fragment load (8 o by lane / 4, 4 k by lane % 4, for both shapes) touch
// each bank pair at most twice, the minimum for 8-byte elements.
template <bool KCONT, int O, int KB>
__device__ __forceinline__ int sm(int o, int k) { return KCONT ? o * (KB + 4) + k : k * (O + 8) + o; }
template <bool KCONT, int O, int KB>
__host__ __device__ constexpr int sm_size() { return KCONT ? O * (KB + 4) : KB * (O + 8); }

// The layout blas_gemm_mma reads with 128-bit fragment loads (two doubles a lane): the GEMM's
// fragments pair k (or o) so that a lane's two elements of an operand are adjacent (blas.cu),
// and a 128-bit load is served a quarter-warp (8 lanes: 2 o by 4 k, or 4 k by 2 o) at a time.
// The pads make those 8 lanes' 16-byte slots distinct mod 128 bytes: a k-contiguous row stride
// of 8 mod 16 doubles (lanes g = 0, 1 half a line apart), a k-major stride of 2 mod 8 (rows
// k = 0, 2, 4, 6 two slots apart). Every stage stays a multiple of 16 bytes.
template <bool KCONT, int O, int KB>
__device__ __forceinline__ int smw(int o, int k) { return KCONT ? o * (KB + 8) + k : k * (O + 2) + o; }
template <bool KCONT, int O, int KB>
__host__ __device__ constexpr int smw_size() { return KCONT ? O * (KB + 8) : KB * (O + 2); }
template <bool KCONT, int O, int KB>
__host__ __device__ constexpr int smw_stride() { return KCONT ? KB + 8 : O + 2; }

// k-major for every orientation, rows padded by 4 elements: the SIMT GEMM reads 4 consecutive
// o of one k with a 128-bit load (float), whatever the operand's orientation in global memory.
template <int O>
__device__ __forceinline__ int smk(int o, int k) { return k * (O + 4) + o; }

// How a Stager lays a tile out in shared memory: sm, smw or smk.
enum StageLayout { kSm = 0, kSmw = 1, kSmk = 2 };

// Stages K-chunks of one operand tile (O x KB elements of T, laid out by LAYOUT) with cp.async,
// one element a copy: element (o, k) of the operand is at X + (KCONT ? o * ld + k : o + k * ld),
// and elements with o >= mo or k past the operand's end read as zeros. Thread t takes elements
// t, t + NT, ... of the chunk in the order the layout is contiguous in global memory, so a
// warp's copies coalesce; with NT a multiple of KB (KCONT) or O, each thread keeps one k (or
// one o) and steps the other by a constant, so a copy costs a compare, an address and the copy
// (the general index arithmetic per element made staging, not DMMA, the limit: 22 TFLOP/s at
// 512^3, H200, 2026-11-21).
template <typename T, bool KCONT, int O, int KB, int NT, int LAYOUT = kSm>
struct Stager {
  static constexpr int E = O * KB / NT, DV = KCONT ? NT / KB : NT / O;
  static_assert(O * KB % NT == 0 && (KCONT ? NT % KB : NT % O) == 0, "staging shape");
  const T* base;
  const T* p;        // this thread's first element, chunk 0
  long long step;    // between its elements
  long long chunk;   // between chunks
  int fixed, first;  // its fixed coordinate (k, or o) and its first varying one
  __device__ __forceinline__ Stager(const T* X, long long ld, int tid) : base(X) {
    if (KCONT) {
      fixed = tid % KB;
      first = tid / KB;
      p = X + (long long)first * ld + fixed;
      step = DV * ld;
      chunk = KB;
    } else {
      fixed = tid % O;
      first = tid / O;
      p = X + fixed + (long long)first * ld;
      step = DV * ld;
      chunk = KB * ld;
    }
  }
  static __device__ __forceinline__ int at(int o, int k) {
    return LAYOUT == kSmw ? smw<KCONT, O, KB>(o, k)
         : LAYOUT == kSmk ? smk<O>(o, k)
                          : sm<KCONT, O, KB>(o, k);
  }
  // Chunk c (columns k0 = c KB ...) into s; mo: rows o that exist; kleft: columns left from k0.
  __device__ __forceinline__ void stage(T* s, int c, int mo, int kleft) const {
    const T* q = p + c * chunk;
#pragma unroll
    for (int j = 0; j < E; ++j, q += step) {
      const int o = KCONT ? first + j * DV : fixed;
      const int k = KCONT ? fixed : first + j * DV;
      const bool ok = o < mo && k < kleft;
      cp_async_zfill<sizeof(T)>(s + at(o, k), ok ? q : base, ok);
    }
  }
  // The same chunk when every element lies inside the operand (all O rows, KB columns left):
  // no bounds, no zero fill, so a copy is an address step and the copy. The predicated form
  // costs ~9 PTX instructions a copy (compare, select, two size and address selects), and with
  // 24 copies a thread a chunk it was most of the DMMA GEMM's ~490 instructions a warp a chunk
  // (ncu, 384^3 GEMMs, H100, 2026-11-24).
  __device__ __forceinline__ void stage_full(T* s, int c) const {
    const T* q = p + c * chunk;
#pragma unroll
    for (int j = 0; j < E; ++j, q += step) {
      const int o = KCONT ? first + j * DV : fixed;
      const int k = KCONT ? fixed : first + j * DV;
      cp_async<sizeof(T)>(s + at(o, k), q);
    }
  }
};

// Stages chunk l0 / KB of both operands of a GEMM tile (A at s, B at s + offb) and commits it,
// without bounds where a tile lies inside its operand (fa, fb) and the chunk inside K (kk).
template <int KB, typename SA, typename SB, typename T>
__device__ __forceinline__ void stage_ab(const SA& sa, const SB& sb, T* s, int offb, int l0,
                                         int kk, int ma, int nb, bool fa, bool fb) {
  const bool fk = kk - l0 >= KB;
  if (fa && fk) sa.stage_full(s, l0 / KB);
  else sa.stage(s, l0 / KB, ma, kk - l0);
  if (fb && fk) sb.stage_full(s + offb, l0 / KB);
  else sb.stage(s + offb, l0 / KB, nb, kk - l0);
  cp_async_commit();
}

}  // namespace vb

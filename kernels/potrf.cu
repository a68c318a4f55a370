// vbatch: variable-size batched left-looking Cholesky (POTRF) kernels, real and complex. A
// complex matrix is Hermitian, A = L L^H: every product of a row with another row's transpose
// takes the second conjugated, and a pivot is the diagonal's real part (its imaginary part is
// not read, as ZPOTRF's).
//
// Compiled behind the generated preamble and vbatched.cuh (kernels/cuda_build.py), which give
// every kernel its task: block b of a launch over task rows [lo, hi) runs task lo + b, a problem q
// and its arguments (a panel: its first column j and width w; a schur task: p and n - p). The
// per-problem arrays are indexed by q, the caller's index (meta: offset[K], ld[K]; imeta: n[K]),
// and so is `info`, which lives in pinned host memory that the kernels address directly (unified
// addressing): the host zeroes it before the first launch and reads it once, after the last;
// kernels write it only for a failed pivot.
//
// The per-call pointers (A, L, info) come from a 3-entry device table, `tbl`: a plan's launches
// are captured once into a CUDA graph with fixed parameters, and a call only refreshes the table.
//
// Factorizations run out of place or in place: A is read (original values of each panel, the
// first time it is touched) and L is written; A == L is allowed. L is lower triangular on exit:
// every kernel that finishes a panel also writes the zeros above it.
//
// Layout is a template flag: ROW=false is column-major (element (r, c) at r + c * ld), ROW=true
// row-major (r * ld + c). Offsets and ld are 64-bit: a batch may pass 2^31 elements.
//
// Templates are instantiated by name through NVRTC (cupy.RawModule name_expressions); CI's nvcc
// check compiles the generated translation unit that instantiates every name the launcher
// (kernels/potrf_cuda.py) can select.

namespace vb {

// 1 / sqrt(x): one special-function sequence gives both the pivot (x * rsqrt(x)) and its
// reciprocal, where sqrt then a division put two on POTF2's per-column dependency chain.
// CUDA documents rsqrt within 1 ulp (double) and 2 ulp (float); Cholesky's backward error
// bound does not rest on a correctly rounded square root.
template <typename T> __device__ __forceinline__ T vrsqrt(T x);
template <> __device__ __forceinline__ double vrsqrt<double>(double x) { return rsqrt(x); }
template <> __device__ __forceinline__ float vrsqrt<float>(float x) { return rsqrtf(x); }

// Blocks an SM a kernel's launch bound asks for are divided by this for complex types: complex64's
// panel kernels took 170 registers a thread where float64's take 128 (ptxas, sm_90; capped at
// 128 they spilled 2 KB), and a row of complex128 is twice a row of doubles.
template <typename T>
__host__ __device__ constexpr int wide() { return is_cx<T>::value ? 2 : 1; }

// ------------------------------------------------------------------ C = X Y^H tile, K-pipelined
// acc[i][jj] = sum_{k < K} L(rx + ty + 32 i, k) * conj(L(ry + tx * TN + jj, k)), for the rows of
// X below mx and of Y below ny (others read as zero). X and Y are row blocks of the same matrix
// L (the factored columns), so one routine serves the panel update (Y = the panel's own top
// rows) and the Schur complement (Y = another trailing row block).
//
// Threads: lane ty owns rows ty + 32 i (i < TM = RC / 32), warp tx owns columns tx*TN .. +TN. With
// rows across lanes, shared-memory reads of X are conflict-free and reads of Y are broadcasts, and
// column-major global loads are coalesced. The K loop is double-buffered with cp.async: stage
// k+1 is in flight while stage k is multiplied.
//
// Shared memory per stage: X as [RC][KB+1] and Y as [CC][KB+1] for row-major L (element k of a row
// is contiguous in global memory), [KB][RC] and [KB][CC] for column-major L. Ends with
// __syncthreads, so the caller may reuse `sbuf` at once.
template <bool ROW, int RC, int KB>
__device__ __forceinline__ int sx(int r, int kk) { return ROW ? r * (KB + 1) + kk : kk * RC + r; }

// Stage one K-chunk of L into shared memory: rows [r0, r0 + ROWS), columns [k0, k0 + KB), at
// s[idx(r, kk)]. Rows at or past `valid` and columns at or past K read as zero (cp.async with
// src-size 0), so partial tiles need no special case downstream.
template <typename T, bool ROW, int ROWS, int KB, typename Idx>
__device__ __forceinline__ void stage_rows(T* s, const T* L, long long ld, int r0, int valid,
                                           int k0, int K, int tid, int nt, Idx idx) {
  for (int e = tid; e < ROWS * KB; e += nt) {
    const int r = ROW ? e / KB : e % ROWS, kk = ROW ? e % KB : e / ROWS;
    const bool ok = r < valid && k0 + kk < K;
    cp_async_zfill<sizeof(T)>(s + idx(r, kk), ok ? L + at<ROW>(r0 + r, k0 + kk, ld) : L, ok);
  }
}

template <typename T, int RC, int CC, int WARPS, int KB, bool ROW>
__device__ void gemm_nt(const T* L, long long ld, int rx, int mx, int ry, int ny, int K,
                        T (&acc)[RC / 32][CC / WARPS], T* sbuf) {
  constexpr int TM = RC / 32, TN = CC / WARPS, NT = 32 * WARPS;
  constexpr int SA = RC * (KB + 1), SB = CC * (KB + 1), STAGE = SA + SB;
  static_assert(RC % 32 == 0 && CC % WARPS == 0, "tile shape");
  const int tid = threadIdx.x, ty = tid & 31, tx = tid >> 5;
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int jj = 0; jj < TN; ++jj) acc[i][jj] = T(0);
  const auto ia = [](int r, int kk) { return sx<ROW, RC, KB>(r, kk); };
  const auto ib = [](int c, int kk) { return sx<ROW, CC, KB>(c, kk); };
  k_pipeline<KB>(
      K,
      [&](int buf, int k0) {
        T* sA = sbuf + buf * STAGE;
        stage_rows<T, ROW, RC, KB>(sA, L, ld, rx, mx, k0, K, tid, NT, ia);
        stage_rows<T, ROW, CC, KB>(sA + SA, L, ld, ry, ny, k0, K, tid, NT, ib);
        cp_async_commit();
      },
      [&](int buf) {
        const T* sA = sbuf + buf * STAGE;
        const T* sB = sA + SA;
#pragma unroll
        for (int kk = 0; kk < KB; ++kk) {
          T a[TM], b[TN];
#pragma unroll
          for (int i = 0; i < TM; ++i) a[i] = sA[ia(ty + 32 * i, kk)];
#pragma unroll
          for (int jj = 0; jj < TN; ++jj) b[jj] = conj(sB[ib(tx * TN + jj, kk)]);
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int jj = 0; jj < TN; ++jj) acc[i][jj] = fma(a[i], b[jj], acc[i][jj]);
        }
      });
}

// ------------------------------------------------------------------ POTF2 in one warp's registers
// Lane r holds row r of the panel in a[0..NB) (the w x w diagonal block; with `act`, also the
// rows below it, which the same elimination solves): right-looking, one column per
// iteration. The pivot (the diagonal's real part) comes by one shuffle; the scaled column goes
// through shared memory conjugated (`col`, 2 * NB elements, double-buffered) and every
// lane reads it back as broadcasts, which pair into 128-bit loads. Lanes update their whole row
// without a per-column predicate: entries above the diagonal become junk that is never read.
// Lanes with `act` false (rows not in the panel, or not to be solved here) only serve the
// shuffles and keep their values. Returns 0, or the first column + 1 whose pivot is not > 0 (NaN
// included, as reference LAPACK); the same in every lane.
// On failure at column f, columns [0, f - 1) of every active lane are final: LAPACK's leading
// factor, which the callers complete and write back, and lane f - 1's a[f - 1] is the pivot as
// tested (real).
// BLOCK: the rows are a whole block's threads (fused_step), the diagonal block in warp 0, which
// hands each pivot and its reciprocal root (`piv`: two slots of both) and the scaled column to
// the other warps behind one barrier a column, so the rows below are solved in the same pass as
// the diagonal block. Run as POTF2 by warp 0, then a TRSM of the rows below (a second chain as
// long), fused_step took 44.0 us for 2,000 panels of 40 x 32, now 35.8 (float64, H200;
// docs/decisions.md#potrf-fused-one-pass). The rows below run a loop of their own: under one
// `if` a column with warp 0's work, the row-major float64 build spilled 640 bytes and ran
// slower. Each warp working the root out again kept a register busy: the float64 column-major
// build spilled one slot, loaded and stored every column.
// The shuffle-per-element version took about 3,000 instructions and 15 us per 32 x 32 block
// (ncu, H100, 2026-11-21: 5.5 cycles per issued instruction at 6% occupancy).
template <typename T, int NB, bool BLOCK = false>
__device__ __forceinline__ int potf2_regs(T (&a)[NB], int w, bool act, T* col,
                                          real_t<T>* piv = nullptr) {
  static_assert(NB <= 32, "one lane per row of the diagonal block");
  using R = real_t<T>;
  const int lane = threadIdx.x & 31;
  if (BLOCK && threadIdx.x >= 32) {  // rows below the diagonal block: each column handed over
#pragma unroll
    for (int k = 0; k < NB; ++k) {
      if (k < w) {
        __syncthreads();
        if (!(piv[2 * (k & 1)] > R(0))) return k + 1;
        if (act) {
          const T* cb = col + (k & 1) * NB;
          a[k] = a[k] * piv[2 * (k & 1) + 1];
#pragma unroll
          for (int c = k + 1; c < NB; ++c) a[c] = fma(-a[k], cb[c], a[c]);
        }
      }
    }
    return 0;
  }
#pragma unroll
  for (int k = 0; k < NB; ++k) {
    if (k < w) {
      T* cb = col + (k & 1) * NB;
      if (lane == k) a[k] = real_part(a[k]);  // (the pivot as tested, should it fail)
      const R dkk = __shfl_sync(0xffffffffu, re(a[k]), k);
      const bool ok = dkk > R(0);
      if (!BLOCK && !ok) return k + 1;
      // (BLOCK: the pivot's slot; its reciprocal square root below, which the other warps
      // scale by, not each working it out again. Their reads of these slots ended before the
      // last barrier.)
      if (BLOCK && lane == 0) piv[2 * (k & 1)] = dkk;
      // (lane 0's row is in every panel, m >= w >= 1: act there, so a passing pivot's root
      // is always written for the other warps)
      if (act && ok) {
        // An infinite pivot: reference LAPACK takes sqrt(inf) = inf and scales the column by
        // 1 / inf = 0 (info stays 0); dkk * rsqrt(dkk) would be inf * 0 = NaN.
        const R rd = vrsqrt(dkk);  // scale by the reciprocal, as LAPACK's potf2 does
        if (BLOCK && lane == 0) piv[2 * (k & 1) + 1] = rd;
        a[k] = lane == k ? T(isinf(dkk) ? dkk : dkk * rd) : a[k] * rd;
        // Only the first NB rows are read back; a row below them (a panel narrower than its
        // height) would write into the other buffer, which may still be being read.
        if (lane < NB) cb[lane] = conj(a[k]);
      }
      if (BLOCK) {
        __syncthreads();
        if (!ok) return k + 1;
      } else {
        __syncwarp();
      }
      if (act) {
#pragma unroll
        for (int c = k + 1; c < NB; ++c) a[c] = fma(-a[k], cb[c], a[c]);
      }
    }
  }
  return 0;
}

// ------------------------------------------------------------------ one row of X L11^H = B
// L11 is read from shared memory as L(c, k) = D[k * ldd + c] (every thread reads the same element:
// a broadcast), with invd[c] = 1 / L(c, c) (real). Right-looking: once x[c] is final it updates
// every later x[c2] at once, so the dependent chain is one multiply and one FMA per column; the
// left-looking dot product per column made a chain of ~NB^2 / 2 dependent FMAs.
template <typename T, int NB>
__device__ __forceinline__ void trsm_row(T (&x)[NB], const T* D, int ldd, const T* invd, int w) {
#pragma unroll
  for (int c = 0; c < NB; ++c) {
    if (c < w) {
      x[c] *= invd[c];
#pragma unroll
      for (int c2 = c + 1; c2 < NB; ++c2) x[c2] = fma(-x[c], conj(D[c * ldd + c2]), x[c2]);
    }
  }
}

// ------------------------------------------------------------------ a warp's rows, row-major
// The kernels keep a panel row per lane. Column-major, a lane's element of a column is one
// coalesced warp access. Row-major, the lanes' rows are ld apart, and the same access touched
// 32 lines per instruction: the row-major kernels took 1.5-2.6x the column-major ones' time
// (H100, 2026-11-27). So row-major rows move RK columns at a time through a per-warp tile (32 x
// RK), RK lanes to a row: each instruction moves RK contiguous elements of each of 32 / RK rows.
// warp_rows_load / warp_rows_store: lane i holds row r0 + i of columns [c0, c0 + N) in v[0..N);
// element (i, c) is read or written only where c < nc and ok(i, c). v itself holds the values
// in flight, so every load is issued first. The column-major kernels keep their direct code.
enum : int { RK = 8, RS = 32 / RK };

// Element (i, k) of a row tile, by columns with a padding that keeps both ways of reading it, a
// row per lane and RK lanes per row, free of bank conflicts for 4- and 8-byte elements. Both
// are affine in the slot, so a lane's addresses are one register and immediate offsets (an
// XOR swizzle took a register per slot, and small_step spilled).
template <typename T>
__device__ __forceinline__ constexpr int tix(int i, int k) { return k * (32 + 16 / sizeof(T)) + i; }
template <typename T>
__device__ __forceinline__ constexpr int row_tile() { return RK * (32 + 16 / sizeof(T)); }
// Where fused_step and small_step keep their warps' row tiles (two a warp): in static shared
// memory, but for 16-byte elements in dynamic shared memory (potrf_cuda.row_smem), since eight
// warps' tiles of complex128 pass the 48 KB static shared memory may take. (Dynamic for every
// type cost float64's 32-wide row-major kernels 44-56 bytes of spill stores: ptxas, sm_90.)
template <typename T>
__host__ __device__ constexpr bool dynamic_tiles() { return sizeof(T) > 8; }

// Swap chunk [cb, cb + RK) of v between the two ways of holding it: slot s of a lane as element
// (lane / RK + s * RS, lane % RK), and element k as (lane, k). `to_rows` says which way.
template <typename T, int N>
__device__ __forceinline__ void tile_turn(T (&v)[N], int cb, bool to_rows, T* tile) {
  const int lane = threadIdx.x & 31, i0 = lane / RK, kk = lane % RK;
#pragma unroll
  for (int s = 0; s < RK; ++s) {
    if (to_rows) tile[tix<T>(i0 + s * RS, kk)] = v[cb + s];
    else tile[tix<T>(lane, s)] = v[cb + s];
  }
  __syncwarp();
#pragma unroll
  for (int s = 0; s < RK; ++s) v[cb + s] = to_rows ? tile[tix<T>(lane, s)] : tile[tix<T>(i0 + s * RS, kk)];
  __syncwarp();
}

template <typename T, int N, typename Ok>
__device__ __forceinline__ void warp_rows_load(T (&v)[N], const T* M, long long ld, int r0, int c0,
                                               int nc, Ok ok, T* tile) {
  static_assert(N % RK == 0, "whole chunks");
  const int lane = threadIdx.x & 31, i0 = lane / RK, kk = lane % RK;
  const T* q = M + at<true>(r0 + i0, c0 + kk, ld);  // slot s's row, one at a time
#pragma unroll
  for (int s = 0; s < RK; ++s, q += RS * ld)
#pragma unroll
    for (int cb = 0; cb < N; cb += RK)
      v[cb + s] = (cb + kk < nc && ok(i0 + s * RS, cb + kk)) ? q[cb] : T(0);
#pragma unroll
  for (int cb = 0; cb < N; cb += RK)
    if (cb < nc) tile_turn(v, cb, true, tile);  // nc is the same in every lane
}

template <typename T, int N, typename Ok>
__device__ __forceinline__ void warp_rows_store(T (&v)[N], T* M, long long ld, int r0, int c0,
                                                int nc, Ok ok, T* tile) {
  const int lane = threadIdx.x & 31, i0 = lane / RK, kk = lane % RK;
  T* q = M + at<true>(r0 + i0, c0 + kk, ld);
#pragma unroll
  for (int cb = 0; cb < N; cb += RK)
    if (cb < nc) tile_turn(v, cb, false, tile);
#pragma unroll
  for (int s = 0; s < RK; ++s, q += RS * ld)
#pragma unroll
    for (int cb = 0; cb < N; cb += RK)
      if (cb + kk < nc && ok(i0 + s * RS, cb + kk)) q[cb] = v[cb + s];
}

// The barrier after a chunk's top rows were stored to `lt` (conjugated), then every thread's FMAs
// over the chunk: x[c] -= own[k] * lt[k][c] (the top rows read as broadcasts). panel_update and
// panel_update_rows share it.
template <typename T, int NB, bool WARP, int KB>
__device__ __forceinline__ void chunk_update(T (&x)[NB], const T (&own)[KB], const T (*lt)[NB]) {
  if (WARP) __syncwarp(); else __syncthreads();
#pragma unroll
  for (int k = 0; k < KB; ++k) {
    const T o = own[k];
#pragma unroll
    for (int c = 0; c < NB; ++c) x[c] = fma(-o, lt[k][c], x[c]);
  }
}

// ------------------------------------------------------------------ a panel row's update
// x[c] -= sum_{kb <= k < j} L(j + r, k) conj(L(j + c, k)) for c < NB: row r of a panel brought up
// to date from the factored columns [kb, j) (kb: the panel's block column; columns left of it
// were applied by the block update), KB at a time, the next chunk's loads in flight while the
// current one is multiplied. Each thread streams its own row (coalesced across lanes for
// column-major L); the top w rows, which their own threads load, come through `lt` (two KB x NB
// buffers) and every thread reads them as broadcasts. WARP: the threads are one warp
// (small_step) and sync with __syncwarp, else the block (fused_step) with __syncthreads.
template <typename T, int NB, bool ROW, bool WARP, int KB = 8>
__device__ __forceinline__ void panel_update(T (&x)[NB], const T* Lb, long long ld, int j, int kb,
                                             int r, int w, bool row, T (*lt)[KB][NB]) {
  T own[KB], nxt[KB];
#pragma unroll
  for (int kk = 0; kk < KB; ++kk)
    nxt[kk] = (row && kb + kk < j) ? Lb[at<ROW>(j + r, kb + kk, ld)] : T(0);
  int buf = 0;
  for (int k0 = kb; k0 < j; k0 += KB, buf ^= 1) {
#pragma unroll
    for (int kk = 0; kk < KB; ++kk) own[kk] = nxt[kk];
    if (r < w) {
#pragma unroll
      for (int kk = 0; kk < KB; ++kk) lt[buf][kk][r] = conj(own[kk]);
    }
    const int k1 = k0 + KB;
#pragma unroll
    for (int kk = 0; kk < KB; ++kk)
      nxt[kk] = (row && k1 + kk < j) ? Lb[at<ROW>(j + r, k1 + kk, ld)] : T(0);
    // lt[buf] written; every thread finished reading it two chunks ago (the last chunk's
    // barrier came after those reads).
    chunk_update<T, NB, WARP, KB>(x, own, lt[buf]);
  }
}

// panel_update for row-major L: each lane's row of the chunk comes through the warp's two row
// tiles (`tile`, 2 x row_tile), the next chunk by cp.async while this one is multiplied; rows
// at or past m read as zero. Otherwise as panel_update.
template <typename T, int NB, bool WARP, int KB = 8>
__device__ __forceinline__ void panel_update_rows(T (&x)[NB], const T* Lb, long long ld, int j,
                                                  int kb, int r, int w, int m, T (*lt)[KB][NB],
                                                  T* tile) {
  static_assert(KB == RK, "the chunks are the tile's");
  const int lane = r & 31, rb = r - lane;  // rb: the warp's first row
  const int i0 = lane / RK, kk = lane % RK, rows = m - rb - i0;
  const T* p = Lb + at<true>(j + rb + i0, kk, ld);
  // chunk k0 into tile buffer b, slot s of a lane being element (i0 + s * RS, kk)
  const auto issue = [&](int k0, int b) {
    const T* q = p + k0;
#pragma unroll
    for (int s = 0; s < RK; ++s, q += RS * ld) {
      const bool ok = s * RS < rows && k0 + kk < j;
      cp_async_zfill<sizeof(T)>(tile + b * row_tile<T>() + tix<T>(i0 + s * RS, kk), ok ? q : Lb, ok);
    }
    cp_async_commit();
  };
  T own[KB];
  issue(kb, 0);
  int buf = 0;
  for (int k0 = kb; k0 < j; k0 += KB, buf ^= 1) {
    const int k1 = k0 + KB;
    // the other buffer was last read before the previous chunk's barrier
    if (k1 < j) issue(k1, buf ^ 1);
    else cp_async_commit();
    cp_async_wait<1>();
    __syncwarp();
#pragma unroll
    for (int k = 0; k < KB; ++k) own[k] = tile[buf * row_tile<T>() + tix<T>(lane, k)];
    if (r < w) {
#pragma unroll
      for (int k = 0; k < KB; ++k) lt[buf][k][r] = conj(own[k]);
    }
    chunk_update<T, NB, WARP, KB>(x, own, lt[buf]);
  }
}

// Zero rows [r0, r1) x columns [c0, c0 + nc) of a matrix, coalesced for either layout.
template <typename T, bool ROW>
__device__ void zero_rect(T* L, long long ld, int r0, int r1, int c0, int nc, int tid, int nt) {
  const int nr = r1 - r0;
  if (nr <= 0 || nc <= 0) return;
  const int total = nr * nc;
  for (int e = tid; e < total; e += nt) {
    const int r = ROW ? e / nc : e % nr, c = ROW ? e % nc : e / nr;
    L[at<ROW>(r0 + r, c0 + c, ld)] = T(0);
  }
}

// ================================================================== fused step
// One block per problem, one thread per panel row: thread r keeps row r of the m x w panel in
// registers (x[0..NB)) through the whole step.
//   1. x = A[j + r, j:j+w]; the zeros above the panel are written to L;
//   2. update: x -= sum_k L[j + r, k] L[j:j+w, k]^H. Each thread streams its own row of the
//      factored columns from global memory (coalesced across lanes for column-major L) and the
//      top w rows, which are warp 0's own rows, come through a shared-memory tile that every
//      thread reads as a broadcast: 32 FMAs per 16 wide shared loads;
//   3. POTF2 of the diagonal block in warp 0's registers (its lanes r < w hold those rows),
//   4. which also solves the rows below it: every thread eliminates each column as warp 0
//      hands it over (potf2_regs<BLOCK>);
//   5. each thread writes its row back.
// NT = 32 * ceil(tallest panel / 32) threads, picked per launch, so a block is as small as its
// panels: the earlier design (panel in shared memory, 4x4 register tiles, POTF2 in one warp of
// eight) sat 3.5-10x above its floor and lost to the separated kernels at every height measured
// (profile_cuda.py crossover, H100, 2026-11-21).
template <typename T, int NB, int NT, bool ROW>
// >= 512 threads per SM: <= 128 registers (complex types: wide)
__global__ void __launch_bounds__(NT, 512 / NT / wide<T>())
fused_step(const unsigned long long* tbl, const long long* meta, const int* imeta, const int* tasks,
           int K, int lo, int hi, int unused) {
  const T* A = reinterpret_cast<const T*>(tbl[0]);
  T* L = reinterpret_cast<T*>(tbl[1]);
  int* info = reinterpret_cast<int*>(tbl[2]);
  constexpr int KB = 8;
  __shared__ __align__(16) T Lt[2][KB][NB];  // top rows of the factored columns, by k
  __shared__ __align__(16) T pcol[2 * NB];   // POTF2's column broadcast
  __shared__ real_t<T> piv[4];               // its pivots and their reciprocal roots
  constexpr bool ST = ROW && !dynamic_tiles<T>();
  __shared__ __align__(16) T rtile[ST ? NT / 32 : 1][ST ? 2 * row_tile<T>() : 1];  // row tiles
  extern __shared__ __align__(16) unsigned char smem_raw[];

  vb::Task tk;
  if (!vb::block_task(tasks, lo, hi, tk)) return;
  const vb::Matrix pr = vb::matrix_of(meta, imeta, K, tk.q);
  // Failed at an earlier step: stop, like LAPACK. A first panel (tk.a0 = j = 0) needs no look
  // (the host zeroed info): the look, a read of pinned host memory across the link, held 17% of
  // the stall samples of first panels (ncu, H100, equal Nmax 40). Kept ahead of the rest, with
  // the task's own fields: placed after them, ptxas allocated the float64 kernel's registers
  // differently and 2,000 problems of 256 took 4.5% longer (H100; decisions.md#potrf-info-reads).
  if (tk.a0 > 0 && info[tk.q] != 0) return;
  const int j = tk.a0, w = tk.a1, kb = tk.a2, m = pr.n - j;
  // A panel of a later block column reads L: the block update has written it there.
  const T* Ab = (kb > 0 ? L : A) + pr.off;
  T* Lb = L + pr.off;
  const long long ld = pr.ld;
  const int r = threadIdx.x;
  const bool row = r < m;
  const int rb = r & ~31;  // the warp's first row
  T* tile = dynamic_tiles<T>()
                ? reinterpret_cast<T*>(smem_raw) + (ROW ? r / 32 * 2 * row_tile<T>() : 0)
                : rtile[ST ? r / 32 : 0];

  // 1. own row of A; zeros above the panel.
  T x[NB];
  if constexpr (ROW) {
    warp_rows_load(x, Ab, ld, j + rb, j, w, [&](int i, int) { return rb + i < m; }, tile);
  } else {
#pragma unroll
    for (int c = 0; c < NB; ++c) x[c] = (row && c < w) ? Ab[at<ROW>(j + r, j + c, ld)] : T(0);
  }
  zero_rect<T, ROW>(Lb, ld, 0, j, j, w, r, NT);

  // 2. update from the factored columns [kb, j).
  if (j > kb) {
    if constexpr (ROW) panel_update_rows<T, NB, false, KB>(x, Lb, ld, j, kb, r, w, m, Lt, tile);
    else panel_update<T, NB, ROW, false, KB>(x, Lb, ld, j, kb, r, w, row, Lt);
  }

  // 3-4. POTF2 of the diagonal block by warp 0, the rows below solved in the same pass (with
  //      a failure at column wf, rows [wf, w) of the block and the rows below have their first
  //      wf columns final, LAPACK's leading block).
  const int fail = potf2_regs<T, NB, true>(x, w, row, pcol, piv);
  // A failed pivot at panel column f - 1: its first f - 1 columns are still completed and
  // written, so that the columns before the failing one hold the factor (the partial
  // factorization of those columns), and the pivot as tested, as the CPU backend leaves them
  // (LAPACK's leading f x f block); the rest is not written.
  const int wf = fail ? fail - 1 : w;
  if (fail && r == 0) info[tk.q] = j + fail;

  // 5. own row back to L (zeros above the diagonal inside the block); after a failure also
  //    the failed column down to its diagonal, where thread wf holds the pivot as tested.
  if constexpr (ROW) {
#pragma unroll
    for (int c = 0; c < NB; ++c)
      if (r < w && c > r) x[c] = T(0);
    warp_rows_store(x, Lb, ld, j + rb, j, w, [&](int i, int c) {
      const int rr = rb + i;
      return rr < m && (c < wf || (fail && c == wf && rr <= wf));
    }, tile);
  } else if (row) {
#pragma unroll
    for (int c = 0; c < NB; ++c)
      if (c < wf || (fail && c == wf && r <= wf))
        Lb[at<ROW>(j + r, j + c, ld)] = (r < w && c > r) ? T(0) : x[c];
  }
}

// ================================================================== small panels
// Panels of at most 32 rows (the last panels of every problem, whole problems of n <= 32): a
// warp per task, WARPS tasks per block; lane r keeps row r of the panel in registers, a[0..NB)
// for the panel's w columns, NB chosen per warp from w (8, 16, 24 or 32, from NBMIN up: see
// small_step). As fused_step, but a
// warp instead of a block: the update streams each lane's own row of the factored columns and
// the panel's top rows (its own lanes) through a per-warp shared tile; then potf2_regs factors
// the panel right-looking, which also solves the rows below the diagonal block (column k is
// final in every lane once it is scaled). fused_step's NB = 32 block, one panel per block,
// issued ~3,900 instructions a warp on U[1, 32] sizes, 21 us for 2,000 problems at 0.31
// instructions a cycle per scheduler (ncu, H200, 2026-11-24); this kernel took 12.8 us.
template <typename T, int NB, bool ROW>
__device__ __forceinline__ void small_panel(const T* Ab, T* Lb, long long ld, int j, int kb, int m,
                                            int w, int* info, int q, int failed, T* col, T* lt,
                                            T* tile) {
  const int lane = threadIdx.x & 31;
  const bool row = lane < m;
  T a[NB];
  if constexpr (ROW) {
    warp_rows_load(a, Ab, ld, j, j, w, [&](int i, int c) { return i < m && c <= i; }, tile);
  } else {
#pragma unroll
    for (int c = 0; c < NB; ++c)
      a[c] = (row && c < w && c <= lane) ? Ab[at<ROW>(j + lane, j + c, ld)] : T(0);
  }
  if (failed != 0) return;  // an earlier step failed (small_step): nothing written
  if (j > 0) zero_rect<T, ROW>(Lb, ld, 0, j, j, w, lane, 32);
  if (j > kb) {
    const auto lt8 = reinterpret_cast<T (*)[8][NB]>(lt);
    if constexpr (ROW) panel_update_rows<T, NB, true>(a, Lb, ld, j, kb, lane, w, m, lt8, tile);
    else panel_update<T, NB, ROW, true>(a, Lb, ld, j, kb, lane, w, row, lt8);
  }
  const int fail = potf2_regs<T, NB>(a, w, row, col);
  // A failed pivot at panel column wf = fail - 1: the columns before it are final in every row
  // (LAPACK's leading factor) and written, and so is column wf down to its diagonal (the pivot
  // as tested, which lane wf holds: LAPACK's leading block); the rest is not.
  const int wf = fail ? fail - 1 : w;
  if (fail && lane == 0) info[q] = j + fail;
  if constexpr (ROW) {
#pragma unroll
    for (int c = 0; c < NB; ++c)
      if (c > lane) a[c] = T(0);
    warp_rows_store(a, Lb, ld, j, j, w, [&](int i, int c) {
      return i < m && (c < wf || (fail && c == wf && i <= wf));
    }, tile);
  } else if (row) {
#pragma unroll
    for (int c = 0; c < NB; ++c)
      if (c < wf || (fail && c == wf && lane <= wf))
        Lb[at<ROW>(j + lane, j + c, ld)] = c > lane ? T(0) : a[c];
  }
}

// NBMIN, NBMAX: the narrowest and widest of the four register widths compiled
// (potrf_cuda.small_widths says which a launch takes and why); a panel narrower than NBMIN takes
// the NBMIN-wide code, and no panel of the launch is wider than NBMAX.
// Four blocks of four warps an SM at least: 128 registers a thread (142 unbounded, for the NB
// = 32 branch; complex types two blocks). At 128 some float64 ones spill a little (ptxas, sm_90,
// 2026-11-26: column-major with every width 52 bytes of spill stores, the 32-wide code alone
// none; row-major 0 and 28).
template <typename T, int WARPS, bool ROW, int NBMIN, int NBMAX>
__global__ void __launch_bounds__(32 * WARPS, 16 / WARPS / wide<T>())
small_step(const unsigned long long* tbl, const long long* meta, const int* imeta,
           const int* tasks, int K, int lo, int hi, int unused) {
  __shared__ __align__(16) T col[WARPS][2 * 32];   // potf2_regs' column broadcast, per warp
  __shared__ __align__(16) T lt[WARPS][2 * 8 * 32];  // the update's top rows, per warp
  constexpr bool ST = ROW && !dynamic_tiles<T>();
  __shared__ __align__(16) T rtile[ST ? WARPS : 1][ST ? 2 * row_tile<T>() : 1];  // row tiles
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5;
  vb::Task tk;
  if (!vb::warp_task(tasks, lo, hi, WARPS, warp, tk)) return;
  const vb::Matrix pr = vb::matrix_of(meta, imeta, K, tk.q);
  int* info = reinterpret_cast<int*>(tbl[2]);
  const int j = tk.a0, w = tk.a1, kb = tk.a2, m = pr.n - j;
  // Failed at an earlier step: stop, like LAPACK. Not read for a first panel (the host zeroed
  // info); for a later one the read, across the link, is in flight while the panel's rows load
  // (small_panel tests it before its first write).
  const int failed = j > 0 ? info[tk.q] : 0;
  // A panel of a later block column reads L: the block update has written it there.
  const T* Ab = reinterpret_cast<const T*>(tbl[kb > 0 ? 1 : 0]) + pr.off;
  T* Lb = reinterpret_cast<T*>(tbl[1]) + pr.off;
  T* cb = col[warp];
  T* tw = lt[warp];
  T* rt = dynamic_tiles<T>()
              ? reinterpret_cast<T*>(smem_raw) + (ROW ? warp * 2 * row_tile<T>() : 0)
              : rtile[ST ? warp : 0];
  static_assert(NBMIN <= NBMAX && NBMAX % 8 == 0 && NBMAX <= 32, "register widths");
  if (NBMIN <= 8 && (NBMAX == 8 || w <= 8))
    small_panel<T, 8, ROW>(Ab, Lb, pr.ld, j, kb, m, w, info, tk.q, failed, cb, tw, rt);
  else if (NBMIN <= 16 && (NBMAX == 16 || w <= 16))
    small_panel<T, 16, ROW>(Ab, Lb, pr.ld, j, kb, m, w, info, tk.q, failed, cb, tw, rt);
  else if (NBMIN <= 24 && (NBMAX == 24 || w <= 24))
    small_panel<T, 24, ROW>(Ab, Lb, pr.ld, j, kb, m, w, info, tk.q, failed, cb, tw, rt);
  else small_panel<T, 32, ROW>(Ab, Lb, pr.ld, j, kb, m, w, info, tk.q, failed, cb, tw, rt);
}

// ================================================================== separated kernels
// For panels too tall for one block: a 2-D grid of (problem, row tile), where the grid is sized
// for the tallest panel of the group and blocks past their own problem's rows exit at entry
// (adaptive subgrid truncation). Problems are in gridDim.x, so batches beyond 65,535 work.

// The entry shared by the two update kernels: find the block's problem and panel, write the
// zeros above the panel (the first `zero_tiles` tiles in y), and the block's row tile. False when
// the block has nothing to multiply: past `hi`, a failed problem, a zero tile, or past its rows.
template <typename T>
struct UpdateTile {
  const T* A;  // where the panel's values come from: A, or L in a later block column
  T* L;
  long long ld;
  int q, j, w, kb, r0, mx;  // kb: the panel's block column (its update reads [kb, j))
};

template <typename T, int NB, int RC, bool ROW>
__device__ __forceinline__ bool update_tile(const unsigned long long* tbl, const long long* meta,
                                            const int* imeta, const int* tasks, int K, int lo,
                                            int hi, int zero_tiles, UpdateTile<T>& t) {
  vb::Task tk;
  if (!vb::block_task(tasks, lo, hi, tk)) return false;
  const int* info = reinterpret_cast<const int*>(tbl[2]);
  const vb::Matrix pr = vb::matrix_of(meta, imeta, K, tk.q);  // with info: one round trip
  // Stop at an earlier step's failure only: this launch's own first row tile may set info
  // (factor_diag, info = j + column > j) while its other tiles are still to start, and they
  // must still bring their rows up to date for trsm_step, which solves them against the
  // columns before the failing one.
  const int fail = info[tk.q];
  if (fail != 0 && fail <= tk.a0) return false;
  t.q = tk.q;
  t.j = tk.a0;
  t.w = tk.a1;
  t.kb = tk.a2;
  const int m = pr.n - t.j;
  t.A = reinterpret_cast<const T*>(tbl[t.kb > 0 ? 1 : 0]) + pr.off;
  t.L = reinterpret_cast<T*>(tbl[1]) + pr.off;
  t.ld = pr.ld;
  if ((int)blockIdx.y < zero_tiles) {
    const int z0 = blockIdx.y * RC;
    if (z0 < t.j) zero_rect<T, ROW>(t.L, t.ld, z0, min(t.j, z0 + RC), t.j, t.w, threadIdx.x, blockDim.x);
    return false;
  }
  t.r0 = (blockIdx.y - zero_tiles) * RC;
  if (t.r0 >= m) return false;
  t.mx = min(RC, m - t.r0);
  return true;
}

// The panel's diagonal block, factored by the block of its first row tile once that block has
// written the tile, updated, to L (every thread of the block calls this after its last store).
// This was a launch of its own (potf2_step, one warp a task) between the update and the trsm of
// every separated panel: in a 3-D Laplacian's factorization (40^3, H100, 2026-11-25) 404 such
// launches of ~10 us each, 15% of the kernel time, each on the critical path of its front. No
// other block of the launch reads the diagonal block (they read the factored columns left of
// it), so factoring it in place here races with no read of it. Writes L11 (zeros above its
// diagonal) and, on a failed pivot, info, the leading columns before it and the pivot as tested,
// as the fused kernels do; trsm_step then solves the rows below. The launch's other blocks of the task must not stop
// on that info (update_tile reads it at their start, which may come after this write): they
// stop only at an earlier step's.
// `sm`: NB * (NB + 1) + 2 * NB elements of shared memory that no thread reads any more (the
// update kernels' pipeline buffers, at least 2,176 elements for NB = 32).
template <typename T, int NB, bool ROW>
__device__ __forceinline__ void factor_diag(const UpdateTile<T>& t, int* info, T* sm) {
  // The block through shared memory: the block's loads and stores coalesce, and warp 0 reads its
  // rows at fixed shared offsets. Loading them straight from column-major L took one 64-bit
  // address register per column, and the update kernels 166 registers a thread against 78.
  constexpr int LDD = NB + 1;
  T* D = sm;              // D[r * LDD + c] = L(j + r, j + c)
  T* col = sm + NB * LDD;  // potf2_regs' column broadcast
  __shared__ int s_wf;
  const int w = t.w, nt = blockDim.x;
  __syncthreads();  // the tile's rows are in L, and `sm` is free
  for (int e = threadIdx.x; e < w * w; e += nt) {
    const int r = ROW ? e / w : e % w, c = ROW ? e % w : e / w;
    D[r * LDD + c] = t.L[at<ROW>(t.j + r, t.j + c, t.ld)];
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    T a[NB];
#pragma unroll
    for (int c = 0; c < NB; ++c) a[c] = (lane < w && c <= lane && c < w) ? D[lane * LDD + c] : T(0);
    const int fail = potf2_regs<T, NB>(a, w, lane < w, col);
    const int wf = fail ? fail - 1 : w;
    if (fail && lane == 0) info[t.q] = t.j + fail;
    if (lane < w) {
#pragma unroll
      for (int c = 0; c < NB; ++c)
        if (c < w) D[lane * LDD + c] = c <= lane ? a[c] : T(0);
    }
    if (lane == 0) s_wf = wf;
  }
  __syncthreads();
  const int wf = s_wf;
  for (int e = threadIdx.x; e < w * wf; e += nt) {
    const int r = ROW ? e / wf : e % w, c = ROW ? e % wf : e / w;
    t.L[at<ROW>(t.j + r, t.j + c, t.ld)] = D[r * LDD + c];
  }
  // after a failure, the failed column down to its diagonal: zeros, then the pivot as tested
  // (LAPACK's leading block)
  if (wf < w && (int)threadIdx.x <= wf)
    t.L[at<ROW>(t.j + threadIdx.x, t.j + wf, t.ld)] = D[threadIdx.x * LDD + wf];
}

// update: L[j + r, j + c] = A[j + r, j + c] - sum_k L[j + r, k] L[j + c, k] for the tile's rows
// (j = 0: the panel copied), then the first row tile's block factors the diagonal block
// (factor_diag). RC rows per tile (32, 64, 128) is picked per launch from the tallest panel, as for fused_step:
// with 128-row tiles, panels of 32 rows left three quarters of each block idle (12.5x its floor
// at uniform Nmax 512, last step).
template <typename T, int NB, int RC, bool ROW>
// At least 768 threads an SM (<= 80 registers a thread, as before factor_diag: its 32-column
// row in registers took float64 builds to 94-98 and RC = 128 to two blocks an SM; capped, ptxas
// spills 12-68 bytes, 2026-11-25); complex types half as many.
__global__ void __launch_bounds__(2 * RC, 384 / RC / wide<T>())
update_step(const unsigned long long* tbl, const long long* meta, const int* imeta, const int* tasks,
            int K, int lo, int hi, int zero_tiles) {
  constexpr int WARPS = RC / 16, NT = 2 * RC, TM = RC / 32, TN = NB / WARPS, KB = 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sbuf = reinterpret_cast<T*>(smem_raw);
  UpdateTile<T> t;
  if (!update_tile<T, NB, RC, ROW>(tbl, meta, imeta, tasks, K, lo, hi, zero_tiles, t)) return;
  const int tid = threadIdx.x, ty = tid & 31, tx = tid >> 5;
  T acc[TM][TN];
  gemm_nt<T, RC, NB, WARPS, KB, ROW>(t.L + at<ROW>(0, t.kb, t.ld), t.ld, t.j + t.r0, t.mx, t.j,
                                     t.w, t.j - t.kb, acc, sbuf);
  if (ROW) {
    // Stage through shared memory so that each row of the tile is written contiguously.
    T* C = sbuf;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int jj = 0; jj < TN; ++jj) C[(ty + 32 * i) * (NB + 1) + tx * TN + jj] = acc[i][jj];
    __syncthreads();
    for (int e = tid; e < t.mx * NB; e += NT) {
      const int r = e / NB, c = e % NB;
      if (c < t.w) {
        const long long g = at<ROW>(t.j + t.r0 + r, t.j + c, t.ld);
        t.L[g] = t.A[g] - C[r * (NB + 1) + c];
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int jj = 0; jj < TN; ++jj) {
        const int r = ty + 32 * i, c = tx * TN + jj;
        if (r < t.mx && c < t.w) {
          const long long g = at<ROW>(t.j + t.r0 + r, t.j + c, t.ld);
          t.L[g] = t.A[g] - acc[i][jj];
        }
      }
  }
  if (t.r0 == 0) factor_diag<T, NB, ROW>(t, reinterpret_cast<int*>(tbl[2]), sbuf);
}

// update on FP64 tensor cores (float64 only): the same task as update_step, with each warp
// computing a 32 x NB tile by DMMA (pipeline.cuh). The update is 73% of the kernel time at
// uniform Nmax 512 and ran at 6.9 TFLOP/s with FMA (profile_cuda.py launches, H100,
// 2026-11-21). Shared tiles are laid out by pipeline.cuh's sm(): row-major L has k contiguous.
template <int NB, int RC, bool ROW>
__global__ void __launch_bounds__(RC)
update_mma(const unsigned long long* tbl, const long long* meta, const int* imeta, const int* tasks,
           int K, int lo, int hi, int zero_tiles) {
  constexpr int KB = 16, NT = RC, MT = 4, NTL = NB / 8;
  constexpr int SA = ROW ? RC * (KB + 4) : KB * (RC + 8);
  constexpr int SB = ROW ? NB * (KB + 4) : KB * (NB + 8);
  constexpr int STAGE = SA + SB;
  static_assert(RC % 32 == 0 && NB % 8 == 0, "tile shape");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  double* sbuf = reinterpret_cast<double*>(smem_raw);
  UpdateTile<double> t;
  if (!update_tile<double, NB, RC, ROW>(tbl, meta, imeta, tasks, K, lo, hi, zero_tiles, t)) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;

  double acc[MT][NTL][2];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NTL; ++ni) acc[mi][ni][0] = acc[mi][ni][1] = 0.0;
  const auto ia = [](int r, int kk) { return sm<ROW, RC, KB>(r, kk); };
  const auto ib = [](int c, int kk) { return sm<ROW, NB, KB>(c, kk); };
  const double* Lk = t.L + at<ROW>(0, t.kb, t.ld);  // the columns [kb, j) the update reads
  const int kn = t.j - t.kb;
  k_pipeline<KB>(
      kn,
      [&](int buf, int k0) {
        double* sA = sbuf + buf * STAGE;
        stage_rows<double, ROW, RC, KB>(sA, Lk, t.ld, t.j + t.r0, t.mx, k0, kn, tid, NT, ia);
        stage_rows<double, ROW, NB, KB>(sA + SA, Lk, t.ld, t.j, t.w, k0, kn, tid, NT, ib);
        cp_async_commit();
      },
      [&](int buf) {
        const double* sA = sbuf + buf * STAGE;
        const double* sB = sA + SA;
#pragma unroll
        for (int ks = 0; ks < KB; ks += 4) {
          double a[MT], b[NTL];
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) a[mi] = sA[ia(warp * 32 + mi * 8 + gid, ks + tig)];
#pragma unroll
          for (int ni = 0; ni < NTL; ++ni) b[ni] = sB[ib(ni * 8 + gid, ks + tig)];
#pragma unroll
          for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int ni = 0; ni < NTL; ++ni)
              dmma_m8n8k4(acc[mi][ni][0], acc[mi][ni][1], a[mi], b[ni]);
        }
      });
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NTL; ++ni)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = warp * 32 + mi * 8 + gid, c = ni * 8 + 2 * tig + e;
        if (r < t.mx && c < t.w) {
          const long long g = at<ROW>(t.j + t.r0 + r, t.j + c, t.ld);
          t.L[g] = t.A[g] - acc[mi][ni][e];
        }
      }
  if (t.r0 == 0) factor_diag<double, NB, ROW>(t, reinterpret_cast<int*>(tbl[2]), sbuf);
}

// trsm: rows below the diagonal block, one row per thread, 128 rows per block; L11 from L.
template <typename T, int NB, bool ROW>
__global__ void __launch_bounds__(128)
trsm_step(const unsigned long long* tbl, const long long* meta, const int* imeta, const int* tasks,
          int K, int lo, int hi, int unused) {
  T* L = reinterpret_cast<T*>(tbl[1]);
  int* info = reinterpret_cast<int*>(tbl[2]);
  constexpr int RT = 128;
  __shared__ __align__(16) T D[NB * NB];  // D[k * NB + c] = L(c, k): rows pair into 128-bit loads
  __shared__ T invd[NB];
  __shared__ __align__(16) T rtile[ROW ? RT / 32 : 1][ROW ? row_tile<T>() : 1];  // row tile
  vb::Task tk;
  if (!vb::block_task(tasks, lo, hi, tk)) return;
  const vb::Matrix pr = vb::matrix_of(meta, imeta, K, tk.q);
  const int j = tk.a0, w = tk.a1, m = pr.n - j;
  // info > j: this step's diagonal block (factor_diag) failed at column info - 1, after writing the wf columns before
  // it; solve the rows below against those. info <= j: an earlier step failed; stop.
  const int fail = info[tk.q];
  if (fail != 0 && fail <= j) return;
  const int wf = fail ? fail - 1 - j : w;
  if (wf == 0) return;
  const int r0 = w + blockIdx.y * RT;
  if (r0 >= m) return;
  // A first panel's rows are read from A (its update copied them to L, the same values: reading
  // L here took ptxas from 94 registers to 166).
  const T* S = (j == 0 ? reinterpret_cast<const T*>(tbl[0]) : L) + pr.off;
  T* Lb = L + pr.off;
  const long long ld = pr.ld;
  const int tid = threadIdx.x;
  for (int e = tid; e < NB * NB; e += RT) {
    const int k = e / NB, c = e % NB;
    if (k < wf && c < wf && c >= k) D[k * NB + c] = Lb[at<ROW>(j + c, j + k, ld)];
  }
  __syncthreads();
  if (tid < wf) invd[tid] = T(1) / D[tid * NB + tid];
  __syncthreads();
  T x[NB];
  if constexpr (ROW) {
    const int rb = r0 + (tid & ~31);  // the warp's first row: whole warps stay for the tile
    if (rb >= m) return;
    T* tile = rtile[tid / 32];
    const auto in = [&](int i, int) { return rb + i < m; };
    warp_rows_load(x, S, ld, j + rb, j, wf, in, tile);
    trsm_row<T, NB>(x, D, NB, invd, wf);
    warp_rows_store(x, Lb, ld, j + rb, j, wf, in, tile);
  } else {
    const int r = r0 + tid;
    if (r >= m) return;
#pragma unroll
    for (int c = 0; c < NB; ++c) x[c] = c < wf ? S[at<ROW>(j + r, j + c, ld)] : T(0);
    trsm_row<T, NB>(x, D, NB, invd, wf);
#pragma unroll
    for (int c = 0; c < NB; ++c)
      if (c < wf) Lb[at<ROW>(j + r, j + c, ld)] = x[c];
  }
}

// ================================================================== Schur complement (partial)
// S = A22 - L21 L21^H for problems that factor p < n columns, on 64 x 64 tiles of the trailing
// block's lower triangle (blockIdx.y enumerates tile pairs bi >= bj). Diagonal tiles also write
// the zeros of the (1, 2) block above them; off-diagonal tiles the zeros of their mirror tile.
template <typename T, bool ROW>
__global__ void __launch_bounds__(256)
schur_step(const unsigned long long* tbl, const long long* meta, const int* imeta, const int* tasks,
           int K, int lo, int hi, int unused) {
  const T* A = reinterpret_cast<const T*>(tbl[0]);
  T* L = reinterpret_cast<T*>(tbl[1]);
  int* info = reinterpret_cast<int*>(tbl[2]);
  constexpr int TS = 64, WARPS = 8, NT = 256, TM = TS / 32, TN = TS / WARPS, KB = 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sbuf = reinterpret_cast<T*>(smem_raw);
  vb::Task tk;
  if (!vb::block_task(tasks, lo, hi, tk)) return;
  const vb::Matrix pr = vb::matrix_of(meta, imeta, K, tk.q);  // with info: one round trip
  if (info[tk.q] != 0) return;
  const int p = tk.a0, tr = tk.a1;
  const int y = blockIdx.y;
  int bi = (int)((sqrtf(8.0f * y + 1.0f) - 1.0f) * 0.5f);
  while ((bi + 1) * (bi + 2) / 2 <= y) ++bi;
  while (bi * (bi + 1) / 2 > y) --bi;
  const int bj = y - bi * (bi + 1) / 2;
  const int r0 = bi * TS, c0 = bj * TS;
  if (r0 >= tr) return;
  const T* Ab = A + pr.off;
  T* Lb = L + pr.off;
  const long long ld = pr.ld;
  const int tid = threadIdx.x, ty = tid & 31, tx = tid >> 5;
  const int mx = min(TS, tr - r0), ny = min(TS, tr - c0);
  T acc[TM][TN];
  gemm_nt<T, TS, TS, WARPS, KB, ROW>(Lb, ld, p + r0, mx, p + c0, ny, p, acc, sbuf);
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int jj = 0; jj < TN; ++jj) {
      const int r = ty + 32 * i, c = tx * TN + jj;
      if (r < mx && c < ny) {
        const long long g = at<ROW>(p + r0 + r, p + c0 + c, ld);
        T v = (r0 + r >= c0 + c) ? Ab[g] - acc[i][jj] : T(0);
        if constexpr (is_cx<T>::value) {  // (a Hermitian diagonal is real, as ZHERK's)
          if (r0 + r == c0 + c) v = real_part(v);
        }
        Lb[g] = v;
      }
    }
  if (bi > bj) zero_rect<T, ROW>(Lb, ld, p + c0, p + c0 + ny, p + r0, mx, tid, NT);
  else zero_rect<T, ROW>(Lb, ld, 0, p, p + c0, ny, tid, NT);
}

}  // namespace vb

// vbatch: the blas kernel family (ops/blas.py): GEMM joins, diagonal blocks, copies, on views.
//
// Every kernel takes (tbl, meta, imeta, tasks, K, lo, hi, extra), like every vbatched kernel
// (vbatched.cuh). The family's section of the per-call table is: tbl[0] alpha, tbl[1] beta (the
// call's, as float64 bits), tbl[2] info, tbl[3] and tbl[4] alpha's and beta's imaginary parts
// (zero for real types), tbl[BLAS_BUF + s] the op's buffer s. meta holds, per buffer s,
// offset[K] then ld[K] (meta + s * 2K). A task row is (q, r0, mm, k0, kk, nn, c0, src): a GEMM's
// output columns are [c0, c0 + nn) (0 but in a blocked Cholesky's block updates); src = 1 marks
// the first task to write its rows of a triangular op's X, which reads their values from the
// launch's source (its right-hand sides B, scaled) instead of from X: no copy of B into X
// runs first (FirstValues).
//
// A *view* is a buffer read as is or transposed: element (r, c) at r * ld + c when its rows are
// contiguous (a row-major buffer, or a column-major one transposed), else r + c * ld. Which
// buffer each operand is, and how it is viewed, is fixed per launch (the task kind's params), so
// it comes packed into `extra` (kernels/blas_cuda.py: the same bit layout):
//   bits 0-2 / 3-5 / 6-8 / 9-11: the buffers of operands 0..3 (7: absent)
//   bits 12-15: each operand's view has contiguous rows
//   bits 16-17: GEMM: the triangle of the output written (0 all, 1 lower, 2 upper);
//               diagonal blocks: bit 16 lower, bit 17 unit diagonal;
//               copies: the source is symmetric, that triangle read (0 none, 1 lower, 2 upper)
//   bits 18-19: alpha (0 the call's, 1 -1, 2 +1, 3 the call's conjugated); bits 20-21: beta
//               (0 the call's, 1 0, 2 +1)
//   bit 22: skip problems whose info is set (a solve after a failed factorization)
//   bits 23-25: the source buffer (7: absent), bit 26: its view has contiguous rows, bits 27-28:
//               its scale (as alpha's bits); read by the tasks whose src is 1
//   bits 29-30: operand 0's and operand 1's views are conjugated (complex types only). A GEMM
//               on one triangle with a conjugated operand is Hermitian (HERK, HER2K, a
//               Hermitian Cholesky's update): its diagonal's imaginary parts are zeroed, as
//               zherk's are. A copy from a symmetric source with the bit reads it as Hermitian:
//               the mirrored half conjugated, the diagonal's imaginary parts zero (HEMM).

namespace vb {

constexpr int BLAS_BUF = 5;  // the table's first buffer entry

struct BlasLaunch {
  int slot[4];
  bool row[4];
  int tri;
  cx<double> alpha, beta;
  bool skip;
  int src;
  bool src_row;
  cx<double> scale;
  bool conj[2];
  __device__ __forceinline__ bool herm() const { return tri != 0 && (conj[0] || conj[1]); }
};

// A scale code of `extra` (alpha's bits) as a number: the call's alpha, -1, +1 or conj(alpha).
__device__ __forceinline__ cx<double> blas_scale(const unsigned long long* tbl, int code) {
  if (code == 1) return cx<double>(-1.0);
  if (code == 2) return cx<double>(1.0);
  const double im = __longlong_as_double((long long)tbl[3]);
  return {__longlong_as_double((long long)tbl[0]), code == 3 ? -im : im};
}

__device__ __forceinline__ BlasLaunch blas_launch(const unsigned long long* tbl, int extra) {
  BlasLaunch b;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    b.slot[i] = (extra >> (3 * i)) & 7;
    b.row[i] = (extra >> (12 + i)) & 1;
  }
  b.tri = (extra >> 16) & 3;
  const int bm = (extra >> 20) & 3;
  b.alpha = blas_scale(tbl, (extra >> 18) & 3);
  b.beta = bm == 1 ? cx<double>(0.0) : bm == 2 ? cx<double>(1.0)
         : cx<double>(__longlong_as_double((long long)tbl[1]),
                      __longlong_as_double((long long)tbl[4]));
  b.skip = (extra >> 22) & 1;
  b.src = (extra >> 23) & 7;
  b.src_row = (extra >> 26) & 1;
  b.scale = blas_scale(tbl, (extra >> 27) & 3);
  b.conj[0] = (extra >> 29) & 1;
  b.conj[1] = (extra >> 30) & 1;
  return b;
}

// A buffer's view; get() reads it conjugated where the view is (cj: complex types only).
template <typename T>
struct View {
  T* p;
  long long ld;
  bool row, cj;
  __device__ __forceinline__ T& operator()(long long r, long long c) const {
    return p[row ? r * ld + c : r + c * ld];
  }
  __device__ __forceinline__ T get(long long r, long long c) const {
    return conj_if((*this)(r, c), cj);
  }
};

template <typename T>
__device__ __forceinline__ View<T> view_of(const unsigned long long* tbl, const long long* meta,
                                           int K, int q, int slot, bool row, bool cj = false) {
  View<T> v;
  v.p = reinterpret_cast<T*>(tbl[BLAS_BUF + slot]) + meta[(long long)slot * 2 * K + q];
  v.ld = meta[(long long)slot * 2 * K + K + q];
  v.row = row;
  v.cj = cj;
  return v;
}

__device__ __forceinline__ bool failed(const unsigned long long* tbl, int q) {
  return reinterpret_cast<const int*>(tbl[2])[q] != 0;
}

// The problem and its args (q, r0, mm, k0, kk, nn, c0, src) of the block's task, or of its warp
// `warp`'s where a block takes `per` tasks.
__device__ __forceinline__ bool blas_task(const int* tasks, int lo, int hi, int* t, int per = 1,
                                          int warp = 0) {
  const int row = lo + (int)blockIdx.x * per + warp;
  if (row >= hi) return false;
  const int* r = tasks + (long long)row * VB_TASK_COLS;
#pragma unroll
  for (int i = 0; i < 8; ++i) t[i] = r[i];
  return true;
}

// Where a diagonal-block task reads the first values of the rows of X it writes: X itself, or,
// the task being the first to write them (src), the launch's source times its scale (0: zeros,
// as BLAS treats B with alpha = 0: a NaN there does not reach X; F(r, c) does not read it, and
// a caller that loads first discards what it read).
template <typename T>
struct FirstValues {
  View<T> S;
  T scale;
  bool fresh;
  __device__ __forceinline__ FirstValues(const unsigned long long* tbl, const long long* meta,
                                         int K, int q, const BlasLaunch& L, int src,
                                         const View<T>& X)
      : S(src && L.src != 7 ? view_of<T>(tbl, meta, K, q, L.src, L.src_row) : X),
        scale(src && L.src != 7 ? scalar<T>(L.scale) : T(1)), fresh(src && L.src != 7) {}
  __device__ __forceinline__ T operator()(long long r, long long c) const {
    return !fresh ? S(r, c) : scale != T(0) ? scale * S(r, c) : T(0);
  }
  // The first value of an element already read from S (a caller that issues its loads first).
  __device__ __forceinline__ T of(T v) const {
    return !fresh ? v : scale != T(0) ? scale * v : T(0);
  }
};

// X[r0:r0+rows, c0:c0+ncol] := its first values (F), coalesced for either layout: a skipped
// problem's first task still brings its rows in (POSV: a failed problem's solution is its B).
template <typename T>
__device__ void bring_in(const View<T>& X, const FirstValues<T>& F, int r0, int rows, int c0,
                         int ncol, int tid, int nt) {
  for (int e = tid; e < rows * ncol; e += nt) {
    int i, c;
    if (X.row) { c = e % ncol; i = e / ncol; } else { i = e % rows; c = e / rows; }
    X(r0 + i, c0 + c) = F(r0 + i, c0 + c);
  }
}

// Writing one element of a GEMM tile: O(R, c) = alpha acc + beta C(R, c) inside the triangle
// written; outside it O gets C's value (out of place) or zero (no C), so an output is complete.
// beta = 0 does not read C (BLAS: NaN there is not propagated). A Hermitian output's diagonal
// is real (BlasLaunch::herm).
template <typename T>
struct GemmOut {
  View<T> O, C;
  T alpha, beta;
  int tri;
  bool has_c, read_c, same, herm;
  __device__ __forceinline__ GemmOut(const BlasLaunch& L, const View<T>& O_, const View<T>& C_,
                                     bool has_c_)
      : O(O_), C(C_), alpha(scalar<T>(L.alpha)), beta(scalar<T>(L.beta)), tri(L.tri),
        has_c(has_c_), read_c(has_c_ && L.beta != 0.0),
        same(has_c_ && C_.p == O_.p && C_.row == O_.row),  // C is O itself (in place)
        herm(is_cx<T>::value && L.herm()) {}
  __device__ __forceinline__ bool inside(int R, int c) const {
    return tri == 0 || (tri == 1 ? R >= c : R <= c);
  }
  // put in two halves, so that a caller can have many loads of C in flight before it stores:
  // what put needs of C (zero where it reads nothing), then the store.
  __device__ __forceinline__ T load(int R, int c) const {
    return (inside(R, c) ? read_c : has_c && !same) ? C(R, c) : T(0);
  }
  __device__ __forceinline__ void store(int R, int c, T acc, T cv) const {
    if (inside(R, c)) {
      T v = alpha * acc;
      if (read_c) v += beta * cv;
      O(R, c) = herm && R == c ? real_part(v) : v;
    } else if (!same) {
      O(R, c) = cv;
    }
  }
  __device__ __forceinline__ void put(int R, int c, T acc) const { store(R, c, acc, load(R, c)); }
};

// The part of a GEMM task a block takes: its task, its BM x BN tile (row tiles slowest), the
// output and C views. False when the block has nothing to do: a skipped problem, or a tile past
// the task's rows.
template <typename T, int BM, int BN>
struct GemmTile {
  int q, r0, mm, k0, kk, nn, i0, c0;  // nn: the end of the task's columns; c0: the tile's first
  int R0, rows, cols;  // the tile's first row (absolute), its rows and columns inside the task
  bool has_c, read_c, any_in;
  static constexpr int TP = BN + 1;  // row stride of the tile as parked for store_tile
  BlasLaunch L;
  View<T> O, C;
  __device__ __forceinline__ bool find(const unsigned long long* tbl, const long long* meta,
                                       const int* tasks, int K, int lo, int hi, int extra) {
    // The grid is one dimension, task-major: gridDim.x = (hi - lo) x the launch's most tiles,
    // so the blocks that run together are mostly tiles of one task and share its A and B in L2.
    const int ntiles = gridDim.x / (hi - lo);
    const int row = lo + (int)blockIdx.x / ntiles, tile = (int)blockIdx.x % ntiles;
    const int* t = tasks + (long long)row * VB_TASK_COLS;
    q = t[0]; r0 = t[1]; mm = t[2]; k0 = t[3]; kk = t[4]; nn = t[5];
    const int cs = t[6];  // the first column
    L = blas_launch(tbl, extra);
    // The first task to write its rows reads C from the source, times its scale: O = alpha A B
    // + scale S (a solve's join); skipped, it still brings them in (no product).
    const bool fresh = t[7] != 0 && L.src != 7;
    if (L.skip && failed(tbl, q)) {
      if (!fresh) return false;
      kk = 0;
    }
    const int tiles_n = (nn + BN - 1) / BN;
    const int tm = tile / tiles_n, tn = tile % tiles_n;
    if (tm * BM >= mm) return false;
    i0 = tm * BM;
    c0 = cs + tn * BN;
    nn += cs;  // from here on the end of the columns: every kernel compares absolute columns
    O = view_of<T>(tbl, meta, K, q, L.slot[3], L.row[3]);
    if (fresh) {
      L.slot[2] = L.src;
      L.row[2] = L.src_row;
      L.beta = L.scale;
    }
    has_c = L.slot[2] != 7;
    C = has_c ? view_of<T>(tbl, meta, K, q, L.slot[2], L.row[2]) : O;
    read_c = has_c && L.beta != 0.0;
    R0 = r0 + i0;
    rows = min(BM, mm - i0);
    cols = min(BN, nn - c0);
    // Whether the tile lies (partly) inside the triangle written: if not, no product is needed.
    any_in = L.tri == 0 || (L.tri == 1 ? R0 + rows - 1 >= c0 : R0 <= c0 + cols - 1);
    return true;
  }
  __device__ __forceinline__ bool multiplies() const { return any_in && kk > 0 && L.alpha != 0.0; }
};

// O[r0 + i, c] = alpha * sum_l A[r0 + i, k0 + l] B[k0 + l, c] + beta * C[r0 + i, c] for i < mm,
// c < nn, on views: operands 0 A, 1 B, 2 C (absent: beta taken as 0), 3 O. Block tile BM x BN
// (GemmTile: which task and tile), BK-deep slices through shared
// memory, each thread a TM x TN register tile with rows and columns strided across the block.
// A triangle restriction writes only O's lower or upper part (absolute row r0 + i against c);
// the rest of O gets C's values (a copy, out of place) or zeros (no C), so an output is complete.
template <typename T, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
blas_gemm(const unsigned long long* tbl, const long long* meta, const int* imeta,
          const int* tasks, int K, int lo, int hi, int extra) {
  constexpr int TX = BN / TN, TY = BM / TM, NT = TX * TY;
  __shared__ T As[BK][BM + 1];
  __shared__ T Bs[BK][BN + 1];
  GemmTile<T, BM, BN> g;
  if (!g.find(tbl, meta, tasks, K, lo, hi, extra)) return;
  const int q = g.q, r0 = g.r0, mm = g.mm, k0 = g.k0, kk = g.kk, nn = g.nn, i0 = g.i0, c0 = g.c0;
  const BlasLaunch& L = g.L;
  const int tid = threadIdx.x;
  const int tx = tid % TX, ty = tid / TX;
  T acc[TM][TN];
#pragma unroll
  for (int a = 0; a < TM; ++a)
#pragma unroll
    for (int b = 0; b < TN; ++b) acc[a][b] = T(0);
  if (g.multiplies()) {
    const View<T> A = view_of<T>(tbl, meta, K, q, L.slot[0], L.row[0], L.conj[0]);
    const View<T> B = view_of<T>(tbl, meta, K, q, L.slot[1], L.row[1], L.conj[1]);
    for (int l0 = 0; l0 < kk; l0 += BK) {
      // Threads run along the view's contiguous dimension, so loads coalesce either way.
      for (int e = tid; e < BM * BK; e += NT) {
        int i, l;
        if (A.row) { l = e % BK; i = e / BK; } else { i = e % BM; l = e / BM; }
        const int gi = i0 + i, gl = l0 + l;
        As[l][i] = (gi < mm && gl < kk) ? A.get(r0 + gi, k0 + gl) : T(0);
      }
      for (int e = tid; e < BN * BK; e += NT) {
        int c, l;
        if (B.row) { c = e % BN; l = e / BN; } else { l = e % BK; c = e / BK; }
        const int gc = c0 + c, gl = l0 + l;
        Bs[l][c] = (gc < nn && gl < kk) ? B.get(k0 + gl, gc) : T(0);
      }
      __syncthreads();
#pragma unroll
      for (int l = 0; l < BK; ++l) {
        T ra[TM], rb[TN];
#pragma unroll
        for (int a = 0; a < TM; ++a) ra[a] = As[l][ty + TY * a];
#pragma unroll
        for (int b = 0; b < TN; ++b) rb[b] = Bs[l][tx + TX * b];
#pragma unroll
        for (int a = 0; a < TM; ++a)
#pragma unroll
          for (int b = 0; b < TN; ++b) acc[a][b] += ra[a] * rb[b];
      }
      __syncthreads();
    }
  }
  const GemmOut<T> out(L, g.O, g.C, g.has_c);
#pragma unroll
  for (int a = 0; a < TM; ++a) {
    const int i = i0 + ty + TY * a;
    if (i >= mm) continue;
#pragma unroll
    for (int b = 0; b < TN; ++b) {
      const int c = c0 + tx + TX * b;
      if (c < nn) out.put(r0 + i, c, acc[a][b]);
    }
  }
}

// C's tile of a GEMM block into L2 at the block's start, so that the epilogue's loads of it,
// after the K loop, wait on L2 rather than DRAM: a 128-byte line at a time along C's contiguous
// dimension (its last element too, for a run not aligned to lines).
template <typename T, int BM, int BN, int NT>
__device__ __forceinline__ void prefetch_c(const GemmTile<T, BM, BN>& g, int tid) {
  const int rows = g.rows, cols = g.cols, R0 = g.R0;
  const auto lines = [&](auto crow_) {
    constexpr bool CROW = decltype(crow_)::value;
    constexpr int EL = 128 / sizeof(T), LP = (CROW ? BN : BM) / EL + 1;  // lines a run touches
    const int fl = CROW ? cols : rows, sl = CROW ? rows : cols;
    for (int i = tid; i < sl * LP; i += NT) {
      const int sx = i / LP, fx = min(EL * (i % LP), fl - 1);
      prefetch_l2(&g.C(R0 + (CROW ? sx : fx), g.c0 + (CROW ? fx : sx)));
    }
  };
  if (g.C.row) lines(Flag<true>());
  else lines(Flag<false>());
}

// The epilogue of the tiled GEMMs: the block's accumulators are parked in shared memory
// (sbuf[r * TP + c], TP = BN + 1: the odd stride keeps column-wise reads conflict-free), and the
// block reads C and writes O along O's contiguous dimension, EB elements a thread at a time with
// all of their loads of C in flight before the stores. It was 42% of the warps' stall samples
// and most of the instructions of a 384^3 DMMA GEMM (~1,200 a warp for every 16 elements a
// thread, in an element-wise form that tested triangle, orientation and C per element: ncu
// source counters, H200, 2026-11-24); a tile written whole (no triangle, or wholly inside it)
// with C oriented as O now steps pointers. Written from the fragments directly, a warp's stores touched 8 rows x 4
// columns at once, and a GEMM with k = 32 ran 6.7x its floor (gemm-panel512, 2026-11-21).
// Half the tile a round trip: the whole tile, 64 loads a thread, measured 2-7% slower on
// 256-512^3 DMMA GEMMs (H200, 2026-11-24).
template <typename T, int BM, int BN, int NT>
__device__ __forceinline__ void store_tile(const GemmTile<T, BM, BN>& g, const T* sbuf, int tid) {
  constexpr int TP = GemmTile<T, BM, BN>::TP, EB = BM * BN / NT / 2 > 16 ? BM * BN / NT / 2 : 16;
  const int rows = g.rows, cols = g.cols, R0 = g.R0;
  const bool read_c = g.read_c;
  static_assert(NT % BN == 0 && NT % BM == 0, "epilogue mapping");
  // Thread (f, s): f along O's contiguous dimension, s = s0, s0 + step, ... along the other.
  const bool orow = g.O.row;
  const int F = orow ? BN : BM, step = NT / F, f = tid % F, s0 = tid / F;
  const int fl = orow ? cols : rows, sl = orow ? rows : cols;
  if (f >= fl) return;
  // The whole tile inside the triangle written (SYRK's tiles off the diagonal) takes the
  // pointer path too: SYRK of A n x n, n ~ U[1, 512], 2000 problems, 4.08 -> 3.70 ms in
  // float64, 4.41 -> 4.03 in float32 (H200, 2026-11-24).
  const bool whole = g.L.tri == 0 ||
                     (g.L.tri == 1 ? R0 >= g.c0 + cols - 1 : R0 + rows - 1 <= g.c0);
  if (whole && (!g.has_c || g.C.row == orow)) {
    static_assert(!is_cx<T>::value, "the whole-tile path writes no Hermitian diagonal");
    const T alpha = scalar<T>(g.L.alpha), beta = scalar<T>(g.L.beta);
    const auto at = [&](const View<T>& v) {  // element (s0, f) of the tile in v
      return v.p + (orow ? (long long)(R0 + s0) * v.ld + g.c0 + f
                         : (long long)(R0 + f) + (long long)(g.c0 + s0) * v.ld);
    };
    T* po = at(g.O);
    const T* pc = at(g.C);
    const long long so = (long long)step * g.O.ld, sc = (long long)step * g.C.ld;
    const T* ps = sbuf + (orow ? s0 * TP + f : f * TP + s0);
    const int ss = orow ? step * TP : step;
    for (int e0 = s0; e0 < sl; e0 += EB * step) {
      T cv[EB];
      if (read_c) {
#pragma unroll
        for (int e = 0; e < EB; ++e) cv[e] = e0 + e * step < sl ? pc[e * sc] : T(0);
      }
#pragma unroll
      for (int e = 0; e < EB; ++e) {
        if (e0 + e * step >= sl) break;
        T v = alpha * ps[e * ss];
        if (read_c) v += beta * cv[e];
        po[e * so] = v;
      }
      po += EB * so;
      pc += EB * sc;
      ps += EB * ss;
    }
    return;
  }
  // Any other tile (across the triangle's edge, or C oriented unlike O): element by element.
  const GemmOut<T> out(g.L, g.O, g.C, g.has_c);
  for (int e0 = s0; e0 < sl; e0 += EB * step) {
    T cv[EB];
#pragma unroll
    for (int e = 0; e < EB; ++e) {
      const int sx = e0 + e * step;
      cv[e] = sx < sl ? out.load(R0 + (orow ? sx : f), g.c0 + (orow ? f : sx)) : T(0);
    }
#pragma unroll
    for (int e = 0; e < EB; ++e) {
      const int sx = e0 + e * step;
      const int r = orow ? sx : f, c = orow ? f : sx;
      if (sx < sl) out.store(R0 + r, g.c0 + c, sbuf[r * TP + c], cv[e]);
    }
  }
}

// The operands of a GEMM task at its tile's corner: A(r0 + i0, k0) and B(k0, c0).
template <typename T, int BM, int BN>
struct GemmOperands {
  const T* A;
  const T* B;
  long long lda, ldb;
  __device__ __forceinline__ GemmOperands(const unsigned long long* tbl, const long long* meta,
                                          int K, const GemmTile<T, BM, BN>& g, bool arow,
                                          bool brow) {
    const BlasLaunch& L = g.L;
    lda = meta[(long long)L.slot[0] * 2 * K + K + g.q];
    ldb = meta[(long long)L.slot[1] * 2 * K + K + g.q];
    const long long ra = g.r0 + g.i0, cb = g.c0, k0 = g.k0;
    A = reinterpret_cast<const T*>(tbl[BLAS_BUF + L.slot[0]]) + meta[(long long)L.slot[0] * 2 * K + g.q] +
        (arow ? ra * lda + k0 : ra + k0 * lda);
    B = reinterpret_cast<const T*>(tbl[BLAS_BUF + L.slot[1]]) + meta[(long long)L.slot[1] * 2 * K + g.q] +
        (brow ? k0 * ldb + cb : k0 + cb * ldb);
  }
};

// The same task as blas_gemm in float64 on FP64 tensor cores (pipeline.cuh: m16n8k8, the
// full-rate shape). Warps of WTM x 32 (blocks of 16 x 8) tile the BM x BN block tile; K runs
// in chunks of 16 through S shared-memory stages filled by cp.async (zero-filled past the task's
// edges, so partial tiles need no case of their own). Each view's orientation is a template flag
// (AROW, BROW: the view has contiguous rows), so staging threads run along the contiguous
// dimension and the shared layout (pipeline.cuh's smw) is fixed at compile time.
//
// Fragments load two doubles a lane (128-bit), half the load instructions of 64-bit ones. The
// MMA's k order is free as long as A and B agree, and so is the order of a tile's rows and
// columns as long as the epilogue knows it: lane (g, t) takes k = 2t and 2t + 1 of each k-step
// as the fragment's k = t and t + 4, adjacent where k is contiguous in shared memory; where it
// is not, A pairs the fragment's rows g and g + 8 as tile rows 2g and 2g + 1, and B pairs two
// 8-column blocks (ni, ni + 1) as interleaved columns. A warp skips its 16 x 8 blocks that lie
// past the task's edge: over U[1, 512] sizes, 128 x 64 tiles spend 21% of their products on
// padding, 16 x 8 blocks 5% (E[n^3] against the padded volumes). MINB: the blocks a
// multiprocessor must hold (launch bounds; blas_cuda.mma_name chooses it).
template <int BM, int BN, int WTM, int S, bool AROW, bool BROW, int MINB>
__global__ void __launch_bounds__((BM / WTM) * (BN / 32) * 32, MINB)
blas_gemm_mma(const unsigned long long* tbl, const long long* meta, const int* imeta,
              const int* tasks, int K, int lo, int hi, int extra) {
  constexpr int KB = 16, WM = BM / WTM, NT = WM * (BN / 32) * 32, MT = WTM / 16, NT8 = 4;
  // k is contiguous in global memory for A with contiguous rows, and for B without.
  constexpr bool KA = AROW, KBT = !BROW;
  constexpr int SA = smw_size<KA, BM, KB>(), SB = smw_size<KBT, BN, KB>(), STAGE = SA + SB;
  constexpr int PA = smw_stride<KA, BM, KB>(), PB = smw_stride<KBT, BN, KB>();
  static_assert(BM % WTM == 0 && WTM % 16 == 0 && BN % 32 == 0 && S >= 2, "tile shape");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  double* sbuf = reinterpret_cast<double*>(smem_raw);
  GemmTile<double, BM, BN> g;
  if (!g.find(tbl, meta, tasks, K, lo, hi, extra)) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int wm = warp % WM, wn = warp / WM;
  // The warp's rows and columns inside the task (<= 0: none; its blocks past them are skipped).
  const int mlim = g.mm - g.i0 - wm * WTM, nlim = g.nn - g.c0 - wn * 32;
  if (g.read_c && g.kk > 2 * KB) prefetch_c<double, BM, BN, NT>(g, tid);
  double acc[MT][NT8][4];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NT8; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0;
  if (g.multiplies()) {
    // The tile's corner of each operand, as (o, k) = (row, k) of A and (column, k) of B.
    const GemmOperands<double, BM, BN> op(tbl, meta, K, g, AROW, BROW);
    const Stager<double, KA, BM, KB, NT, kSmw> sa(op.A, op.lda, tid);
    const Stager<double, KBT, BN, KB, NT, kSmw> sb(op.B, op.ldb, tid);
    const int ma = g.mm - g.i0, nb = g.nn - g.c0, kk = g.kk;
    const bool fa = ma >= BM, fb = nb >= BN;  // the tile lies inside each operand
    // This lane's first element of each fragment pair in a stage (the pairs above).
    const int aoff = KA ? (wm * WTM + gid) * PA + 2 * tig : 2 * tig * PA + wm * WTM + 2 * gid;
    const int boff = KBT ? (wn * 32 + gid) * PB + 2 * tig : 2 * tig * PB + wn * 32 + 2 * gid;
    // Which of the warp's 16 x 8 blocks lie inside the task: all (the common case, one
    // unrolled loop without a test), some (each block tested), or none.
    const bool whole = mlim >= WTM && nlim >= 32, active = mlim > 0 && nlim > 0;
    // One chunk's k-steps for the warp; CHECK: skip the blocks past the task's edge.
    const auto chunk = [&](const double* sA, const double* sB, auto check) {
      constexpr bool CHECK = decltype(check)::value;
#pragma unroll
      for (int ks = 0; ks < KB; ks += 8) {
        double a[MT][4], b[NT8][2];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          if (CHECK && mi * 16 >= mlim) break;
          if (KA) {  // (a0, a2) = rows g, (a1, a3) = rows g + 8: k pairs
            const double2 u = *reinterpret_cast<const double2*>(sA + mi * 16 * PA + ks);
            const double2 v = *reinterpret_cast<const double2*>(sA + (mi * 16 + 8) * PA + ks);
            a[mi][0] = u.x; a[mi][2] = u.y; a[mi][1] = v.x; a[mi][3] = v.y;
          } else {   // (a0, a1) = tile rows 2g, 2g + 1 at k = 2t; (a2, a3) at k = 2t + 1
            const double2 u = *reinterpret_cast<const double2*>(sA + ks * PA + mi * 16);
            const double2 v = *reinterpret_cast<const double2*>(sA + (ks + 1) * PA + mi * 16);
            a[mi][0] = u.x; a[mi][1] = u.y; a[mi][2] = v.x; a[mi][3] = v.y;
          }
        }
        if (KBT) {  // (b0, b1): column ni * 8 + g at k = 2t, 2t + 1
#pragma unroll
          for (int ni = 0; ni < NT8; ++ni) {
            if (CHECK && ni * 8 >= nlim) break;
            const double2 u = *reinterpret_cast<const double2*>(sB + ni * 8 * PB + ks);
            b[ni][0] = u.x; b[ni][1] = u.y;
          }
        } else {  // blocks 2p, 2p + 1 interleaved in columns 16p ... 16p + 15
#pragma unroll
          for (int p = 0; p < NT8 / 2; ++p) {
            if (CHECK && p * 16 >= nlim) break;
#pragma unroll
            for (int x = 0; x < 2; ++x) {
              const double2 u = *reinterpret_cast<const double2*>(sB + (ks + x) * PB + p * 16);
              b[2 * p][x] = u.x; b[2 * p + 1][x] = u.y;
            }
          }
        }
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          if (CHECK && mi * 16 >= mlim) break;
#pragma unroll
          for (int ni = 0; ni < NT8; ++ni) {
            if (CHECK && (KBT ? ni : ni & ~1) * 8 >= nlim) break;
            dmma_m16n8k8(acc[mi][ni], a[mi], b[ni]);
          }
        }
      }
    };
    k_pipeline_n<KB, S>(
        kk,
        [&](int buf, int l0) {
          stage_ab<KB>(sa, sb, sbuf + buf * STAGE, SA, l0, kk, ma, nb, fa, fb);
        },
        [&](int buf) {
          const double* sA = sbuf + buf * STAGE + aoff;
          const double* sB = sbuf + buf * STAGE + SA + boff;
          if (whole) chunk(sA, sB, Flag<false>());
          else if (active) chunk(sA, sB, Flag<true>());
        });
  }
  // The epilogue (store_tile) reads the accumulators from the pipeline's buffers, free after
  // its last barrier (blas_cuda.mma_smem sizes them to hold the block's tile too).
  constexpr int TP = decltype(g)::TP;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NT8; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        sbuf[(wm * WTM + mi * 16 + (KA ? gid + 8 * (e >> 1) : 2 * gid + (e >> 1))) * TP +
             wn * 32 +
             (KBT ? ni * 8 + 2 * tig + (e & 1)
                  : (ni >> 1) * 16 + 4 * tig + 2 * (e & 1) + (ni & 1))] = acc[mi][ni][e];
  __syncthreads();
  store_tile<double, BM, BN, NT>(g, sbuf, tid);
}

// The same task as blas_gemm in float32 on FMA, tiled for throughput: each of 256 threads
// computes TM x TM outputs of the block's BM x BM tile (BM = 16 TM) from 128-bit loads of 4
// consecutive rows of A and columns of B (k-major shared tiles, pipeline.cuh's smk, whatever the
// operands' orientation), so that a k-step is TM / 2 loads for TM^2 FMAs; K runs in chunks of
// 16 through S cp.async stages, and the epilogue is store_tile's. The thread's rows are
// ty 4 + {0..3} (+ BM / 2 when TM = 8), its columns alike, so a warp's loads of A broadcast
// and its loads of B cover 64 consecutive columns. blas_gemm, with one 4-byte load per FMA
// pair and no pipeline, ran float32 GEMMs at 0.37x bucketed cuBLAS (Nmax 512, H200,
// 2026-11-24).
template <int BM, int S, bool AROW, bool BROW>
__global__ void __launch_bounds__(256, BM >= 128 ? 2 : 3)
blas_gemm_simt(const unsigned long long* tbl, const long long* meta, const int* imeta,
               const int* tasks, int K, int lo, int hi, int extra) {
  constexpr int BN = BM, TM = BM / 16, NT = 256, KB = 16, H = TM / 4;
  constexpr bool KA = AROW, KBT = !BROW;
  constexpr int P = BM + 4, SA = KB * P, STAGE = 2 * SA;
  static_assert(TM == 4 || TM == 8, "tile shape");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sbuf = reinterpret_cast<float*>(smem_raw);
  GemmTile<float, BM, BN> g;
  if (!g.find(tbl, meta, tasks, K, lo, hi, extra)) return;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  if (g.read_c && g.kk > 2 * KB) prefetch_c<float, BM, BN, NT>(g, tid);
  float acc[TM][TM];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TM; ++j) acc[i][j] = 0.f;
  if (g.multiplies()) {
    const GemmOperands<float, BM, BN> op(tbl, meta, K, g, AROW, BROW);
    const Stager<float, KA, BM, KB, NT, kSmk> sa(op.A, op.lda, tid);
    const Stager<float, KBT, BN, KB, NT, kSmk> sb(op.B, op.ldb, tid);
    const int ma = g.mm - g.i0, nb = g.nn - g.c0, kk = g.kk;
    const bool fa = ma >= BM, fb = nb >= BN;
    k_pipeline_n<KB, S>(
        kk,
        [&](int buf, int l0) {
          stage_ab<KB>(sa, sb, sbuf + buf * STAGE, SA, l0, kk, ma, nb, fa, fb);
        },
        [&](int buf) {
          const float* sA = sbuf + buf * STAGE + ty * 4;
          const float* sB = sbuf + buf * STAGE + SA + tx * 4;
#pragma unroll
          for (int k = 0; k < KB; ++k) {
            float a[TM], b[TM];
#pragma unroll
            for (int h = 0; h < H; ++h) {
              const float4 u = *reinterpret_cast<const float4*>(sA + k * P + h * (BM / 2));
              const float4 v = *reinterpret_cast<const float4*>(sB + k * P + h * (BN / 2));
              a[4 * h] = u.x; a[4 * h + 1] = u.y; a[4 * h + 2] = u.z; a[4 * h + 3] = u.w;
              b[4 * h] = v.x; b[4 * h + 1] = v.y; b[4 * h + 2] = v.z; b[4 * h + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
              for (int j = 0; j < TM; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
          }
        });
  }
  // Park the accumulators for store_tile (blas_cuda.simt_smem sizes the buffers to hold them).
  constexpr int TP = decltype(g)::TP;
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TM; ++j)
      sbuf[((i / 4) * (BM / 2) + ty * 4 + i % 4) * TP + (j / 4) * (BN / 2) + tx * 4 + j % 4] =
          acc[i][j];
  __syncthreads();
  store_tile<float, BM, BN, NT>(g, sbuf, tid);
}

// One diagonal block X[o:o+w, c0:c0+32] := T[o:o+w, o:o+w]^{-1} X[...] (MUL false) or T X (MUL
// true), w <= NB, on views: operand 0 the triangle (its lower or upper part, per bit 16; bit 17:
// unit diagonal, not read), operand 1 the right-hand sides. A warp per task (WARPS tasks a
// block), a lane per column of X (blockIdx.y: which 32 columns), in code unrolled for NB rows:
// the narrowest of 8, 16, 24 or 32 that holds the launch's widest block. A narrower block runs
// the same code, skipping the steps of its absent columns: warps of one launch on different
// code (a branch per width) thrash the instruction cache, 12.2 us for a launch of 16 blocks of
// 17-32 rows against 7.3 (17-24) and 9.1 (25-32) apart (TRSM, 16 columns, H200). For the same
// reason the arithmetic is unrolled over NB and the loads and stores are loops (B loads in
// flight a lane), the lanes along X's contiguous dimension for X and its source, along the
// triangle's for the triangle. Unrolled, with a branch per layout,
// they made 149 KB of code (NB = 32), and each launch among a call's others paid for fetching
// it: POTRS of Nmax 512 with 16 right-hand sides 1.52 ms, 1.21-1.31 with the loops.
// An upper triangle is solved as the lower one of the reversed order (row i read as w - 1 - i),
// so the code exists once. Lane c keeps its column in registers and reads the triangle by
// broadcast from a per-warp shared tile, a column at a time (pairs of reads merge into 16-byte
// ones where aligned). The steps are column-oriented: after x_j is final, every later row
// subtracts T(i, j) x_j, so the dependent chain is one FMA and one multiply a row (a
// row-oriented loop is a chain of w^2 / 2 dependent FMAs). A solve multiplies by the diagonal's
// reciprocal (one more rounding than LAPACK's division; still backward stable). X comes and
// goes through the same tile. Four warps a task, a lane per row (the kernel this one replaced),
// issued ~4,800 instructions a task and took 21.7 us for 2,000 blocks of at most 8 rows with 16
// columns, 43.8 us at most 32 (ncu, TRSM, H200).
template <typename T, int NB, bool MUL>
__device__ __forceinline__ void diag_cols(const View<T>& Tv, const View<T>& X,
                                          const FirstValues<T>& F, int o, int w, int c0,
                                          int ncol, bool lower, bool unit, T* sw) {
  // Column strides of the triangle and of X in the tile, odd: a warp's stores along a row or a
  // column of either hit distinct banks (reads of the triangle are broadcasts, and still pair
  // into 16-byte loads where their offsets allow).
  constexpr int SP = NB + 1, XP = NB + 1, B = 16;
  const int lane = threadIdx.x & 31;
  auto rev = [&](int i) { return lower ? i : w - 1 - i; };
  // X[o + i, c0 + c] at sw[c * XP + rev(i)]. The lanes run along X's contiguous dimension and
  // a loop (u) along the other, so each view's element is p[u * du] from a lane's start p, and
  // its place in the tile s0 + u * su: one code for both layouts (a branch per layout inside
  // the loops compiled to a copy of them per case). A batch's loads are all issued before its
  // stores (a load and its store in one conditional block compile to a chain, one round trip
  // a load).
  const bool xr = X.row;
  const int xn = xr ? w : ncol, lanes = xr ? ncol : w;  // (the loop's extent, the lanes')
  const int s0 = xr ? lane * XP + (lower ? 0 : w - 1) : rev(lane);
  const int su = xr ? (lower ? 1 : -1) : XP;
  auto walk = [&](const View<T>& V, long long& du) {
    const int i = xr ? 0 : lane, c = xr ? lane : 0;  // (at u = 0)
    du = (V.row == xr) ? V.ld : 1;
    return &V(o + i, c0 + c);
  };
  long long sdu, xdu;
  const T* sp = walk(F.S, sdu);
  T* xp = walk(X, xdu);
  const bool mine = lane < lanes;
#pragma unroll 1
  for (int u0 = 0; u0 < xn; u0 += B) {
    T v[B];
#pragma unroll
    for (int k = 0; k < B; ++k) v[k] = (mine && u0 + k < xn) ? sp[(u0 + k) * sdu] : T(0);
#pragma unroll
    for (int k = 0; k < B; ++k)
      if (mine && u0 + k < xn) sw[s0 + (u0 + k) * su] = F.of(v[k]);
  }
  __syncwarp();
  T x[NB];
#pragma unroll
  for (int i = 0; i < NB; ++i) x[i] = sw[lane * XP + i];  // (rows past w: never stored)
  __syncwarp();
  // The triangle, reversed for an upper one: sT[j * SP + i] = L(i, j) for j < i < w, the lanes
  // along the view's contiguous dimension (element (a, b): a = u, b = lane row-major, the
  // other way column-major; at Tv(o, o + lane) + u * ld either way). Entries past w are not
  // written: they only reach rows past w, which are never stored.
  T* sT = sw;
  T* sD = sw + NB * SP;
  const T d = (unit || lane >= w) ? T(1) : Tv.get(o + rev(lane), o + rev(lane));
  const bool tr = Tv.row;
  const T* tp = tr ? &Tv(o, o + lane) : &Tv(o + lane, o);
  const int t0 = tr ? rev(lane) * SP + (lower ? 0 : w - 1)
                   : rev(lane) + (lower ? 0 : (w - 1) * SP);
  const int tu = tr ? (lower ? 1 : -1) : (lower ? SP : -SP);
#pragma unroll 1
  for (int u0 = 0; u0 < w; u0 += B) {
    T v[B];
#pragma unroll
    for (int k = 0; k < B; ++k) {
      const int u = u0 + k, a = tr ? u : lane, b = tr ? lane : u;
      v[k] = (u < w && lane < w && (lower ? b < a : b > a)) ? conj_if(tp[u * Tv.ld], Tv.cj)
                                                             : T(0);
    }
#pragma unroll
    for (int k = 0; k < B; ++k) {
      const int u = u0 + k, a = tr ? u : lane, b = tr ? lane : u;
      if (u < w && lane < w && (lower ? b < a : b > a)) sT[t0 + u * tu] = v[k];
    }
  }
  if (lane < NB) sD[lane] = MUL ? d : T(1) / d;
  __syncwarp();
  if (!MUL) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      if (j >= w) break;
      x[j] *= sD[j];
#pragma unroll
      for (int i = j + 1; i < NB; ++i) x[i] = fma(-sT[j * SP + i], x[j], x[i]);
    }
  } else {
    // In place, x := L x, columns from the last: x[j] is read (as yet unchanged) by the rows
    // below it, then scaled; the rows below have had their own scaling already. (Columns past
    // w: skipped.)
#pragma unroll
    for (int j = NB - 1; j >= 0; --j) {
      if (j < w) {
#pragma unroll
        for (int i = j + 1; i < NB; ++i) x[i] = fma(sT[j * SP + i], x[j], x[i]);
        x[j] *= sD[j];
      }
    }
  }
  __syncwarp();  // (every lane's reads of the triangle are done)
#pragma unroll
  for (int i = 0; i < NB; ++i) sw[lane * XP + i] = x[i];
  __syncwarp();
#pragma unroll 1
  for (int u0 = 0; u0 < xn; u0 += B) {
#pragma unroll
    for (int k = 0; k < B; ++k)
      if (mine && u0 + k < xn) xp[(u0 + k) * xdu] = sw[s0 + (u0 + k) * su];
  }
}

// (complex128: half the blocks a multiprocessor, for registers: at six, the NB = 32 build spilled
// 1 KB a thread)
template <typename T, int WARPS, int NB, bool MUL>
__global__ void __launch_bounds__(WARPS * 32,
                                  (NB > 16 ? 12 : 16) / WARPS / (sizeof(T) > 8 ? 2 : 1))
blas_diag_cols(const unsigned long long* tbl, const long long* meta, const int* imeta,
               const int* tasks, int K, int lo, int hi, int extra) {
  static_assert(NB % 8 == 0 && NB <= 32, "a lane a row of the block (column-major X, sD)");
  // (the triangle and its diagonal; or X's 32 columns)
  constexpr int BUF = NB * (NB + 1) + NB > 32 * (NB + 1) ? NB * (NB + 1) + NB : 32 * (NB + 1);
  __shared__ __align__(16) T buf[WARPS][BUF];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int t[8];
  if (!blas_task(tasks, lo, hi, t, WARPS, warp)) return;
  const int q = t[0], o = t[1], w = t[2], nn = t[5];
  const int c0 = blockIdx.y * 32;
  if (c0 >= nn) return;
  const BlasLaunch L = blas_launch(tbl, extra);
  const int ncol = min(32, nn - c0);
  const bool lower = (extra >> 16) & 1, unit = (extra >> 17) & 1;
  const View<T> Tv = view_of<T>(tbl, meta, K, q, L.slot[0], L.row[0], L.conj[0]);
  const View<T> X = view_of<T>(tbl, meta, K, q, L.slot[1], L.row[1]);
  const FirstValues<T> F(tbl, meta, K, q, L, t[7], X);
  if (L.skip && failed(tbl, q)) {
    if (F.fresh) bring_in(X, F, o, w, c0, ncol, lane, 32);
    return;
  }
  diag_cols<T, NB, MUL>(Tv, X, F, o, w, c0, ncol, lower, unit, buf[warp]);
}

// A whole triangular solve X[o:o+w, c0:c0+NCOL] := T[o:o+w, o:o+w]^{-1} X[...] in one block, for
// few right-hand sides (views, triangle bits and skip as blas_diag_cols; blockIdx.y: which NCOL
// columns). With few columns a solve is memory-bound: it should read the triangle once, which
// the recursion into GEMM joins does too, but in a chain of ~2 w / 32 launches per solve (418
// launches for a POTRS of Nmax 512 with one right-hand side, 2.6 ms against a 0.17 ms floor,
// H200, 2026-11-23). Here the chain is a loop inside one block: 32-row blocks of X in the
// order of the solve, each brought up to date from the rows already solved, then solved
// against its diagonal block in shared memory. The update reads the triangle along its
// contiguous dimension: a triangle with contiguous rows is read row by row (left-looking: the
// block's rows dotted with the solved part of X, a warp per row), one with contiguous columns
// column by column (right-looking: after solving a block, every row not yet solved subtracts
// the block's columns times it, a thread per row). Each element of the triangle is read once.
// XS: X's NCOL columns live in shared memory for the whole solve (dynamic, rows rounded up to
// BS, blas_cuda.trsv_smem); else in global memory, a block of rows staged at a time. Every
// update reads X again (left-looking: each row of the block reads the solved rows), so from
// global memory the reads grew with NCOL: with 16 right-hand sides the solve took 4.0 ms at
// Nmax 512 against 3.0 for the recursion (POTRS, H200, 2026-11-23).
template <typename T, int NCOL, bool XS>
__global__ void __launch_bounds__(256)
blas_trsv(const unsigned long long* tbl, const long long* meta, const int* imeta,
          const int* tasks, int K, int lo, int hi, int extra) {
  constexpr int BS = 32, NT = 256, NW = NT / 32;
  // Row stride of X in shared memory: padded so that lanes reading one column of consecutive
  // rows (left-looking) fall in different banks.
  constexpr int XP = NCOL == 1 ? 1 : NCOL + 1;
  __shared__ T sT[BS][BS + 1];
  __shared__ T sXb[XS ? 1 : BS * XP];
  extern __shared__ __align__(16) unsigned char trsv_dyn[];
  int t[8];
  if (!blas_task(tasks, lo, hi, t)) return;
  const int q = t[0], o = t[1], w = t[2], nn = t[5];
  const BlasLaunch L = blas_launch(tbl, extra);
  const int c0 = blockIdx.y * NCOL;
  if (c0 >= nn) return;
  const int ncol = min(NCOL, nn - c0);
  const bool lower = (extra >> 16) & 1, unit = (extra >> 17) & 1;
  const View<T> Tv = view_of<T>(tbl, meta, K, q, L.slot[0], L.row[0], L.conj[0]);
  const View<T> X = view_of<T>(tbl, meta, K, q, L.slot[1], L.row[1]);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (t[7] && L.src != 7) {
    // The solve reads and updates X in place: its first values go there first (the barrier
    // makes the block's global writes visible to all of its threads). With the source read
    // straight into shared memory, or live across the solve, the kernel's code took 48
    // registers where it took 64 and its launches 14% longer (POTRS of Nmax 512, one
    // right-hand side, H200, 2026-11-27).
    bring_in(X, FirstValues<T>(tbl, meta, K, q, L, 1, X), o, w, c0, ncol, tid, NT);
    if (L.skip && failed(tbl, q)) return;
    __syncthreads();
  } else if (L.skip && failed(tbl, q)) {
    return;
  }
  const int nblk = (w + BS - 1) / BS, wr = nblk * BS;
  T* const sXa = reinterpret_cast<T*>(trsv_dyn);
  if (XS) {
    // (zeros past the problem's rows and columns: the updates read every column)
    for (int e = tid; e < wr * NCOL; e += NT) {
      int i, c;
      if (X.row) { c = e % NCOL; i = e / NCOL; } else { i = e % wr; c = e / wr; }
      sXa[i * XP + c] = (i < w && c < ncol) ? X(o + i, c0 + c) : T(0);
    }
  }
  // Row r, column c of the solve's right-hand sides, wherever they live.
  auto xs = [&](int r, int c) -> T& { return XS ? sXa[r * XP + c] : X(o + r, c0 + c); };
  for (int s = 0; s < nblk; ++s) {
    const int b0 = (lower ? s : nblk - 1 - s) * BS, bw = min(BS, w - b0);
    for (int e = tid; e < BS * BS; e += NT) {
      int i, j;
      if (Tv.row) { j = e % BS; i = e / BS; } else { i = e % BS; j = e / BS; }
      const bool in = i < bw && j < bw && (lower ? j <= i : j >= i) && !(unit && i == j);
      sT[i][j] = in ? Tv.get(o + b0 + i, o + b0 + j) : T(0);
    }
    // The block's rows: in place (XS), else staged (zeros past its rows and columns).
    T* const xb = XS ? sXa + b0 * XP : sXb;
    if (!XS) {
      for (int e = tid; e < BS * NCOL; e += NT) {
        int i, c;
        if (X.row) { c = e % NCOL; i = e / NCOL; } else { i = e % BS; c = e / BS; }
        xb[i * XP + c] = (i < bw && c < ncol) ? X(o + b0 + i, c0 + c) : T(0);
      }
    }
    __syncthreads();
    if (Tv.row) {
      // Left-looking: the solved rows are those before the block (lower) or after it.
      const int s0 = lower ? 0 : b0 + bw, s1 = lower ? b0 : w;
      for (int i = warp; i < bw; i += NW) {
        T acc[NCOL];
#pragma unroll
        for (int c = 0; c < NCOL; ++c) acc[c] = T(0);
        // (unrolled so that several loads of the triangle are in flight at once: the loop is
        // latency-bound otherwise, a few warps a multiprocessor)
#pragma unroll 4
        for (int j = s0 + lane; j < s1; j += 32) {
          const T tij = Tv.get(o + b0 + i, o + j);
#pragma unroll
          for (int c = 0; c < NCOL; ++c)
            if (XS || c < ncol) acc[c] += tij * xs(j, c);
        }
#pragma unroll
        for (int c = 0; c < NCOL; ++c) {
          T v = acc[c];
#pragma unroll
          for (int d = 16; d > 0; d >>= 1) v += shfl_xor(v, d);
          if (lane == 0 && c < ncol) xb[i * XP + c] -= v;
        }
      }
      __syncthreads();
    }
    // The diagonal block, a warp per column, a lane per row (column sweep): step j finishes
    // x_j (times the diagonal's reciprocal) and every row after it (lower) or before it
    // subtracts T(i, j) x_j. A thread per column (the first diagonal kernel) is a chain of w^2 / 2
    // dependent shared-memory reads: with one right-hand side it made this kernel 8x its
    // floor (potrs512-nrhs1, H200, 2026-11-23). Lanes past bw keep their (padding) rows.
    for (int c = warp; c < ncol; c += NW) {
      T x = xb[lane * XP + c];
      const T dinv = (unit || lane >= bw) ? T(1) : T(1) / sT[lane][lane];
      for (int jj = 0; jj < bw; ++jj) {
        const int j = lower ? jj : bw - 1 - jj;
        if (lane == j) x *= dinv;
        const T xj = shfl(x, j);
        if (lower ? lane > j : lane < j) x -= sT[lane][j] * xj;
      }
      xb[lane * XP + c] = x;
    }
    __syncthreads();
    if (!XS) {
      for (int e = tid; e < BS * NCOL; e += NT) {
        int i, c;
        if (X.row) { c = e % NCOL; i = e / NCOL; } else { i = e % BS; c = e / BS; }
        if (i < bw && c < ncol) X(o + b0 + i, c0 + c) = xb[i * XP + c];
      }
    }
    if (!Tv.row) {
      // Right-looking: the rows not solved yet are those after the block (lower) or before.
      const int r0 = lower ? b0 + bw : 0, r1 = lower ? w : b0;
      for (int r = r0 + tid; r < r1; r += NT) {
        T acc[NCOL];
#pragma unroll
        for (int c = 0; c < NCOL; ++c) acc[c] = T(0);
#pragma unroll 8
        for (int jj = 0; jj < bw; ++jj) {
          const T trj = Tv.get(o + r, o + b0 + jj);
#pragma unroll
          for (int c = 0; c < NCOL; ++c) acc[c] += trj * xb[jj * XP + c];
        }
#pragma unroll
        for (int c = 0; c < NCOL; ++c)
          if (XS || c < ncol) xs(r, c) -= acc[c];
      }
    }
    __syncthreads();
  }
  if (XS) {
    for (int e = tid; e < wr * NCOL; e += NT) {
      int i, c;
      if (X.row) { c = e % NCOL; i = e / NCOL; } else { i = e % wr; c = e / wr; }
      if (i < w && c < ncol) X(o + i, c0 + c) = sXa[i * XP + c];
    }
  }
}

// X[:mm, :nn] := alpha S[:mm, :nn] on views (operand 0 S, operand 1 X); alpha = 0 writes zeros
// without reading S (BLAS), and a copy onto itself with alpha = 1 does nothing. A symmetric
// source (L.tri) is read in its one triangle: S(c, i) stands for S(i, c) outside it (for a
// Hermitian one, conj(S(c, i)), and the diagonal's real part). Tiles of CT x CT (a multiple of
// 32; blas_cuda.COPY_TILE) (blockIdx.y), threads along the destination's contiguous dimension,
// every load of a thread in flight before its stores. Tiles of 32 x 32 (4 elements a thread) spent most of a block in
// its start (the task's row, its views): 2.8x the copy's floor in trsm512 (H200, 2026-11-24).
template <typename T, int CT>
__global__ void __launch_bounds__(256)
blas_copy(const unsigned long long* tbl, const long long* meta, const int* imeta,
          const int* tasks, int K, int lo, int hi, int extra) {
  constexpr int E = CT / 8, F = CT / 32;
  int t[8];
  if (!blas_task(tasks, lo, hi, t)) return;
  const int q = t[0], mm = t[2], nn = t[5];
  const BlasLaunch L = blas_launch(tbl, extra);
  const View<T> S = view_of<T>(tbl, meta, K, q, L.slot[0], L.row[0], L.conj[0]);
  const View<T> X = view_of<T>(tbl, meta, K, q, L.slot[1], L.row[1]);
  if (L.alpha == 1.0 && S.p == X.p && S.row == X.row && L.tri == 0 && !S.cj) return;
  const int tiles_n = (nn + CT - 1) / CT;
  const int tm = blockIdx.y / tiles_n, tn = blockIdx.y % tiles_n;
  if (tm * CT >= mm) return;
  const T alpha = scalar<T>(L.alpha);
  const bool herm = is_cx<T>::value && L.tri != 0 && S.cj;  // (HEMM's source)
  const int fast = threadIdx.x % 32, slow = threadIdx.x / 32;
  T v[E][F];
#pragma unroll
  for (int e = 0; e < E; ++e)
#pragma unroll
    for (int f = 0; f < F; ++f) {
      const int i = tm * CT + (X.row ? slow + 8 * e : fast + 32 * f);
      const int c = tn * CT + (X.row ? fast + 32 * f : slow + 8 * e);
      const bool mirror = L.tri != 0 && (L.tri == 1 ? i < c : i > c);
      v[e][f] = (i < mm && c < nn && L.alpha != 0.0)
                    ? (!herm ? (mirror ? S(c, i) : S.get(i, c))
                             : mirror ? S.get(c, i) : i == c ? real_part(S(i, c)) : S(i, c))
                    : T(0);
    }
#pragma unroll
  for (int e = 0; e < E; ++e)
#pragma unroll
    for (int f = 0; f < F; ++f) {
      const int i = tm * CT + (X.row ? slow + 8 * e : fast + 32 * f);
      const int c = tn * CT + (X.row ? fast + 32 * f : slow + 8 * e);
      if (i < mm && c < nn) X(i, c) = alpha * v[e][f];
    }
}

}  // namespace vb

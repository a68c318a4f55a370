// vbatch: variable-size batched LU with partial pivoting (GETRF) kernels, real and complex.
//
// Compiled behind the generated preamble and vbatched.cuh (kernels/cuda_build.py). A task row is
// (q, j, w, m, n): problem q, its panel's first column j and width w, and the problem's sizes
// (the tables carry one n per problem; a rectangular problem's m travels with its tasks).
//
// The per-call pointers come from the family's table, `tbl`: A (the input), LU (the output; A
// itself in place), ipiv (int32, an r x 1 matrix per problem, r = min(m, n): the buffer's
// offsets are in ints) and info (pinned host memory, zeroed by the host; a kernel writes a
// problem's entry at its first exactly-zero pivot, and only then). meta holds, per buffer s,
// offset[K] then ld[K] at meta[2 K s]: A's is s = 0, LU's s = 1, ipiv's s = 2.
//
// One step of a right-looking LU is two launches (the trailing GEMM is the blas family's):
// getrf_factor (a block a panel), getrf_warp (a warp a panel of at most 32 rows) or getrf_regs
// (a block a real panel of at most 32 W rows, a row a thread) factors the panel's
// columns [j, j + w), rows [j, m); getrf_rows_cm (column-major) or getrf_rows (row-major)
// applies the step's row swaps to every other column and solves U12 = L11^-1 A12 right of the
// panel. Out of place, the first step
// (j = 0) reads A: the factor kernel its panel's columns, the rows kernel the others, so every
// later step reads LU alone.
//
// Pivots as LAPACK's: the first entry of largest magnitude at or below the diagonal (idamax;
// a complex entry's magnitude |re| + |im|, izamax's);
// a zero pivot's column is left unscaled and the factorization goes on (info = its column + 1,
// the first). PIVOT=false takes the diagonal as pivot (ipiv = the identity), with the same rule
// at a zero pivot.
//
// Layout is a template flag: ROW=false is column-major, ROW=true row-major (A and LU share it).

namespace vb {

// The step's swaps replayed on row numbers by one warp (ipiv: the step's, 0-based, absolute):
// lane l < w ends up with what row j + l holds (`content`); lane k < the count returned with
// the k-th row below the w that a swap touched (`op`) and what it holds (`oc`).
template <bool PIVOT>
__device__ __forceinline__ int replay_swaps(const int* ipiv, int j, int w, int lane,
                                            int& content, int& op, int& oc) {
  content = j + lane;
  op = oc = -1;
  int out = 0;
  if (PIVOT) {
    const int pv = lane < w ? ipiv[j + lane] : 0;
    for (int i = 0; i < w; ++i) {
      const int p = __shfl_sync(0xffffffffu, pv, i);
      if (p == j + i) continue;
      const int a = __shfl_sync(0xffffffffu, content, i);
      if (p < j + w) {
        const int b = __shfl_sync(0xffffffffu, content, p - j);
        if (lane == i) content = b;
        if (lane == p - j) content = a;
      } else {
        const unsigned hit = __ballot_sync(0xffffffffu, op == p);
        const int k = hit ? __ffs(hit) - 1 : out;
        const int b = __shfl_sync(0xffffffffu, oc, k);
        if (lane == i) content = hit ? b : p;
        if (lane == k) {
          op = p;
          oc = a;
        }
        out += hit ? 0 : 1;
      }
    }
  }
  return out;
}

// A row's claim to be a column's pivot as an unsigned integer that orders as LAPACK's i?amax
// compares |v| (cabs1): the bits of |v| plus one, since a nonnegative float's bits order as its
// value; 0 for a row that may not be the pivot (outside the column's rows, or NaN: a NaN never
// wins, and a column of NaN keeps its diagonal, where the reference i?amax keeps a NaN first
// entry). A real entry's key is its bits without the sign, no arithmetic: a build that flushes
// subnormals to zero (NVRTC under CuPy compiles with -ftz=true) would make fabs of one 0. A
// complex entry's |re| + |im| is arithmetic, flushed in such a build.
__device__ __forceinline__ unsigned pivot_key(float v, bool in) {
  const unsigned u = __float_as_uint(v) & 0x7fffffffu;
  return in && u <= 0x7f800000u ? u + 1u : 0u;
}
__device__ __forceinline__ unsigned long long pivot_key(double v, bool in) {
  const unsigned long long u = (unsigned long long)__double_as_longlong(v) & 0x7fffffffffffffffull;
  return in && u <= 0x7ff0000000000000ull ? u + 1ull : 0ull;
}
template <typename R>
__device__ __forceinline__ auto pivot_key(cx<R> v, bool in) {
  return pivot_key(cabs1(v), in);
}
template <typename T>
using pivot_key_t = decltype(pivot_key(real_t<T>(0), true));

// The warp's largest key, by the 32-bit warp reductions (sm_80's redux.sync): one for float's
// keys, the high halves then the low halves of those that tie for double's (fewer
// instructions than rounds of shuffles: decisions.md#getrf-pivot-search).
__device__ __forceinline__ unsigned warp_max_key(unsigned k) {
  return __reduce_max_sync(0xffffffffu, k);
}
__device__ __forceinline__ unsigned long long warp_max_key(unsigned long long k) {
  const unsigned hi = __reduce_max_sync(0xffffffffu, (unsigned)(k >> 32));
  const unsigned lo = __reduce_max_sync(0xffffffffu, (unsigned)(k >> 32) == hi ? (unsigned)k : 0u);
  return ((unsigned long long)hi << 32) | lo;
}

// The warp's pivot: the lowest `row` among the lanes that hold the largest key (LAPACK's first
// of largest magnitude; 0x7fffffff where no lane's key is set), and that key in `best`.
template <typename K>
__device__ __forceinline__ int warp_argmax(K key, int row, K& best) {
  best = warp_max_key(key);
  return (int)__reduce_min_sync(0xffffffffu,
                                best != K(0) && key == best ? (unsigned)row : 0x7fffffffu);
}

// The same over a block of W warps: each warp's winner in shared memory (sk, si: W entries,
// written again only after another block barrier), one barrier, and every thread combines them.
template <typename K, int W>
__device__ __forceinline__ int block_argmax(K key, int row, K* sk, int* si) {
  K best;
  int p = warp_argmax(key, row, best);
  if ((threadIdx.x & 31) == 0) {
    sk[threadIdx.x >> 5] = best;
    si[threadIdx.x >> 5] = p;
  }
  __syncthreads();
  best = sk[0];
  p = si[0];
#pragma unroll
  for (int v = 1; v < W; ++v) {
    if (sk[v] > best || (sk[v] == best && si[v] < p)) {
      best = sk[v];
      p = si[v];
    }
  }
  return p;
}

// A panel's rows in the registers of the G threads of a group (a warp, or a block of G / 32
// warps): panel_in gives thread t row t of the panel at P (rows from nr and columns from nc
// read as 0); panel_out writes a thread's row back as row `to` (rows and columns past nr and
// nc are not written). Column-major, a thread a row reads along the columns; row-major, that
// would be a sector a thread an element, so the rows go through a shared tile of PANEL_CH
// columns (G rows, one padding column), read and written along the rows.
constexpr int PANEL_CH = 8;

template <int G>
__device__ __forceinline__ void group_sync() {
  if constexpr (G == 32) {
    __syncwarp();
  } else {
    __syncthreads();
  }
}

template <typename T, int NB, int G, bool ROW>
__device__ __forceinline__ void panel_in(const T* P, long long ld, int nr, int nc, int t,
                                         T (&a)[NB], T* tile) {
  static_assert(NB % PANEL_CH == 0, "a panel's registers are read a tile at a time");
  if constexpr (!ROW) {
#pragma unroll
    for (int c = 0; c < NB; ++c) a[c] = t < nr && c < nc ? P[at<false>(t, c, ld)] : T(0);
  } else {
    constexpr int CH = PANEL_CH;
#pragma unroll
    for (int cb = 0; cb < NB; cb += CH) {
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const int e = i * G + t, r = e / CH, c = e % CH;
        tile[r * (CH + 1) + c] = r < nr && cb + c < nc ? P[at<true>(r, cb + c, ld)] : T(0);
      }
      group_sync<G>();
#pragma unroll
      for (int c = 0; c < CH; ++c) a[cb + c] = tile[t * (CH + 1) + c];
      group_sync<G>();
    }
  }
}

template <typename T, int NB, int G, bool ROW>
__device__ __forceinline__ void panel_out(T* P, long long ld, int nr, int nc, int t, int to,
                                          const T (&a)[NB], T* tile) {
  static_assert(NB % PANEL_CH == 0, "a panel's registers are written a tile at a time");
  if constexpr (!ROW) {
    if (to < nr) {
#pragma unroll
      for (int c = 0; c < NB; ++c) {
        if (c < nc) P[at<false>(to, c, ld)] = a[c];
      }
    }
  } else {
    constexpr int CH = PANEL_CH;
#pragma unroll
    for (int cb = 0; cb < NB; cb += CH) {
#pragma unroll
      for (int c = 0; c < CH; ++c) tile[to * (CH + 1) + c] = a[cb + c];
      group_sync<G>();
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const int e = i * G + t, r = e / CH, c = e % CH;
        if (r < nr && cb + c < nc) P[at<true>(r, cb + c, ld)] = tile[r * (CH + 1) + c];
      }
      group_sync<G>();
    }
  }
}

// Column c of a panel held a row a thread by a group of G threads (getrf_warp: a warp;
// getrf_regs: a block): the pivot search (sk, si: block_argmax's, unused by a warp), the pivot
// row through shared memory (`rows`: two buffers of NB, by column parity, so a buffer is
// written again only after the sync that every reader of its last use passed), the pivot's
// row number swapped, the column scaled and the rows below updated. Inlined into a loop
// unrolled over c, so `a` stays in registers.
template <typename T, int NB, int G, bool PIVOT>
__device__ __forceinline__ void lu_column(int c, int t, int j, int w, int pm, T (&a)[NB],
                                          int& rid, T* rows, pivot_key_t<T>* sk, int* si,
                                          int* ipiv, int& first_zero) {
  T* const u = rows + (c & 1) * NB;
  int p = c;
  if (PIVOT) {
    const pivot_key_t<T> key = pivot_key(a[c], rid >= c && rid < pm);
    int bi;
    if constexpr (G == 32) {
      pivot_key_t<T> best;
      bi = warp_argmax(key, rid, best);
    } else {
      bi = block_argmax<pivot_key_t<T>, G / 32>(key, rid, sk, si);
    }
    if (bi != 0x7fffffff) p = bi;
  }
  if (rid == p) {
#pragma unroll
    for (int k = c; k < NB; ++k) u[k] = a[k];
  }
  group_sync<G>();
  const T d = u[c];
  if (d == T(0) && first_zero == 0) first_zero = j + c + 1;
  if (t == 0) ipiv[j + c] = j + p;
  if (rid == p) {
    rid = c;
  } else if (rid == c) {
    rid = p;
  }
  const bool below = rid > c;
  T l = a[c];
  if (below && d != T(0)) {
    l = l / d;
    a[c] = l;
  }
  T uk[NB];  // (read in one run, unconditionally: neighbours' reads merge into wide ones)
#pragma unroll
  for (int k = c + 1; k < NB; ++k) uk[k] = u[k];
#pragma unroll
  for (int k = c + 1; k < NB; ++k) {
    if (k < w && below) a[k] = fma(-l, uk[k], a[k]);
  }
}

// SH: the panel's rows [j, m) x columns [j, j + w) are staged in dynamic shared memory
// (column-major, leading dimension m - j; kernels/getrf_cuda.py gives the bytes), factored
// there and written back once; else every step reads and writes the panel where it lies.
template <typename T, int NT, bool ROW, bool PIVOT, bool SH>
__global__ void __launch_bounds__(NT)
getrf_factor(const unsigned long long* tbl, const long long* meta, const int* imeta,
             const int* tasks, int K, int lo, int hi, int unused) {
  const int row = lo + (int)blockIdx.x;
  if (row >= hi) return;
  const int* tk = tasks + (long long)row * VB_TASK_COLS;
  const int q = tk[0], j = tk[1], w = tk[2], m = tk[3];
  const T* A = reinterpret_cast<const T*>(tbl[0]) + meta[q];
  const long long lda = meta[K + q];
  T* L = reinterpret_cast<T*>(tbl[1]) + meta[2LL * K + q];
  const long long ld = meta[3LL * K + q];
  int* ipiv = reinterpret_cast<int*>(tbl[2]) + meta[4LL * K + q];
  int* info = reinterpret_cast<int*>(tbl[3]);
  using Key = pivot_key_t<T>;
  __shared__ Key sk[NT / 32];
  __shared__ int si[NT / 32];
  __shared__ T s_piv;
  extern __shared__ __align__(16) unsigned char vb_dyn[];
  T* S = reinterpret_cast<T*>(vb_dyn);
  const int tid = threadIdx.x;
  const int pm = m - j;  // (the panel's rows)
  const bool copy = j == 0 && static_cast<const void*>(A) != static_cast<const void*>(L);
  // Entry (i, c) of the panel, i and c counted from (j, j).
  auto el = [&](int i, int c) -> T& {
    return SH ? S[(long long)c * pm + i] : L[at<ROW>(j + i, j + c, ld)];
  };
  if (SH || copy) {
    // (in memory order: consecutive threads read consecutive elements)
    for (long long e = tid; e < (long long)pm * w; e += NT) {
      const int r = ROW ? (int)(e / w) : (int)(e % pm), c = ROW ? (int)(e % w) : (int)(e / pm);
      el(r, c) = copy ? A[at<ROW>(j + r, j + c, lda)] : L[at<ROW>(j + r, j + c, ld)];
    }
    __syncthreads();
  }
  for (int c = 0; c < w; ++c) {
    int p = c;
    if (PIVOT) {
      Key best = 0;
      int bi = 0x7fffffff;
      for (int i = c + tid; i < pm; i += NT) {  // (rows ascending: the first of equals kept)
        const Key v = pivot_key(el(i, c), true);
        if (v > best) {
          best = v;
          bi = i;
        }
      }
      p = block_argmax<Key, NT / 32>(best, bi, sk, si);
      if (p == 0x7fffffff) p = c;
    }
    if (tid == 0) {
      ipiv[j + c] = j + p;
      const T d = el(p, c);
      s_piv = d;
      if (d == T(0) && info[q] == 0) info[q] = j + c + 1;
    }
    __syncthreads();  // (the pivot read before its row moves)
    if (p != c) {
      for (int cc = tid; cc < w; cc += NT) {
        const T t = el(c, cc);
        el(c, cc) = el(p, cc);
        el(p, cc) = t;
      }
    }
    __syncthreads();
    const T d = s_piv;
    // Each thread its rows: the multiplier, then the rest of the row in the panel.
    for (int i = c + 1 + tid; i < pm; i += NT) {
      T l = el(i, c);
      if (d != T(0)) {
        l = l / d;
        el(i, c) = l;
      }
      for (int cc = c + 1; cc < w; ++cc) el(i, cc) = fma(-l, el(c, cc), el(i, cc));
    }
    __syncthreads();
  }
  if (SH) {
    for (long long e = tid; e < (long long)pm * w; e += NT) {
      const int r = ROW ? (int)(e / w) : (int)(e % pm), c = ROW ? (int)(e % w) : (int)(e / pm);
      L[at<ROW>(j + r, j + c, ld)] = el(r, c);
    }
  }
}

// A panel of at most 32 rows factored by one warp with no block barrier: lane l holds row l of
// the panel's w <= NB columns in registers. A row's place in the panel is its `rid`; a pivot
// swap exchanges two rows' rids instead of their data (each row is written to its final place
// at the end; panel_in and panel_out move the rows). The pivot search is warp reductions
// (warp_argmax); the pivot row's lane writes the row to shared memory and, after a
// __syncwarp, every lane reads it there, two doubles a load, where shuffles move 32 bits
// (decisions.md#getrf-pivot-search).
// NB is the launch's widest panel rounded up to 8 (no dead columns unrolled); WARPS panels a
// block (kernels/getrf_cuda.py PANEL_WARPS). At 32 columns the bound asks for four blocks a
// multiprocessor (128 registers: 112 used, no spill; unbounded it took 140, three blocks);
// complex128, whose row alone is 128 registers at 32 columns, two (at four it spilled 248-272
// bytes: ptxas, sm_90).
template <typename T, int NB, bool ROW, bool PIVOT>
__global__ void __launch_bounds__(128, NB >= 32 ? (sizeof(T) > 8 ? 2 : 4) : 1)
getrf_warp(const unsigned long long* tbl, const long long* meta, const int* imeta,
           const int* tasks, int K, int lo, int hi, int unused) {
  constexpr int WARPS = 4;
  const int lane = threadIdx.x & 31;
  const int row = lo + (int)blockIdx.x * WARPS + (int)(threadIdx.x >> 5);
  if (row >= hi) return;  // (no block barrier below)
  const int* tk = tasks + (long long)row * VB_TASK_COLS;
  const int q = tk[0], j = tk[1], w = tk[2], m = tk[3];
  const T* A = reinterpret_cast<const T*>(tbl[0]) + meta[q];
  const long long lda = meta[K + q];
  T* L = reinterpret_cast<T*>(tbl[1]) + meta[2LL * K + q];
  const long long ld = meta[3LL * K + q];
  int* ipiv = reinterpret_cast<int*>(tbl[2]) + meta[4LL * K + q];
  int* info = reinterpret_cast<int*>(tbl[3]);
  const int pm = m - j;  // (the panel's rows)
  const bool copy = j == 0 && static_cast<const void*>(A) != static_cast<const void*>(L);
  const T* src = copy ? A : L;
  const long long lds = copy ? lda : ld;
  // (the pivot row's broadcast, a buffer per column parity: a lane writes one again only after
  // the __syncwarp that every reader of its last use passed)
  __shared__ __align__(16) T s_row[WARPS][2][NB];
  __shared__ T s_tile[WARPS][ROW ? 32 * (PANEL_CH + 1) : 1];
  T* const rows = s_row[threadIdx.x >> 5][0];
  T a[NB];
  int rid = lane;
  panel_in<T, NB, 32, ROW>(src + at<ROW>(j, j, lds), lds, pm, w, lane, a,
                           s_tile[threadIdx.x >> 5]);
  int first_zero = 0;
#pragma unroll
  for (int c = 0; c < NB; ++c) {
    if (c < w) lu_column<T, NB, 32, PIVOT>(c, lane, j, w, pm, a, rid, rows, nullptr, nullptr,
                                           ipiv, first_zero);
  }
  if (lane == 0 && first_zero != 0 && info[q] == 0) info[q] = first_zero;
  panel_out<T, NB, 32, ROW>(L + at<ROW>(j, j, ld), ld, pm, w, lane, rid, a,
                            s_tile[threadIdx.x >> 5]);
}

// A panel of at most 32 W rows factored by a block of W warps, a row a thread in registers
// (getrf_warp's scheme past one warp): the pivot search is block_argmax (one barrier); the
// pivot row's owner puts it in shared memory, one more barrier, and every row below updates
// itself from there. The row's buffer alternates by column parity: without pivoting that
// barrier is a column's only one, and a buffer is written again only after a barrier that
// every reader of its last use has passed. Past 64 rows it takes only launches of few panels
// (kernels/getrf_cuda.py REGS_FEW): with many, the shared-memory getrf_factor was faster
// (column-major).
template <typename T, int NB, int W, bool ROW, bool PIVOT>
__global__ void __launch_bounds__(32 * W)
getrf_regs(const unsigned long long* tbl, const long long* meta, const int* imeta,
           const int* tasks, int K, int lo, int hi, int unused) {
  const int row = lo + (int)blockIdx.x;
  if (row >= hi) return;
  const int* tk = tasks + (long long)row * VB_TASK_COLS;
  const int q = tk[0], j = tk[1], w = tk[2], m = tk[3];
  const T* A = reinterpret_cast<const T*>(tbl[0]) + meta[q];
  const long long lda = meta[K + q];
  T* L = reinterpret_cast<T*>(tbl[1]) + meta[2LL * K + q];
  const long long ld = meta[3LL * K + q];
  int* ipiv = reinterpret_cast<int*>(tbl[2]) + meta[4LL * K + q];
  int* info = reinterpret_cast<int*>(tbl[3]);
  using Key = pivot_key_t<T>;
  __shared__ __align__(16) T s_row[2][NB];
  __shared__ Key sk[W];
  __shared__ int si[W];
  __shared__ T s_tile[ROW ? 32 * W * (PANEL_CH + 1) : 1];
  const int tid = threadIdx.x;
  const int pm = m - j;  // (the panel's rows)
  const bool copy = j == 0 && static_cast<const void*>(A) != static_cast<const void*>(L);
  const T* src = copy ? A : L;
  const long long lds = copy ? lda : ld;
  T a[NB];
  int rid = tid;
  panel_in<T, NB, 32 * W, ROW>(src + at<ROW>(j, j, lds), lds, pm, w, tid, a, s_tile);
  int first_zero = 0;
#pragma unroll
  for (int c = 0; c < NB; ++c) {
    if (c < w) lu_column<T, NB, 32 * W, PIVOT>(c, tid, j, w, pm, a, rid, &s_row[0][0], sk, si,
                                               ipiv, first_zero);
  }
  if (tid == 0 && first_zero != 0 && info[q] == 0) info[q] = first_zero;
  panel_out<T, NB, 32 * W, ROW>(L + at<ROW>(j, j, ld), ld, pm, w, tid, rid, a, s_tile);
}

// The rows kernel for row-major factors (getrf_rows_cm below takes column-major ones): a
// thread a column outside the panel, NT columns a block, so each column is one thread's and a
// warp's accesses run along a row. After one barrier (warp 0 replays the step's swaps into
// shared memory: the w rows [j, j + w) end up holding rows `from`, and each row below them that
// a swap touched ends up holding one of the w rows, `out_to` <- `out_from`; every thread reads
// L11 there), a thread reads its column's w source rows into registers with its loads in
// flight, moves the touched rows below (each holds a panel row, not yet written), solves
// U12 = L11^-1 A12 right of the panel in registers and writes the w rows. Out of place, the
// first step first copies the thread's column from A. The block's columns are its threads
// (at most ROWS_MAX_NT: kernels/getrf_cuda.py ROWS_COLS).
constexpr int ROWS_MAX_NT = 128;

template <typename T, int NB, bool PIVOT>
__global__ void __launch_bounds__(ROWS_MAX_NT)
getrf_rows(const unsigned long long* tbl, const long long* meta, const int* imeta,
           const int* tasks, int K, int lo, int hi, int unused) {
  const int NT = (int)blockDim.x;
  constexpr int CHUNK = 8;  // (touched rows moved CHUNK at a time, their loads first)
  const int row = lo + (int)blockIdx.x;
  if (row >= hi) return;
  const int* tk = tasks + (long long)row * VB_TASK_COLS;
  const int q = tk[0], j = tk[1], w = tk[2], m = tk[3], n = tk[4];
  const int outside = n - w;  // columns [0, j) and [j + w, n), numbered 0 .. outside - 1
  const int c0 = (int)blockIdx.y * NT;
  if (c0 >= outside) return;  // (the whole block: before the barrier)
  const T* A = reinterpret_cast<const T*>(tbl[0]) + meta[q];
  const long long lda = meta[K + q];
  T* L = reinterpret_cast<T*>(tbl[1]) + meta[2LL * K + q];
  const long long ld = meta[3LL * K + q];
  const int* ipiv = reinterpret_cast<const int*>(tbl[2]) + meta[4LL * K + q];
  __shared__ T l11[NB][NB + 1];
  __shared__ int from[NB], out_to[NB], out_from[NB];
  __shared__ int n_out;
  const int tid = threadIdx.x;
  const int c = c0 + tid;
  const bool mine = c < outside;
  const int gc = c < j ? c : c + w;  // (the thread's global column)
  if (mine && j == 0 && static_cast<const void*>(A) != static_cast<const void*>(L)) {
    // UNROLL loads in flight before their stores: the compiler cannot move a load above a
    // store to L, which for all it knows may be A.
    constexpr int UNROLL = 4;
    for (int r0 = 0; r0 < m; r0 += UNROLL) {
      T v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (r0 + u < m) v[u] = A[at<true>(r0 + u, gc, lda)];
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (r0 + u < m) L[at<true>(r0 + u, gc, ld)] = v[u];
      }
    }
  }
  if (tid < 32) {
    int content, op, oc;
    const int out = replay_swaps<PIVOT>(ipiv, j, w, tid, content, op, oc);
    if (tid < w) from[tid] = content;
    if (tid < out) {
      out_to[tid] = op;
      out_from[tid] = oc;
    }
    if (tid == 0) n_out = out;
  }
  for (int e = tid; e < w * w; e += NT) {
    l11[e / w][e % w] = L[at<true>(j + e / w, j + e % w, ld)];
  }
  __syncthreads();
  if (!mine || (!PIVOT && gc < j)) return;  // (without pivoting, left of the panel: nothing)
  T v[NB];
#pragma unroll
  for (int i = 0; i < NB; ++i) {
    if (i < w) v[i] = L[at<true>(from[i], gc, ld)];
  }
  const int out = n_out;
  for (int k0 = 0; k0 < out; k0 += CHUNK) {
    T o[CHUNK];
#pragma unroll
    for (int k = 0; k < CHUNK; ++k) {
      if (k0 + k < out) o[k] = L[at<true>(out_from[k0 + k], gc, ld)];
    }
#pragma unroll
    for (int k = 0; k < CHUNK; ++k) {
      if (k0 + k < out) L[at<true>(out_to[k0 + k], gc, ld)] = o[k];
    }
  }
  if (gc >= j + w) {  // (right of the panel: U12 = L11^-1 A12)
#pragma unroll
    for (int i = 1; i < NB; ++i) {
      if (i < w) {
#pragma unroll
        for (int k = 0; k < i; ++k) v[i] = fma(-l11[i][k], v[k], v[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < NB; ++i) {
    if (i < w) L[at<true>(j + i, gc, ld)] = v[i];
  }
}

// Column-major: the same step's work with one block barrier. Warp 0 replays the step's swaps
// (as getrf_rows) into shared memory while the other warps read L11 there (and, out of place at
// the first step, copy their columns' rows [w, m) from A); after the barrier a warp owns its
// columns outright: U a lane, 32 / NB an instruction, lane r of a segment row j + r. Its loads
// come first, U columns' worth a lane in flight, then __syncwarp (the rows below the w that a
// swap touched are read before they are written), the writes, and right of the panel the
// solve by L11 in NB - 1 shuffle steps a column. Without pivoting the columns left of the
// panel are not touched.
template <typename T, int NB, bool PIVOT>
__global__ void __launch_bounds__(256)
getrf_rows_cm(const unsigned long long* tbl, const long long* meta, const int* imeta,
              const int* tasks, int K, int lo, int hi, int unused) {
  constexpr int WARPS = 8, U = 4, S = 32 / NB;
  constexpr int CB = WARPS * S * U;  // columns a block (kernels/getrf_cuda.py rows_cols)
  const int row = lo + (int)blockIdx.x;
  if (row >= hi) return;
  const int* tk = tasks + (long long)row * VB_TASK_COLS;
  const int q = tk[0], j = tk[1], w = tk[2], m = tk[3], n = tk[4];
  const int outside = n - w;  // columns [0, j) and [j + w, n), numbered 0 .. outside - 1
  const int c0 = (int)blockIdx.y * CB;
  const int cend = min(c0 + CB, outside);
  if (c0 >= outside || (!PIVOT && cend <= j)) return;  // (the whole block: before the barrier)
  const T* A = reinterpret_cast<const T*>(tbl[0]) + meta[q];
  const long long lda = meta[K + q];
  T* L = reinterpret_cast<T*>(tbl[1]) + meta[2LL * K + q];
  const long long ld = meta[3LL * K + q];
  const int* ipiv = reinterpret_cast<const int*>(tbl[2]) + meta[4LL * K + q];
  __shared__ T l11[NB][NB + 1];
  __shared__ int s_from[NB], s_to[NB], s_ofrom[NB];
  __shared__ int s_out;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane % NB, s = lane / NB;
  const bool solve = cend > j;  // (some column of the block is right of the panel)
  const bool copy = j == 0 && static_cast<const void*>(A) != static_cast<const void*>(L);
  int gc[U];
  bool ok[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = c0 + (warp * U + u) * S + s;
    ok[u] = c < outside && (PIVOT || c >= j);
    gc[u] = c < j ? c : c + w;
  }
  if (warp == 0) {
    int content, op, oc;
    const int out = replay_swaps<PIVOT>(ipiv, j, w, lane, content, op, oc);
    if (lane < NB) {
      s_from[lane] = content;
      s_to[lane] = op;
      s_ofrom[lane] = oc;
    }
    if (lane == 0) s_out = out;
  } else {
    if (solve) {
      constexpr int PER = (NB * NB + 32 * (WARPS - 1) - 1) / (32 * (WARPS - 1));
      T v[PER];
#pragma unroll
      for (int t = 0; t < PER; ++t) {
        const int e = (int)threadIdx.x - 32 + t * 32 * (WARPS - 1), rr = e % NB, cc = e / NB;
        if (e < NB * NB && rr < w && cc < rr) v[t] = L[at<false>(j + rr, j + cc, ld)];
      }
#pragma unroll
      for (int t = 0; t < PER; ++t) {
        const int e = (int)threadIdx.x - 32 + t * 32 * (WARPS - 1), rr = e % NB, cc = e / NB;
        if (e < NB * NB && rr < w && cc < rr) l11[rr][cc] = v[t];
      }
    }
  }
  if (copy) {  // (rows [0, w) are written below)
    for (int i0 = w + r; i0 < m; i0 += 2 * NB) {
      T v[U][2];
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int i = i0 + t * NB;
          if (ok[u] && i < m) v[u][t] = A[at<false>(i, gc[u], lda)];
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int i = i0 + t * NB;
          if (ok[u] && i < m) L[at<false>(i, gc[u], ld)] = v[u][t];
        }
      }
    }
  }
  __syncthreads();  // (the permutation and l11; the copy written before the rows below)
  const T* src = copy ? A : L;
  const long long lds = copy ? lda : ld;
  const int out = s_out, from = s_from[r];
  T x[U], o[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    x[u] = ok[u] && r < w ? src[at<false>(from, gc[u], lds)] : T(0);
    o[u] = ok[u] && r < out ? src[at<false>(s_ofrom[r], gc[u], lds)] : T(0);
  }
  __syncwarp();  // (every source row of the warp's columns read before any is written)
  if (r < out) {
    const int to = s_to[r];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (ok[u]) L[at<false>(to, gc[u], ld)] = o[u];
    }
  }
  if (solve) {  // (right of the panel: U12 = L11^-1 A12; lanes r <= k keep theirs)
#pragma unroll
    for (int k = 0; k < NB - 1; ++k) {
      if (k + 1 < w) {
        const T lk = r > k && r < w ? l11[r][k] : T(0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const T xk = shfl(x[u], k, NB);
          if (r > k && gc[u] >= j + w) x[u] = fma(-lk, xk, x[u]);
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (ok[u] && r < w) L[at<false>(j + r, gc[u], ld)] = x[u];
  }
}

// A solve's row interchanges (getrs, gesv): the task is the blas family's single task (q, 0, r,
// 0, nrhs, nrhs): r pivots, nrhs right-hand sides, a thread per right-hand side, SWAP_COLS a
// block in the grid's second dimension. `extra` (kernels/getrf_cuda.py swap_extra) holds the
// slots (the op's buffer indices, whose pointers are tbl[4 + slot]) of X, of the source (7:
// none) and of ipiv, then whether the interchanges run forward (X := P X, ipiv[0] first) or
// backward (X := P^T X), and whether a problem whose info is set is left after the copy (GESV's
// singular problems keep B). With a source, X := B first. X and B share a layout.
template <typename T, bool ROW>
__global__ void __launch_bounds__(64)
getrf_swap(const unsigned long long* tbl, const long long* meta, const int* imeta,
           const int* tasks, int K, int lo, int hi, int extra) {
  constexpr int CT = 64;  // (kernels/getrf_cuda.py SWAP_COLS)
  const int row = lo + (int)blockIdx.x;
  if (row >= hi) return;
  const int* tk = tasks + (long long)row * VB_TASK_COLS;
  const int q = tk[0], r = tk[2], nrhs = tk[5];
  const int c = (int)blockIdx.y * CT + (int)threadIdx.x;
  if (c >= nrhs) return;
  const int xs = extra & 7, ss = (extra >> 3) & 7, ps = (extra >> 6) & 7;
  const bool forward = (extra >> 9) & 1, skip = (extra >> 10) & 1;
  T* X = reinterpret_cast<T*>(tbl[4 + xs]) + meta[2LL * K * xs + q];
  const long long ld = meta[2LL * K * xs + K + q];
  T* x = X + at<ROW>(0, c, ld);
  const long long rs = ROW ? ld : 1;  // (the column's stride)
  if (ss != 7) {
    const T* S = reinterpret_cast<const T*>(tbl[4 + ss]) + meta[2LL * K * ss + q];
    const long long lds = meta[2LL * K * ss + K + q];
    const T* s = S + at<ROW>(0, c, lds);
    const long long ss_ = ROW ? lds : 1;
    for (int i = 0; i < r; ++i) x[(long long)i * rs] = s[(long long)i * ss_];
  }
  if (skip && reinterpret_cast<const int*>(tbl[3])[q] != 0) return;
  const int* piv = reinterpret_cast<const int*>(tbl[4 + ps]) + meta[2LL * K * ps + q];
  for (int t = 0; t < r; ++t) {
    const int i = forward ? t : r - 1 - t;
    const int p = piv[i];
    if (p != i && p >= 0 && p < r) {  // (pivots a kept call's caller changed: no stray access)
      const T a = x[(long long)i * rs];
      x[(long long)i * rs] = x[(long long)p * rs];
      x[(long long)p * rs] = a;
    }
  }
}

}  // namespace vb

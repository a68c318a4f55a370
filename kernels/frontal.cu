// vbatch: the frontal kernel family (vbatch.ops.frontal; launcher: frontal_cuda.py).
//
// frontal_extend_add: F_parent[rel[i], rel[j]] += S[i, j] for the lower triangle (i >= j) of a
// child front's u x u Schur complement S (its trailing block, from row and column p). A task row
// is (child, parent, p, u); the block's x index is its task, and its y index walks the 32 x 32
// tiles of S (those above the diagonal skipped), 256 threads with 4 entries each, the fast
// thread index along the contiguous dimension (rows in column-major, ROW = false). Children of
// one parent may share a launch and reach the same parent entry, hence atomicAdd.
//
// tbl[0]: the fronts (l), tbl[1]: the positions (rel, floats holding integers; an op's buffers
// share one dtype). extra: bits 0-3 the plan slot of l, bits 4-7 that of rel; the plan's meta
// table holds each slot's offset[K] then ld[K].

namespace vb {

template <typename T, bool ROW>
__global__ void __launch_bounds__(256)
frontal_extend_add(const unsigned long long* tbl, const long long* meta, const int* imeta,
                   const int* tasks, int K, int lo, int hi, int extra) {
  const int row = lo + (int)blockIdx.x;
  if (row >= hi) return;
  const int* r = tasks + (long long)row * VB_TASK_COLS;
  const int q = r[0], parent = r[1], p = r[2], u = r[3];
  T* L = reinterpret_cast<T*>(tbl[0]);
  const T* rel = reinterpret_cast<const T*>(tbl[1]);
  const long long* ml = meta + 2LL * K * (extra & 15);
  const long long* mr = meta + 2LL * K * ((extra >> 4) & 15);
  const T* S = L + ml[q] + at<ROW>(p, p, ml[K + q]);
  const long long ld = ml[K + q];
  T* P = L + ml[parent];
  const long long pld = ml[K + parent];
  const T* pos = rel + mr[q];  // order F, one column: contiguous
  const int tiles = (u + 31) / 32;
  const int fast = threadIdx.x % 32, slow = threadIdx.x / 32;
  for (int t = blockIdx.y; t < tiles * tiles; t += gridDim.y) {
    const int ti = t / tiles, tj = t % tiles;
    if (tj > ti) continue;
    for (int e = 0; e < 4; ++e) {
      const int i = ti * 32 + (ROW ? slow + 8 * e : fast);
      const int j = tj * 32 + (ROW ? fast : slow + 8 * e);
      if (i < u && j <= i) {
        const T v = S[at<ROW>(i, j, ld)];
        const int pi = (int)pos[i], pj = (int)pos[j];
        atomicAdd(P + at<ROW>(pi, pj, pld), v);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The solve (frontal_solve): two sweeps over every front of the batch, each one launch
// (vbatch.ops.frontal.sweep_items says what an item does). A block takes a ticket and runs
// the item at that place in the launch's task range (a group of small fronts' first item: the
// group, a warp each; a later member's block exits); the items are in an order where every item
// needs only earlier ones, which are held by blocks already running, so waiting cannot
// deadlock. What an item waits for is counted per front in the op's scratch (tbl[3], 32-bit
// counters over each front's entries; zeroed by frontal_sweep_reset at the start of the call):
// [0] update items of its children added into it, [1] its pivot chunks solved forward, [2]
// backward; front 0's entries then hold the two sweeps' tickets at [3] and [4] (the small
// subtrees' launches, frontal_sweep_small, at [5] and [6]).
//
// A task row is (front, parent, p, u, i0, need); tbl[0] the fronts (l), tbl[1] the positions
// (rel), tbl[2] the right-hand sides (x, each front's n x r block). extra: bits 0-3, 4-7, 8-11,
// 12-15 the plan slots of l, rel, x and the scratch; bits 16-30 r. X written by other blocks is
// read through L2 (__ldcg): L1 is not coherent across blocks.

// Thread 0 waits until *c >= v; then the whole block goes on, seeing what was written before
// the count that satisfied it (the writer fenced before counting).
__device__ __forceinline__ void sweep_wait(const int* c, int v) {
  if (threadIdx.x == 0) {
    while (*reinterpret_cast<const volatile int*>(c) < v) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
}

// Every thread's writes made visible device-wide, then one count.
__device__ __forceinline__ void sweep_signal(int* c) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(c, 1);
}

template <typename T>
__global__ void __launch_bounds__(256)
frontal_sweep_reset(const unsigned long long* tbl, const long long* meta, const int* imeta,
                    const int* tasks, int K, int lo, int hi, int extra) {
  const int q = (int)blockIdx.x * 256 + (int)threadIdx.x;
  if (q >= K) return;
  const long long* ms = meta + 2LL * K * ((extra >> 12) & 15);
  int* w = reinterpret_cast<int*>(reinterpret_cast<T*>(tbl[3]) + ms[q]);
  w[0] = 0;
  w[1] = 0;
  w[2] = 0;
  if (q == 0) {  // the tickets: the sweeps' at 3 to 6, the factor's tree launches' at 3 + class
#pragma unroll
    for (int t = 3; t < 8; ++t) w[t] = 0;
  }
}

// frontal_sweep_move: the solve's stacked right-hand sides into the fronts (IN: a front's
// pivot row i from stacked row rows[i], its update rows zero) or its solution out of them (the
// pivot rows into y), a warp a task, 8 a block; a task moves CH rows of a front from row i0
// (up to its n rows in, its p pivot rows out). The stacked arrays are N x r row-major, tbl[5]
// (rhs) and tbl[7] (y); tbl[6] holds each front's rows as integers in its elements' bits (int32
// in 4-byte elements, int64 in the first 8 bytes of wider ones: ops.frontal.index_bits). extra:
// bits 0-3, 4-7, 8-11, 12-15 the plan slots of x, rhs, rows and y; bits 16-30 r. A warp walks
// its rows of X along the unit stride.
template <int S> struct move_index { using type = long long; };
template <> struct move_index<4> { using type = int; };

template <typename T, bool ROW, bool IN, int CH>
__global__ void __launch_bounds__(256)
frontal_sweep_move(const unsigned long long* tbl, const long long* meta, const int* imeta,
                   const int* tasks, int K, int lo, int hi, int extra) {
  using I = typename move_index<sizeof(T)>::type;
  constexpr int STEP = (int)(sizeof(T) / sizeof(I));
  const int t = lo + (int)blockIdx.x * 8 + (int)threadIdx.x / 32;
  if (t >= hi) return;
  const int lane = (int)threadIdx.x % 32;
  const int* row = tasks + (long long)t * VB_TASK_COLS;
  const int q = row[0], p = row[2], i0 = row[4];
  const int h = min(CH, (IN ? p + row[3] : p) - i0);
  const int r = (extra >> 16) & 0x7fff;
  const long long* mx = meta + 2LL * K * (extra & 15);
  T* X = reinterpret_cast<T*>(tbl[2]) + mx[q];
  const long long ldx = mx[K + q];
  const I* at = reinterpret_cast<const I*>(reinterpret_cast<const T*>(tbl[6]) +
                                           meta[2LL * K * ((extra >> 8) & 15) + q]);
  T* V = reinterpret_cast<T*>(tbl[IN ? 5 : 7]) +
         meta[2LL * K * ((extra >> (IN ? 4 : 12)) & 15)];
  for (int e = lane; e < h * r; e += 32) {
    const int i = i0 + (ROW ? e / r : e % h);
    const int c = ROW ? e % r : e / h;
    T* xe = X + (ROW ? (long long)i * ldx + c : i + (long long)c * ldx);
    if (i < p) {
      T* ve = V + (long long)at[(long long)i * STEP] * r + c;
      if (IN) *xe = *ve;
      else *ve = *xe;
    } else if (IN) {
      *xe = T(0);
    }
  }
}

// The forward sum of CH rows [a, a + h) of a front over the pivot columns of chunks [0, ncb):
// vals[i][c] = X[a + i, c0 + c] - sum_j L[a + i, j] X[j, c0 + c]. Thread (ri, sl): row ri of the
// rows, columns sl, sl + 4, ... of each chunk (coalesced down a column in order F). Waits for
// each chunk to be solved; `known` (uniform) counts the chunks already seen solved. Chunk `own`
// (this block's, just solved) is read from ys in shared memory, not from X.
//
// An item is a chain of memory round trips, and they, not bandwidth, bound the small fronts:
// so every load that does not wait on another block (L, the rows' own X) is issued before the
// wait, and every load of L before its first use (a loop of load-then-use waits once a turn).
template <typename T, bool ROW, int CH, int RC>
__device__ __forceinline__ void sweep_rows(const T* Lq, long long ldl, const T* Xq, long long ldx,
                                           int a, int h, int ncb, int p, int c0, int rc,
                                           int& known, const int* solved, int own,
                                           const T (*ys)[RC], T (*stage)[RC],
                                           T (*red)[CH][RC], T (*vals)[RC]) {
  const int tid = (int)threadIdx.x, ri = tid % CH, sl = tid / CH;
  T acc[RC], xr[RC];
#pragma unroll
  for (int c = 0; c < RC; ++c) {
    acc[c] = T(0);
    xr[c] = sl == 0 && ri < h && c < rc ? __ldcg(Xq + at<ROW>(a + ri, c0 + c, ldx)) : T(0);
  }
  for (int cb = 0; cb < ncb; ++cb) {
    const int j0 = cb * CH, w = min(CH, p - j0);
    T lv[CH / 4];
#pragma unroll
    for (int t = 0; t < CH / 4; ++t) {
      const int j = sl + 4 * t;
      lv[t] = ri < h && j < w ? __ldg(Lq + at<ROW>(a + ri, j0 + j, ldl)) : T(0);
    }
    if (cb >= known) {
      sweep_wait(solved, cb + 1);
      known = cb + 1;
    }
    __syncthreads();  // the previous chunk's reads of stage are done
    for (int e = tid; e < CH * RC; e += 256) {
      const int j = e / RC, c = e % RC;
      stage[j][c] = !(j < w && c < rc) ? T(0)
                    : cb == own ? ys[j][c] : __ldcg(Xq + at<ROW>(j0 + j, c0 + c, ldx));
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < CH / 4; ++t)
#pragma unroll
      for (int c = 0; c < RC; ++c) acc[c] += lv[t] * stage[sl + 4 * t][c];
  }
#pragma unroll
  for (int c = 0; c < RC; ++c) red[sl][ri][c] = acc[c];
  __syncthreads();
  if (sl == 0 && ri < h) {
    for (int c = 0; c < rc; ++c)
      vals[ri][c] = xr[c] - ((red[0][ri][c] + red[1][ri][c]) + (red[2][ri][c] + red[3][ri][c]));
  }
  __syncthreads();
}

// The diagonal block L[a:a+h, a:a+h] (lower) into tri, inverted there: the substitutions
// with it are then products whose rows are independent, where with L itself each of the
// chunk's CH rows waited on the one before (a shuffle, a multiply and an FMA each; a sweep
// runs such chunks one after another up the tree: bcsstk16's solve took 362 us of GPU time
// that way, 176 with the inverse; docs/decisions.md#sparse-solve-sweeps). Entries outside
// the lower h x h triangle are zero. Called before the item waits, so
// the inversion is off that path. (Loads first, then stores: 16 round trips to memory one
// after another cost ~5 us an item.) dinv: scratch for the pivots' reciprocals.
template <typename T, bool ROW, int CH>
__device__ __forceinline__ void sweep_triangle(const T* Lq, long long ldl, int a, int h,
                                               T (*tri)[CH + 1], T* dinv) {
  static_assert(CH == 64, "four diagonal blocks of 16");
  constexpr int PER = CH * CH / 256, B = 16;
  const int tid = (int)threadIdx.x;
  T v[PER];
#pragma unroll
  for (int t = 0; t < PER; ++t) {
    const int e = tid + 256 * t;
    const int i = ROW ? e / CH : e % CH, j = ROW ? e % CH : e / CH;
    v[t] = i < h && j <= i ? __ldg(Lq + at<ROW>(a + i, a + j, ldl)) : T(0);
  }
#pragma unroll
  for (int t = 0; t < PER; ++t) {
    const int e = tid + 256 * t;
    const int i = ROW ? e / CH : e % CH, j = ROW ? e % CH : e / CH;
    tri[i][j] = v[t];
  }
  __syncthreads();
  if (tid < CH) dinv[tid] = tid < h ? T(1) / tri[tid][tid] : T(0);
  __syncthreads();
  // The four diagonal 16 x 16 blocks: thread t < 64 solves column t % 16 of block t / 16 by
  // forward substitution in registers (rows past h are zero, and stay so: dinv is 0 there).
  T x[B];
  const int o = (tid / B) * B, c = tid % B;
  if (tid < CH) {
#pragma unroll
    for (int i = 0; i < B; ++i) {
      T sum = T(0);
#pragma unroll
      for (int k = 0; k < i; ++k) sum += tri[o + i][o + k] * x[k];  // (x[k] = 0 for k < c)
      x[i] = i < c ? T(0) : ((i == c ? T(1) : T(0)) - sum) * dinv[o + i];
    }
  }
  __syncthreads();
  if (tid < CH) {
#pragma unroll
    for (int i = 0; i < B; ++i)
      if (i >= c) tri[o + i][o + c] = x[i];
  }
  __syncthreads();
  // The blocks below the diagonal, by block column from the right (LAPACK's trti2 by blocks):
  // Inv[I, J] = -(sum_{K > J} Inv[I, K] L[K, J]) Inv[J, J], the block columns right of J
  // already inverse, column J still L until it is read whole.
#pragma unroll
  for (int J = CH / B - 2; J >= 0; --J) {
    const int r0 = (J + 1) * B, nel = (CH - r0) * B;
    if (r0 >= h) continue;  // (uniform: no rows below this block column)
    T w[3];
#pragma unroll
    for (int t = 0; t < 3; ++t) {  // T = sum_{k >= r0} Inv[i, k] L[k, j], k <= i
      const int e = tid + 256 * t, i = r0 + e / B, j = J * B + e % B;
      T sum = T(0);
      if (e < nel)
        for (int k = r0; k <= i; ++k) sum += tri[i][k] * tri[k][j];
      w[t] = sum;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < 3; ++t) {
      const int e = tid + 256 * t;
      if (e < nel) tri[r0 + e / B][J * B + e % B] = w[t];
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < 3; ++t) {  // -T Inv[J, J]: columns m >= j of the diagonal block
      const int e = tid + 256 * t, i = r0 + e / B, j = J * B + e % B;
      T sum = T(0);
      if (e < nel)
        for (int m = j; m < (J + 1) * B; ++m) sum += tri[i][m] * tri[m][j];
      w[t] = -sum;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < 3; ++t) {
      const int e = tid + 256 * t;
      if (e < nel) tri[r0 + e / B][J * B + e % B] = w[t];
    }
    __syncthreads();
  }
}

// The backward item's row chunk t: update rows first (ut chunks from p), then the later pivot
// chunks, the last one first.
template <int CH>
__device__ __forceinline__ void sweep_bwd_rows(int t, int ut, int p, int n, int npc, int& s0,
                                               int& hh) {
  if (t < ut) {
    s0 = p + t * CH;
    hh = min(CH, n - s0);
  } else {
    s0 = (npc - 1 - (t - ut)) * CH;
    hh = min(CH, p - s0);
  }
}

// L[s0 + lane (+ 32), i0 + j] for the warp's 8 columns j = wp + 8 jj: coalesced in order F.
template <typename T, bool ROW>
__device__ __forceinline__ void sweep_bwd_load(const T* Lq, long long ldl, int s0, int hh, int i0,
                                               int h, int wp, int lane, T* l0, T* l1) {
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const int j = wp + 8 * jj;
    l0[jj] = j < h && lane < hh ? __ldg(Lq + at<ROW>(s0 + lane, i0 + j, ldl)) : T(0);
    l1[jj] = j < h && lane + 32 < hh ? __ldg(Lq + at<ROW>(s0 + lane + 32, i0 + j, ldl)) : T(0);
  }
}

// A small front (n <= 32 R; one item) by one warp, R rows a lane (row lane + 32 s in slot s).
// Forward, its pivots and update rows are one loop over the pivot columns (column j of L
// coalesced down the lanes, y_j broadcast from its owner); the update rows then go into the
// parent. Backward, row i of L across the lanes (lane j: L[i, j], j < i), x_i broadcast once
// final, last row first. No shared memory and no block barrier: 8 fronts of one level share a
// block, and the waits are a lane's. (Slots are picked by unrolled compares, so the arrays stay
// in registers.)
//
// L comes in chunks of CB columns (forward) or rows (backward) through two register buffers,
// the next chunk's loads issued before the current one is used: 2 CB columns a memory round
// trip. A loop that loaded each column where it used it (unrolled twice) kept two in flight,
// and a front was a chain of p / 2 round trips: the 1000 Laplacians' sweeps took 397 and 413
// us for 40,545 such fronts, about 10x the time to read their L once (H200, 2026-11-26).
template <typename T, bool ROW, int R, int CB>
__device__ __forceinline__ void small_cols(T (&l)[R][CB], const T* Lq, long long ldl, int n,
                                           int p, int j0, int lane) {
#pragma unroll
  for (int t = 0; t < CB; ++t)
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int i = lane + 32 * s, j = j0 + t;
      l[s][t] = i < n && j < p ? __ldg(Lq + at<ROW>(i, j, ldl)) : T(0);
    }
}

// Forward over columns [j0, j0 + CB) (those < p): v holds the rows' running values.
template <typename T, int R, int CB>
__device__ __forceinline__ void small_fwd(const T (&l)[R][CB], T (&v)[R], const T (&d)[R],
                                          int j0, int p, int lane) {
#pragma unroll
  for (int t = 0; t < CB; ++t) {
    const int j = j0 + t;
    if (j >= p) break;  // (uniform)
    // the pivot row's value from its slice j / 32, as a select over the slices: written as
    // `if (s == j / 32)` the compiler indexed v and d by j / 32, which put both in local
    // memory, a load and a store on the chain every column
    T own = v[0] * d[0];
#pragma unroll
    for (int s = 1; s < R; ++s) own = j >= 32 * s ? v[s] * d[s] : own;
    const T y = __shfl_sync(0xffffffffu, own, j % 32);
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int i = lane + 32 * s;
      if (i == j) v[s] = y;
      else if (i > j) v[s] -= l[s][t] * y;
    }
  }
}

// Rows top - 1, top - 2, ..., top - CB (those >= 0) of L across the lanes: lane j + 32 s holds
// L[i, j + 32 s] for the columns left of the diagonal and among the pivots.
template <typename T, bool ROW, int R, int CB>
__device__ __forceinline__ void small_rows(T (&l)[R][CB], const T* Lq, long long ldl, int p,
                                           int top, int lane) {
#pragma unroll
  for (int t = 0; t < CB; ++t)
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int i = top - 1 - t, j = lane + 32 * s;
      l[s][t] = i >= 0 && j < min(i, p) ? __ldg(Lq + at<ROW>(i, j, ldl)) : T(0);
    }
}

// Backward over rows top - 1 down to top - CB (those >= 0): x holds the rows' values (final
// once their row is passed), acc the sums L[i, j] x_i of the rows passed, per column j.
template <typename T, int R, int CB>
__device__ __forceinline__ void small_bwd(const T (&l)[R][CB], T (&x)[R], T (&acc)[R],
                                          const T (&d)[R], int top, int p, int lane) {
#pragma unroll
  for (int t = 0; t < CB; ++t) {
    const int i = top - 1 - t;
    if (i < 0) break;  // (uniform)
    // (selects over the slices, not an index i / 32: as in small_fwd)
    T own = T(0);
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const bool here = i >= 32 * s && i < 32 * (s + 1);
      x[s] = here && i < p && lane == i % 32 ? (x[s] - acc[s]) * d[s] : x[s];
      own = here ? x[s] : own;
    }
    const T xi = __shfl_sync(0xffffffffu, own, i % 32);
#pragma unroll
    for (int s = 0; s < R; ++s) acc[s] += l[s][t] * xi;
  }
}

template <typename T, bool ROW, bool FWD, int R, int CB>
__device__ __forceinline__ void sweep_small(const T* Lq, long long ldl, T* Xq, long long ldx,
                                            T* Xp, long long ldp, const T* pos, int p, int u,
                                            int r, int lane, int* cq, int* cp, bool has_parent,
                                            int need) {
  const int n = p + u;
  T d[R];  // the pivots' reciprocals (lane j: L[j, j]), loaded before any wait
#pragma unroll
  for (int s = 0; s < R; ++s) {
    const int i = lane + 32 * s;
    d[s] = i < p ? T(1) / __ldg(Lq + at<ROW>(i, i, ldl)) : T(0);
  }
  T la[R][CB], lb[R][CB];
  if (FWD) {
    small_cols<T, ROW, R, CB>(la, Lq, ldl, n, p, 0, lane);  // (before the wait too)
    if (need > 0) {
      if (lane == 0) {
        while (*reinterpret_cast<const volatile int*>(cq) < need) __nanosleep(32);
        __threadfence();
      }
      __syncwarp();
    }
    for (int c = 0; c < r; ++c) {
      T v[R];
#pragma unroll
      for (int s = 0; s < R; ++s) {
        const int i = lane + 32 * s;
        v[s] = i < n ? __ldcg(Xq + at<ROW>(i, c, ldx)) : T(0);
      }
      if (c > 0) small_cols<T, ROW, R, CB>(la, Lq, ldl, n, p, 0, lane);
      for (int j0 = 0; j0 < p; j0 += 2 * CB) {
        small_cols<T, ROW, R, CB>(lb, Lq, ldl, n, p, j0 + CB, lane);
        small_fwd<T, R, CB>(la, v, d, j0, p, lane);
        small_cols<T, ROW, R, CB>(la, Lq, ldl, n, p, j0 + 2 * CB, lane);
        small_fwd<T, R, CB>(lb, v, d, j0 + CB, p, lane);
      }
#pragma unroll
      for (int s = 0; s < R; ++s) {
        const int i = lane + 32 * s;
        if (i < p) Xq[at<ROW>(i, c, ldx)] = v[s];
        else if (i < n) atomicAdd(Xp + at<ROW>((int)pos[i - p], c, ldp), v[s]);
      }
    }
    if (u > 0) {
      __threadfence();
      __syncwarp();
      if (lane == 0) atomicAdd(cp, 1);
    }
    return;
  }
  small_rows<T, ROW, R, CB>(la, Lq, ldl, p, n, lane);  // (before the wait too)
  if (has_parent) {
    if (lane == 0) {
      while (*reinterpret_cast<const volatile int*>(cp + 2) < need) __nanosleep(32);
      __threadfence();
    }
    __syncwarp();
  }
  for (int c = 0; c < r; ++c) {
    T x[R], acc[R];
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int i = lane + 32 * s;
      x[s] = i < p ? __ldcg(Xq + at<ROW>(i, c, ldx))
           : i < n ? __ldcg(Xp + at<ROW>((int)pos[i - p], c, ldp)) : T(0);
      if (i >= p && i < n) Xq[at<ROW>(i, c, ldx)] = x[s];  // for the children
      acc[s] = T(0);
    }
    if (c > 0) small_rows<T, ROW, R, CB>(la, Lq, ldl, p, n, lane);
    for (int top = n; top > 0; top -= 2 * CB) {
      small_rows<T, ROW, R, CB>(lb, Lq, ldl, p, top - CB, lane);
      small_bwd<T, R, CB>(la, x, acc, d, top, p, lane);
      small_rows<T, ROW, R, CB>(la, Lq, ldl, p, top - 2 * CB, lane);
      small_bwd<T, R, CB>(lb, x, acc, d, top - CB, p, lane);
    }
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int i = lane + 32 * s;
      if (i < p) Xq[at<ROW>(i, c, ldx)] = x[s];
    }
  }
  __threadfence();
  __syncwarp();
  if (lane == 0) atomicAdd(cq + 2, 1);
}

// What both sweep kernels read from the plan's tables: the buffers (tbl[0..3]: L, positions,
// X, the scratch), each one's per-front offsets and leading dimensions (the meta slots in
// extra's bits 0-15), and the column count (bits 16-30).
template <typename T>
struct SweepTables {
  const T* L;
  const T* rel;
  T* X;
  T* S;
  const long long *ml, *mr, *mx, *ms;
  int K, r;
  __device__ SweepTables(const unsigned long long* tbl, const long long* meta, int K_, int extra)
      : L(reinterpret_cast<const T*>(tbl[0])), rel(reinterpret_cast<const T*>(tbl[1])),
        X(reinterpret_cast<T*>(tbl[2])), S(reinterpret_cast<T*>(tbl[3])),
        ml(meta + 2LL * K_ * (extra & 15)), mr(meta + 2LL * K_ * ((extra >> 4) & 15)),
        mx(meta + 2LL * K_ * ((extra >> 8) & 15)), ms(meta + 2LL * K_ * ((extra >> 12) & 15)),
        K(K_), r(extra >> 16) {}
  __device__ int* counter(int q) const { return reinterpret_cast<int*>(S + ms[q]); }
};

// The small front of task row tw (front, parent, p, u, i0, need) by this warp: sweep_small,
// fronts of up to 32 rows one row a lane (twice the columns a chunk in the same registers),
// larger ones SR rows a lane.
template <typename T, bool ROW, bool FWD, int SR>
__device__ __forceinline__ void sweep_small_row(const SweepTables<T>& st, const int* tw,
                                                int lane) {
  const int q = tw[0], par = tw[1];
  const int pp = par < 0 ? q : par;  // (a root's "parent": itself, never read)
  const int K = st.K;
  if (tw[2] + tw[3] <= 32)
    sweep_small<T, ROW, FWD, 1, 8>(st.L + st.ml[q], st.ml[K + q], st.X + st.mx[q],
                                   st.mx[K + q], st.X + st.mx[pp], st.mx[K + pp],
                                   st.rel + st.mr[q], tw[2], tw[3], st.r, lane, st.counter(q),
                                   st.counter(pp), par >= 0, tw[5]);
  else
    sweep_small<T, ROW, FWD, SR, 8 / SR>(st.L + st.ml[q], st.ml[K + q], st.X + st.mx[q],
                                         st.mx[K + q], st.X + st.mx[pp], st.mx[K + pp],
                                         st.rel + st.mr[q], tw[2], tw[3], st.r, lane,
                                         st.counter(q), st.counter(pp), par >= 0, tw[5]);
}

// RC: right-hand sides a pass (1 for one: a quarter of the registers and shared memory of 4).
// MINB: blocks a multiprocessor (registers capped to fit): 2 for 4 a pass; for one, per type
// (frontal_cuda.SWEEP_BLOCKS: at 3, 80 registers, the float64 builds spilled up to 240 bytes).
// SR: a small front's rows a lane, at most (fronts of up to 32 SR rows go to a warp each;
// SMALL_FRONT in vbatch.ops.frontal, where the measurement that chose 2 is).
template <typename T, bool ROW, bool FWD, int CH, int UR, int RC, int SR, int MINB>
__global__ void __launch_bounds__(256, MINB)
frontal_sweep(const unsigned long long* tbl, const long long* meta, const int* imeta,
              const int* tasks, int K, int lo, int hi, int extra) {
  static_assert(CH == 64, "a chunk is 64 rows: one a thread of each of 4 slices, two a lane");
  __shared__ T tri[CH][CH + 1];
  __shared__ T dinv[CH];
  __shared__ T stage[CH][RC];
  __shared__ T vals[CH][RC];
  __shared__ T ys[CH][RC];  // forward: the chunk this block solved
  __shared__ T red[4][CH][RC];
  __shared__ int s_row;
  const SweepTables<T> st(tbl, meta, K, extra);
  const T *L = st.L, *rel = st.rel;
  T *X = st.X, *S = st.S;
  const long long *ml = st.ml, *mr = st.mr, *mx = st.mx, *ms = st.ms;
  const int r = st.r;
  const int tid = (int)threadIdx.x, lane = tid % 32;
  if (tid == 0) s_row = lo + atomicAdd(reinterpret_cast<int*>(S + ms[0]) + (FWD ? 3 : 4), 1);
  __syncthreads();
  const int row = s_row;
  if (row >= hi) return;
  const int* tr = tasks + (long long)row * VB_TASK_COLS;
  if (tr[4] < 0) {  // small fronts: a group of up to 8 at the head's row, a warp each
    const int k = -tr[4], w = tid / 32;
    if (k > 8 || w >= k) return;  // (a member's row: its head's block runs it)
    sweep_small_row<T, ROW, FWD, SR>(st, tr + w * VB_TASK_COLS, lane);
    return;
  }
  const int q = tr[0], parent = tr[1], p = tr[2], u = tr[3], i0 = tr[4], need = tr[5];
  const int n = p + u, npc = (p + CH - 1) / CH;
  const T* Lq = L + ml[q];
  const long long ldl = ml[K + q];
  T* Xq = X + mx[q];
  const long long ldx = mx[K + q];
  int* cq = reinterpret_cast<int*>(S + ms[q]);
  const T* pos = rel + mr[q];  // order F, one column: contiguous

  if (FWD) {
    const bool piv = i0 < p;
    const int h = piv ? min(CH, p - i0) : 0;
    int ua, ub;  // update rows
    if (piv) {
      ua = p;
      ub = i0 + CH >= p ? min(n, p + UR) : p;
    } else {
      ua = i0;
      ub = min(n, i0 + UR);
    }
    if (piv) sweep_triangle<T, ROW, CH>(Lq, ldl, i0, h, tri, dinv);  // L first: no wait
    if (need > 0) sweep_wait(cq, need);
    int known = 0;
    if (piv) {
      for (int c0 = 0; c0 < r; c0 += RC) {
        const int rc = min(RC, r - c0);
        sweep_rows<T, ROW, CH, RC>(Lq, ldl, Xq, ldx, i0, h, i0 / CH, p, c0, rc, known, cq + 1,
                                   -1, ys, stage, red, vals);
        if (tid < 32) {  // the diagonal block's solve: its inverse (in tri) times vals
          T v0[RC], v1[RC];
#pragma unroll
          for (int c = 0; c < RC; ++c) v0[c] = v1[c] = T(0);
          for (int j = 0; j < h; ++j) {
            const T l0 = tri[lane][j], l1 = tri[lane + 32][j];  // (zero above the diagonal)
#pragma unroll
            for (int c = 0; c < RC; ++c) {
              const T y = vals[j][c];
              v0[c] += l0 * y;
              v1[c] += l1 * y;
            }
          }
          for (int c = 0; c < rc; ++c) {
            if (lane < h) Xq[at<ROW>(i0 + lane, c0 + c, ldx)] = ys[lane][c] = v0[c];
            if (lane + 32 < h) Xq[at<ROW>(i0 + lane + 32, c0 + c, ldx)] = ys[lane + 32][c] = v1[c];
          }
        }
        __syncthreads();
      }
      // Only other items of this front read the count: its later chunks, its update items.
      if (npc > 1 || u > UR) sweep_signal(cq + 1);
      known = i0 / CH + 1;
    }
    if (ub > ua) {
      T* Xp = X + mx[parent];
      const long long ldp = mx[K + parent];
      // this block's own chunk stays in shared memory (ys) when one pass covers every column
      const int own = piv && r <= RC ? i0 / CH : -1;
      for (int c0 = 0; c0 < r; c0 += RC) {
        const int rc = min(RC, r - c0);
        for (int s0 = ua; s0 < ub; s0 += CH) {
          const int hh = min(CH, ub - s0);
          sweep_rows<T, ROW, CH, RC>(Lq, ldl, Xq, ldx, s0, hh, npc, p, c0, rc, known, cq + 1,
                                     own, ys, stage, red, vals);
          if (tid < hh) {
            const int pi = (int)pos[s0 - p + tid];
            for (int c = 0; c < rc; ++c) atomicAdd(Xp + at<ROW>(pi, c0 + c, ldp), vals[tid][c]);
          }
        }
      }
      int* cp = reinterpret_cast<int*>(S + ms[parent]);
      sweep_signal(cp);
    }
    return;
  }

  // Backward: the chunk of pivot columns [i0, i0 + h), with L^T. Rows below the chunk: the
  // update rows (from the parent's solution), then the later chunks, the last one first.
  const int h = min(CH, p - i0), chunk = i0 / CH;
  const int ut = (u + CH - 1) / CH, nchunks = ut + (npc - 1 - chunk);
  const T* Xp = X + mx[parent < 0 ? q : parent];
  const long long ldp = mx[K + (parent < 0 ? q : parent)];
  const int wp = tid / 32;  // warp wp sums columns wp, wp + 8, ... of the chunk
  sweep_triangle<T, ROW, CH>(Lq, ldl, i0, h, tri, dinv);  // L first: no wait
  T l0[8], l1[8];
  int s0 = 0, hh = 0;
  if (nchunks > 0) {  // the first rows' L, before waiting too
    sweep_bwd_rows<CH>(0, ut, p, n, npc, s0, hh);
    sweep_bwd_load<T, ROW>(Lq, ldl, s0, hh, i0, h, wp, lane, l0, l1);
  }
  if (parent >= 0) sweep_wait(reinterpret_cast<int*>(S + ms[parent]) + 2, need);
  if (chunk == npc - 1 && u > 0) {  // the front's first item: its update rows, for its children
    for (long long e = tid; e < (long long)u * r; e += 256) {
      const int i = ROW ? (int)(e / r) : (int)(e % u), c = ROW ? (int)(e % r) : (int)(e / u);
      Xq[at<ROW>(p + i, c, ldx)] = __ldcg(Xp + at<ROW>((int)pos[i], c, ldp));
    }
    __syncthreads();
  }
  for (int c0 = 0; c0 < r; c0 += RC) {
    const int rc = min(RC, r - c0);
    T x0[RC], x1[RC];  // the chunk's own rows, for the diagonal solve (warp 0)
#pragma unroll
    for (int c = 0; c < RC; ++c) {
      x0[c] = tid < 32 && lane < h && c < rc ? __ldcg(Xq + at<ROW>(i0 + lane, c0 + c, ldx)) : T(0);
      x1[c] = tid < 32 && lane + 32 < h && c < rc
                  ? __ldcg(Xq + at<ROW>(i0 + lane + 32, c0 + c, ldx)) : T(0);
    }
    T acc[8][RC];
#pragma unroll
    for (int jj = 0; jj < 8; ++jj)
#pragma unroll
      for (int c = 0; c < RC; ++c) acc[jj][c] = T(0);
    for (int t = 0; t < nchunks; ++t) {
      sweep_bwd_rows<CH>(t, ut, p, n, npc, s0, hh);
      if (t > 0 || c0 > 0) sweep_bwd_load<T, ROW>(Lq, ldl, s0, hh, i0, h, wp, lane, l0, l1);
      if (t >= ut && c0 == 0) sweep_wait(cq + 2, npc - s0 / CH);
      __syncthreads();  // the previous rows' reads of stage are done
      for (int e = tid; e < CH * RC; e += 256) {
        const int i = e / RC, c = e % RC;
        // update rows straight from the parent: the front's first item may not have copied
        // them yet
        stage[i][c] = !(i < hh && c < rc) ? T(0)
                      : t < ut ? __ldcg(Xp + at<ROW>((int)pos[s0 - p + i], c0 + c, ldp))
                               : __ldcg(Xq + at<ROW>(s0 + i, c0 + c, ldx));
      }
      __syncthreads();
#pragma unroll
      for (int jj = 0; jj < 8; ++jj)
#pragma unroll
        for (int c = 0; c < RC; ++c)
          acc[jj][c] += l0[jj] * stage[lane][c] + l1[jj] * stage[lane + 32][c];
    }
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int j = wp + 8 * jj;
#pragma unroll
      for (int c = 0; c < RC; ++c) {
        T v = acc[jj][c];
#pragma unroll
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && j < h && c < rc) vals[j][c] = v;
      }
    }
    __syncthreads();
    if (tid < 32) {  // the diagonal block's solve, transposed: its inverse (in tri)^T times v
      T u0[RC], u1[RC], v0[RC], v1[RC];
#pragma unroll
      for (int c = 0; c < RC; ++c) {
        u0[c] = lane < h && c < rc ? x0[c] - vals[lane][c] : T(0);
        u1[c] = lane + 32 < h && c < rc ? x1[c] - vals[lane + 32][c] : T(0);
        v0[c] = v1[c] = T(0);
      }
      for (int j = 0; j < h; ++j) {
        const T l0 = tri[j][lane], l1 = tri[j][lane + 32];  // (zero where j < the row)
#pragma unroll
        for (int c = 0; c < RC; ++c) {
          const T y = __shfl_sync(0xffffffffu, j < 32 ? u0[c] : u1[c], j % 32);
          v0[c] += l0 * y;
          v1[c] += l1 * y;
        }
      }
      for (int c = 0; c < rc; ++c) {
        if (lane < h) Xq[at<ROW>(i0 + lane, c0 + c, ldx)] = v0[c];
        if (lane + 32 < h) Xq[at<ROW>(i0 + lane + 32, c0 + c, ldx)] = v1[c];
      }
    }
    __syncthreads();
  }
  sweep_signal(cq + 2);
}


// frontal_sweep_small: a sweep's fronts in small subtrees (every front of the subtree at most
// 64 rows; vbatch.ops.frontal.sweep_items), its own launch before the other items forward
// and after them backward. Each warp takes tickets (front 0's entry 5 forward, 6 backward) and
// runs one front a ticket with sweep_small, until none is left: no block barrier, so a warp
// never idles while the others of its block finish (in frontal_sweep a group's block held its
// 8 warps until the slowest front ended: ~17 warps of 24 a multiprocessor ran, H200,
// 2026-11-26), and the next ticket's atomic is in flight while the current front runs. Tickets
// in item order and one front at a time per warp: the smallest ticket not done is always being
// run, and everything it waits for has a smaller one, so waiting cannot deadlock. MINB: the
// blocks a multiprocessor must hold (registers capped to fit; frontal_cuda.SWEEP_SMALL_BLOCKS).
template <typename T, bool ROW, bool FWD, int SR, int MINB>
__global__ void __launch_bounds__(256, MINB)
frontal_sweep_small(const unsigned long long* tbl, const long long* meta, const int* imeta,
                    const int* tasks, int K, int lo, int hi, int extra) {
  const SweepTables<T> st(tbl, meta, K, extra);
  const int lane = (int)threadIdx.x % 32;
  int* ticket = st.counter(0) + (FWD ? 5 : 6);
  int t = 0;
  if (lane == 0) t = atomicAdd(ticket, 1);
  t = lo + __shfl_sync(0xffffffffu, t, 0);
  while (t < hi) {
    int tn = 0;
    if (lane == 0) tn = atomicAdd(ticket, 1);  // (its result is first needed after this front)
    sweep_small_row<T, ROW, FWD, SR>(st, tasks + (long long)t * VB_TASK_COLS, lane);
    t = lo + __shfl_sync(0xffffffffu, tn, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// frontal_tree: the factorization of the small fronts (vbatch.ops.frontal.frontal_graph), a
// front a block: wait for the children's extend-adds (the front's counter [0] reaching `need`),
// load its lower triangle into registers, factor its p pivot columns (right-looking, one rank-1
// update a column), store L and the Schur complement S, add S into the parent at the rows rel
// lists (atomics: siblings may add into one entry at once), then count one more child done in
// the parent's counter. Tickets (front 0's entry 3 + the launch's class) hand the items out in
// table order, children before parents (by height), so a block waits only for blocks that
// already run or have ended (as the solve's sweeps). The classes below this launch's have
// ended before it starts (the plan's edges).
//
// The front lives in registers: thread (x, y) of a TXR x TXC grid holds the RR x RC entries
// (x + TXR a, y + TXC b) (x the fast thread index in column-major order, y in row-major, so that
// it runs along contiguous memory), a cyclic layout that keeps every thread busy as the
// trailing block shrinks. Only the tiles with entries on or below the diagonal are live (the
// others are constant zeros the compiler drops). MINB: the blocks a multiprocessor must hold (registers capped to fit), chosen per
// class in frontal_cuda.py: a front is a chain of dependent memory round trips and barriers,
// so fronts resident at once, not arithmetic, set a launch's rate. Step k: the owners of column k put it in shared memory (double-buffered: one
// barrier a step), every thread takes the pivot, scales its rows' and columns' entries and
// updates its own; row and column blocks that are done or past n are skipped (uniform
// branches: a 20-row front costs a 32-row one's work, not the tile's).
//
// A task row is (front, parent, p, u, need); extra: bits 0-3, 4-7 and 12-15 the plan slots of l,
// rel and the scratch, bits 16-18 the launch's class. tbl[4]: info (pinned host memory), the
// failed pivot's column within the front (1-based); a failed front stores what it has, adds
// nothing into its parent, and still counts itself done there.
template <typename T> __device__ __forceinline__ T tree_rsqrt(T x);
template <> __device__ __forceinline__ double tree_rsqrt<double>(double x) { return rsqrt(x); }
template <> __device__ __forceinline__ float tree_rsqrt<float>(float x) { return rsqrtf(x); }

// What the tree kernels (frontal_tree, frontal_tree_smem) share. A tree item: its front (q),
// parent, pivots, update rows, order; its front's and its parent's addresses (a root's parent:
// itself), its parent's counter, and info.
template <typename T>
struct TreeItem {
  int q, parent, p, u, n;
  T* Lq;
  long long ld;
  T* P;
  long long pld;
  int* cpar;
  int* info;
};

// A tree item's start: a ticket (front 0's counter 3 + the launch's class, extra bits 16-18),
// the task row at that place, the addresses, the update rows' positions into spos (threads
// tid < u), and the children's adds waited for (a block barrier either way). False: no item
// is left for this block.
template <typename T>
__device__ __forceinline__ bool tree_begin(const unsigned long long* tbl, const long long* meta,
                                           const int* tasks, int K, int lo, int hi, int extra,
                                           int* spos, int& s_row, TreeItem<T>& it) {
  T* L = reinterpret_cast<T*>(tbl[0]);
  const T* rel = reinterpret_cast<const T*>(tbl[1]);
  T* S = reinterpret_cast<T*>(tbl[3]);
  it.info = reinterpret_cast<int*>(tbl[4]);
  const long long* ml = meta + 2LL * K * (extra & 15);
  const long long* mr = meta + 2LL * K * ((extra >> 4) & 15);
  const long long* ms = meta + 2LL * K * ((extra >> 12) & 15);
  const int cls = (extra >> 16) & 7;
  const int tid = (int)threadIdx.x;
  if (tid == 0) s_row = lo + atomicAdd(reinterpret_cast<int*>(S + ms[0]) + 3 + cls, 1);
  __syncthreads();
  const int row = s_row;
  if (row >= hi) return false;
  const int* tr = tasks + (long long)row * VB_TASK_COLS;
  const int q = tr[0], parent = tr[1], u = tr[3], need = tr[4];
  it.q = q;
  it.parent = parent;
  it.p = tr[2];
  it.u = u;
  it.n = it.p + u;
  it.Lq = L + ml[q];
  it.ld = ml[K + q];
  const int pp = parent < 0 ? q : parent;
  it.P = L + ml[pp];
  it.pld = ml[K + pp];
  it.cpar = reinterpret_cast<int*>(S + ms[pp]);
  if (tid < u) spos[tid] = (int)__ldg(rel + mr[q] + tid);  // (order F, one column)
  if (need > 0) sweep_wait(reinterpret_cast<const int*>(S + ms[q]), need);
  else __syncthreads();
  return true;
}

// A tree item's end: one more child done in its parent's counter (a front without update
// rows adds nothing, and its parent does not wait for it).
template <typename T>
__device__ __forceinline__ void tree_end(const TreeItem<T>& it) {
  if (it.parent >= 0 && it.u > 0) sweep_signal(it.cpar);
}

template <typename T, bool ROW, int TXR, int TXC, int RR, int RC, int MINB>
__global__ void __launch_bounds__(TXR * TXC, MINB)
frontal_tree(const unsigned long long* tbl, const long long* meta, const int* imeta,
             const int* tasks, int K, int lo, int hi, int extra) {
  constexpr int N = TXR * RR;
  static_assert(TXC * RC == N, "the tile spans as many columns as rows");
  static_assert(TXR * TXC >= N, "a thread for each update row's position");
  __shared__ T col[2][N];
  __shared__ int spos[N];
  __shared__ int s_row;
  TreeItem<T> it;
  if (!tree_begin<T>(tbl, meta, tasks, K, lo, hi, extra, spos, s_row, it)) return;
  const int q = it.q, parent = it.parent, p = it.p, u = it.u, n = it.n;
  T* Lq = it.Lq;
  const long long ld = it.ld;
  const int tid = (int)threadIdx.x;
  const int r0 = ROW ? tid / TXC : tid % TXR, c0 = ROW ? tid % TXC : tid / TXR;
  // Tile (ia, jb) holds rows TXR ia + [0, TXR) and columns TXC jb + [0, TXC): live where some
  // of its entries are on or below the diagonal (known at compile time: the loops unroll).
#define VB_TREE_LIVE(ia, jb) ((jb) * TXC <= (ia) * TXR + TXR - 1)
  T a[RR][RC];
#pragma unroll
  for (int ia = 0; ia < RR; ++ia)
#pragma unroll
    for (int jb = 0; jb < RC; ++jb) {
      const int i = r0 + TXR * ia, j = c0 + TXC * jb;
      // children added into this front from other blocks: read through L2
      a[ia][jb] = VB_TREE_LIVE(ia, jb) && i < n && j <= i ? __ldcg(Lq + at<ROW>(i, j, ld))
                                                            : T(0);
    }
  int fail = 0;
  for (int k = 0; k < p; ++k) {
    T* c = col[k & 1];
    const int kb = k / TXC;
    if (c0 == k % TXC) {
#pragma unroll
      for (int jb = 0; jb < RC; ++jb)
        if (jb == kb) {
#pragma unroll
          for (int ia = 0; ia < RR; ++ia) {
            const int i = r0 + TXR * ia;
            if (VB_TREE_LIVE(ia, jb) && i >= k && i < n) c[i] = a[ia][jb];
          }
        }
    }
    __syncthreads();
    const T d = c[k];
    if (!(d > T(0))) {  // NaN too (uniform: every thread read the same pivot)
      fail = k + 1;
      break;
    }
    const T rs = tree_rsqrt(d);
    T li[RR], lj[RC];
#pragma unroll
    for (int ia = 0; ia < RR; ++ia) {
      const int i = r0 + TXR * ia;
      li[ia] = i > k && i < n ? c[i] * rs : T(0);
    }
#pragma unroll
    for (int jb = 0; jb < RC; ++jb) {
      const int j = c0 + TXC * jb;
      lj[jb] = j > k && j < n ? c[j] * rs : T(0);
    }
#pragma unroll
    for (int ia = 0; ia < RR; ++ia) {
      if (TXR * ia + TXR - 1 <= k || TXR * ia >= n) continue;
#pragma unroll
      for (int jb = 0; jb < RC; ++jb) {
        if (!VB_TREE_LIVE(ia, jb) || TXC * jb + TXC - 1 <= k) continue;
        a[ia][jb] -= li[ia] * lj[jb];
      }
    }
    if (c0 == k % TXC) {
#pragma unroll
      for (int jb = 0; jb < RC; ++jb)
        if (jb == kb) {
#pragma unroll
          for (int ia = 0; ia < RR; ++ia) {
            if (!VB_TREE_LIVE(ia, jb)) continue;
            const int i = r0 + TXR * ia;
            if (i == k) a[ia][jb] = isinf(d) ? d : d * rs;  // LAPACK: sqrt(inf), not inf * 0
            else if (i > k) a[ia][jb] = li[ia];
          }
        }
    }
  }
  if (fail && tid == 0) it.info[q] = fail;
#pragma unroll
  for (int ia = 0; ia < RR; ++ia)
#pragma unroll
    for (int jb = 0; jb < RC; ++jb) {
      const int i = r0 + TXR * ia, j = c0 + TXC * jb;
      if (VB_TREE_LIVE(ia, jb) && i < n && j <= i) Lq[at<ROW>(i, j, ld)] = a[ia][jb];
    }
  if (!fail && parent >= 0 && u > 0) {
    T* P = it.P;
    const long long pld = it.pld;
#pragma unroll
    for (int ia = 0; ia < RR; ++ia)
#pragma unroll
      for (int jb = 0; jb < RC; ++jb) {
        const int i = r0 + TXR * ia, j = c0 + TXC * jb;
        if (VB_TREE_LIVE(ia, jb) && j >= p && i >= j && i < n)
          atomicAdd(P + at<ROW>(spos[i - p], spos[j - p], pld), a[ia][jb]);
      }
  }
#undef VB_TREE_LIVE
  tree_end(it);
}

// frontal_tree_smem: the same task (the ticket, the wait, the info, the extend-add and the
// count are frontal_tree's), with the front in shared memory and its columns in two phases, for
// classes whose front fits (N rows, N x (N + 1) entries). frontal_tree's step costs every warp
// of its block a barrier, a broadcast and its guards whatever is left of the front (ncu: the
// 64-row class issue-bound). Here:
// 1. the p pivot columns, right-looking but only over those columns (all n rows), PB at a time
//    (a panel): warp 0 factors a panel in registers (tree_panel: pivots and entries by
//    shuffles, no barrier), then, while the other warps update the columns past the next
//    panel with this one (a rank-PB update, every load before any store), it updates the next
//    panel's columns itself and factors them (a look-ahead): one barrier a panel. A column at
//    a time (PB 1, and the first version of this kernel) cost every warp a barrier, a pivot
//    and its guards a column: 0.45 us a column in the 1000 Laplacians' 64-row class, 653 us
//    for the class; PB 4 took it to 510 us, PB 8 to 580 (warp 0's chain of 8 pivots while the
//    others wait; measured without spills, before the one-warp path: float64 at 64 rows and
//    PB 8 now spills ~570 bytes at 80 registers), H200, 2026-11-26 (docs/decisions.md#sparse-tree-smem, the
//    batch alone);
// 2. the Schur complement in one pass after it: each entry of S's lower triangle is one dot
//    product of two rows of L21, in registers, stored and added into the parent from there.
//    (Warps owning S's columns in registers over chunks of L21's columns, a broadcast serving
//    a lane's two rows, was slower: 510 -> 577 us, the whole square computed for a triangle.)
// NT threads; MINB blocks a multiprocessor (shared memory allows 6 at N = 64 in float64).
// The lower triangle's entries (i, j), i >= j, of columns [0, ncols) of an n-row front, between
// global memory (Lg, leading dimension ld, layout ROW) and the shared copy F (column-major, LD),
// CB columns (or rows, in row-major order) a warp at a time with every load before any
// store: a load after a store to shared memory may not pass it (the compiler cannot tell a
// global pointer from a shared one), and one at a time each load costs a round trip to memory.
template <bool IN, int CB, typename T, bool ROW, int LD, int NW, int RL>
__device__ __forceinline__ void tree_copy(T* F, T* Lg, long long ld, int n, int ncols, int warp,
                                          int lane) {
  // column-major: a warp's lines are columns j, its lanes rows; row-major: lines are rows i,
  // lanes columns (coalesced either way)
  const int lines = ROW ? n : ncols;
  for (int l0 = warp; l0 < lines; l0 += CB * NW) {
    T v[CB][RL];
#pragma unroll
    for (int t = 0; t < CB; ++t) {
#pragma unroll
      for (int r = 0; r < RL; ++r) {
        const int l = l0 + t * NW, x = lane + 32 * r;
        const int i = ROW ? l : x, j = ROW ? x : l;
        const bool ok = l < lines && i < n && j <= i && j < ncols;
        if (IN) v[t][r] = ok ? __ldcg(Lg + at<ROW>(i, j, ld)) : T(0);
        else v[t][r] = ok ? F[i + j * LD] : T(0);
      }
    }
#pragma unroll
    for (int t = 0; t < CB; ++t) {
#pragma unroll
      for (int r = 0; r < RL; ++r) {
        const int l = l0 + t * NW, x = lane + 32 * r;
        const int i = ROW ? l : x, j = ROW ? x : l;
        if (l < lines && i < n && j <= i && j < ncols) {
          if (IN) F[i + j * LD] = v[t][r];
          else Lg[at<ROW>(i, j, ld)] = v[t][r];
        }
      }
    }
  }
}

// A lane's entry of row i (its rows lane + 32 r) of a column held in registers, broadcast
// from the lane that holds it.
template <typename T, int RL>
__device__ __forceinline__ T tree_bcast(const T (&c)[RL], int i) {
  T v = c[0];
#pragma unroll
  for (int r = 1; r < RL; ++r) v = i >= 32 * r ? c[r] : v;
  return __shfl_sync(0xffffffffu, v, i % 32);
}

// One warp factors the panel of columns [k0, k0 + kb) held in registers (c[t][r]: column k0 + t,
// row lane + 32 r, updated by every column before k0), right-looking within the panel, pivots
// and the panel's column entries by shuffles. Each factored column is left scaled into L, its
// diagonal sqrt(d) (or inf); a failing pivot stops it, leaving that column and the later ones
// updated by the columns before it (as the one-column loop did). Returns the columns factored.
template <typename T, int PB, int RL>
__device__ __forceinline__ int tree_panel(T (&c)[PB][RL], int k0, int kb, int lane) {
  int nd = kb;
#pragma unroll
  for (int t = 0; t < PB; ++t) {
    if (t < nd) {
      const int j = k0 + t;
      const T d = tree_bcast<T, RL>(c[t], j);
      if (!(d > T(0))) {  // NaN too; uniform (every lane has the same pivot)
        nd = t;
      } else {
        // (1 / sqrt(d) on both factors, not 1 / d on one: a subnormal pivot's reciprocal is inf)
        const T rs = tree_rsqrt(d);
#pragma unroll
        for (int r = 0; r < RL; ++r) {
          const int i = lane + 32 * r;
          c[t][r] = i == j ? (isinf(d) ? d : d * rs) : c[t][r] * rs;  // LAPACK: sqrt(inf)
        }
#pragma unroll
        for (int t2 = t + 1; t2 < PB; ++t2) {
          const T ljk = tree_bcast<T, RL>(c[t], k0 + t2);
#pragma unroll
          for (int r = 0; r < RL; ++r) c[t2][r] -= c[t][r] * ljk;
        }
      }
    }
  }
  return nd;
}

// Column j of F at a lane's rows, updated with a panel's factored columns [k0, k0 + nd) (a: the
// panel's L at those rows; the columns past nd contribute nothing, their L or F entries being
// read as zero: a failed column's NaN must not reach the others through 0 * NaN), into v;
// ok false: zeros (a column past the pivots).
template <typename T, int PB, int RL, int LD>
__device__ __forceinline__ void tree_col_update(T (&v)[RL], const T* F, const T (&a)[PB][RL],
                                                int j, int k0, int nd, bool ok, int lane) {
  T l[PB];
#pragma unroll
  for (int s = 0; s < PB; ++s) l[s] = ok && s < nd ? F[j + (k0 + s) * LD] : T(0);
#pragma unroll
  for (int r = 0; r < RL; ++r) {
    T f = ok ? F[lane + 32 * r + j * LD] : T(0);
#pragma unroll
    for (int s = 0; s < PB; ++s) f -= a[s][r] * l[s];
    v[r] = f;
  }
}

template <typename T, bool ROW, int N, int NT, int MINB, int PB>
__global__ void __launch_bounds__(NT, MINB)
frontal_tree_smem(const unsigned long long* tbl, const long long* meta, const int* imeta,
                  const int* tasks, int K, int lo, int hi, int extra) {
  static_assert(NT >= N && NT % 32 == 0, "a thread for each update row's position; warps");
  static_assert(N % 32 == 0, "a lane's rows lane + 32 r cover the front's array exactly");
  constexpr int LD = N + 1;  // (odd in T: a column's and a row's entries in distinct banks)
  constexpr int NW = NT / 32;
  constexpr int RL = (N + 31) / 32;  // rows a lane in the panel's columns
  // the front, in dynamic shared memory (N * LD entries: 96 rows in float64 take 74 KB, past
  // the 48 KB of static shared memory)
  extern __shared__ __align__(16) unsigned char tree_smem_raw[];
  T* F = reinterpret_cast<T*>(tree_smem_raw);
  __shared__ int spos[N];
  __shared__ int s_row;
  TreeItem<T> it;
  if (!tree_begin<T>(tbl, meta, tasks, K, lo, hi, extra, spos, s_row, it)) return;
  const int q = it.q, p = it.p, u = it.u, n = it.n;
  T* Lq = it.Lq;
  const long long ld = it.ld;
  const int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32;
  // the lower triangle (children added into this front from other blocks: read through L2)
  tree_copy<true, 4, T, ROW, LD, NW, RL>(F, Lq, ld, n, n, warp, lane);
  __syncthreads();
  // the pivot columns (see above); s_nd: the columns a panel factored (two: warp 0 writes the
  // next panel's while the others read this one's)
  __shared__ int s_nd[2];
  constexpr int TN = NW > 1 ? NW - 1 : 1;  // the warps updating the columns past a panel
  const int TW = NW > 1 ? warp - 1 : 0;  // this one's place among them
  int done = p, fail = 0;
  // warp 0: the first panel
  if (warp == 0 && p > 0) {
    const int kb = min(PB, p);
    T c[PB][RL];
#pragma unroll
    for (int t = 0; t < PB; ++t)
#pragma unroll
      for (int r = 0; r < RL; ++r) c[t][r] = t < kb ? F[lane + 32 * r + t * LD] : T(0);
    const int nd = tree_panel<T, PB, RL>(c, 0, kb, lane);
#pragma unroll
    for (int t = 0; t < PB; ++t)
#pragma unroll
      for (int r = 0; r < RL; ++r) {
        const int i = lane + 32 * r;
        if (t < kb && i >= t && i < n) F[i + t * LD] = c[t][r];
      }
    if (lane == 0) s_nd[0] = nd;
  }
  __syncthreads();
  for (int k0 = 0, b = 0; k0 < p; k0 += PB, b ^= 1) {
    const int kb = min(PB, p - k0), nd = s_nd[b], kn = k0 + kb;
    if (kn < p && nd > 0) {
      // The panel's L at this lane's rows and the columns' (both zero past the columns
      // factored: a failed column's NaN must not reach the later ones through 0 * NaN).
      T a[PB][RL];
#pragma unroll
      for (int t = 0; t < PB; ++t)
#pragma unroll
        for (int r = 0; r < RL; ++r) a[t][r] = t < nd ? F[lane + 32 * r + (k0 + t) * LD] : T(0);
      if (warp == 0) {
        // look-ahead: the next panel's columns, updated and (unless this panel failed)
        // factored in registers while the other warps update the rest
        const int kb2 = min(PB, p - kn);
        T c[PB][RL];
#pragma unroll
        for (int t = 0; t < PB; ++t)
          tree_col_update<T, PB, RL, LD>(c[t], F, a, kn + t, k0, nd, t < kb2, lane);
        const int nd2 = nd == kb ? tree_panel<T, PB, RL>(c, kn, kb2, lane) : 0;
#pragma unroll
        for (int t = 0; t < PB; ++t)
#pragma unroll
          for (int r = 0; r < RL; ++r) {
            const int i = lane + 32 * r;
            if (t < kb2 && i >= kn + t && i < n) F[i + (kn + t) * LD] = c[t][r];
          }
        if (lane == 0) s_nd[b ^ 1] = nd2;
      }
      if (NW == 1 || warp > 0) {
        // the columns after the next panel (the other warps'; one warp's own after its
        // look-ahead), four at a time a warp, every load before any store (a load may not
        // pass a store to shared memory: see tree_copy)
        for (int j0 = kn + PB + TW; j0 < p; j0 += 4 * TN) {
          T f[4][RL];
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            const int j = j0 + t * TN;
            tree_col_update<T, PB, RL, LD>(f[t], F, a, j, k0, nd, j < p, lane);
          }
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            const int j = j0 + t * TN;
#pragma unroll
            for (int r = 0; r < RL; ++r) {
              const int i = lane + 32 * r;
              if (j < p && i >= j && i < n) F[i + j * LD] = f[t][r];
            }
          }
        }
      }
    }
    __syncthreads();
    if (nd < kb) {
      done = k0 + nd;
      fail = done + 1;
      break;
    }
  }
  if (fail && tid == 0) it.info[q] = fail;
  // L (the pivot columns; after a failure, what there is)
  tree_copy<false, 4, T, ROW, LD, NW, RL>(F, Lq, ld, n, p, warp, lane);
  // S = F22 - L21 L21^T, an entry a thread at a time; stored, and added into the parent
  T* P = it.P;
  const long long pld = it.pld;
  const bool add = !fail && it.parent >= 0;
  for (int e = tid; e < u * u; e += NT) {
    const int i = ROW ? e / u : e % u, j = ROW ? e % u : e / u;
    if (j > i) continue;
    // (after a failure: updated by the columns factored, as frontal_tree and the CPU leave it)
    T s = F[(p + i) + (p + j) * LD];
    const T* ri = F + p + i;
    const T* rj = F + p + j;
#pragma unroll 4
    for (int c = 0; c < done; ++c) s -= ri[c * LD] * rj[c * LD];
    Lq[at<ROW>(p + i, p + j, ld)] = s;
    if (add) atomicAdd(P + at<ROW>(spos[i], spos[j], pld), s);
  }
  tree_end(it);
}

}  // namespace vb

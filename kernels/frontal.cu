// vbatch: the frontal kernel family (vbatch.sparse.frontal; launcher: frontal_cuda.py).
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

// frontal_rhs: the solve's exchange of right-hand-side rows between a front and its parent.
// A task row is (child, parent, p, u, r); X is each front's n x r block (tbl[2]); the block's
// y index walks chunks of 1024 of the u x r entries. ADD (forward): X_parent[rel[i], c] +=
// X[p + i, c] (siblings may share a launch: atomicAdd); otherwise (backward): X[p + i, c] =
// X_parent[rel[i], c]. extra: bits 0-3 the plan slot of x, bits 4-7 that of rel.
template <typename T, bool ROW, bool ADD>
__global__ void __launch_bounds__(256)
frontal_rhs(const unsigned long long* tbl, const long long* meta, const int* imeta,
            const int* tasks, int K, int lo, int hi, int extra) {
  const int row = lo + (int)blockIdx.x;
  if (row >= hi) return;
  const int* r = tasks + (long long)row * VB_TASK_COLS;
  const int q = r[0], parent = r[1], p = r[2], u = r[3], nr = r[4];
  T* X = reinterpret_cast<T*>(tbl[2]);
  const T* rel = reinterpret_cast<const T*>(tbl[1]);
  const long long* mx = meta + 2LL * K * (extra & 15);
  const long long* mr = meta + 2LL * K * ((extra >> 4) & 15);
  T* C = X + mx[q];
  const long long ld = mx[K + q];
  T* P = X + mx[parent];
  const long long pld = mx[K + parent];
  const T* pos = rel + mr[q];
  const long long total = (long long)u * nr;
  for (long long e0 = (long long)blockIdx.y * 1024; e0 < total; e0 += (long long)gridDim.y * 1024) {
    for (int e = threadIdx.x; e < 1024; e += 256) {
      const long long idx = e0 + e;
      if (idx >= total) break;
      // consecutive threads along the contiguous dimension of X
      const int i = ROW ? (int)(idx / nr) : (int)(idx % u);
      const int c = ROW ? (int)(idx % nr) : (int)(idx / u);
      const int pi = (int)pos[i];
      if (ADD) {
        atomicAdd(P + at<ROW>(pi, c, pld), C[at<ROW>(p + i, c, ld)]);
      } else {
        C[at<ROW>(p + i, c, ld)] = P[at<ROW>(pi, c, pld)];
      }
    }
  }
}

}  // namespace vb

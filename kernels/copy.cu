// vbatch: gather a list of device arrays into a packed buffer, or scatter it back, in one launch.
//
// Matrix b (m x n) is copied by the blocks (b, y) for y < gridDim.y, each taking every
// gridDim.y-th run of 256 elements in the packed buffer's order (rows of a row-major buffer,
// columns of a column-major one), so a large matrix gets many blocks and a small one exits
// early. The host picks the packed order that matches the caller's arrays, so both sides are
// read and written along their unit stride. to_packed = 1 gathers, 0 scatters. The table `tab`
// holds 7 rows of k int64: the caller's address, its row and column strides (elements), the
// packed offset and leading dimension, m and n. Compiled behind the generated preamble and
// vbatched.cuh.
//
// put moves single elements through an index (Backend.assemble: a sparse factor's values into
// its fronts), a grid-stride loop of 256-thread blocks.

namespace vb {

template <typename T, typename I>
__device__ __forceinline__ void copy_one(T* user, long long urs, long long ucs, T* pk,
                                         long long pld, I m, I n, I total, int row_major,
                                         int to_packed) {
  const I step = (I)gridDim.y * blockDim.x;
  for (I e = (I)blockIdx.y * blockDim.x + threadIdx.x; e < total; e += step) {
    I r, c;
    if (row_major) {
      r = e / n;
      c = e - r * n;
    } else {
      c = e / m;
      r = e - c * m;
    }
    const long long pi = row_major ? (long long)r * pld + c : (long long)r + (long long)c * pld;
    const long long ui = (long long)r * urs + (long long)c * ucs;
    if (to_packed) pk[pi] = user[ui];
    else user[ui] = pk[pi];
  }
}

template <typename T>
__global__ void __launch_bounds__(256)
copy_matrices(const long long* tab, T* packed, int k, int row_major, int to_packed) {
  const int b = blockIdx.x;
  if (b >= k) return;
  const long long m = tab[5 * k + b], n = tab[6 * k + b];
  const long long total = m * n;
  if ((long long)blockIdx.y * blockDim.x >= total) return;
  T* user = reinterpret_cast<T*>(tab[b]);
  T* pk = packed + tab[3 * k + b];
  const long long urs = tab[k + b], ucs = tab[2 * k + b], pld = tab[4 * k + b];
  // (32-bit index arithmetic where the matrix allows it, the loop's last step included: the
  // divisions are most of the work)
  if (total + (long long)gridDim.y * blockDim.x <= 0x7fffffffLL)
    copy_one<T, int>(user, urs, ucs, pk, pld, (int)m, (int)n, (int)total, row_major, to_packed);
  else
    copy_one<T, long long>(user, urs, ucs, pk, pld, m, n, total, row_major, to_packed);
}

// out[at[i]] = v[i].
template <typename T>
__global__ void __launch_bounds__(256)
put(const T* v, const long long* at, long long total, T* out) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < total; i += gridDim.x * 256LL)
    out[at[i]] = v[i];
}

}  // namespace vb

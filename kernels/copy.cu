// vbatch: gather a list of device arrays into a packed buffer, or scatter it back, in one launch.
//
// Block b copies matrix b (m[b] x n[b]) between the caller's array (any strides, its address in
// ptrs) and the packed buffer (offset and leading dimension, row- or column-major). to_packed = 1
// gathers, 0 scatters. Compiled behind the generated preamble and vbatched.cuh.

namespace vb {

template <typename T>
__global__ void __launch_bounds__(256)
copy_matrices(const long long* ptrs, const long long* rs, const long long* cs, T* packed,
              const long long* off, const long long* ld, const int* m, const int* n, int k,
              int row_major, int to_packed) {
  const int b = blockIdx.x;
  if (b >= k) return;
  const int mb = m[b], nb = n[b];
  if (mb == 0 || nb == 0) return;
  T* user = reinterpret_cast<T*>(ptrs[b]);
  const long long urs = rs[b], ucs = cs[b], pld = ld[b];
  T* pk = packed + off[b];
  for (int r = threadIdx.y; r < mb; r += blockDim.y)
    for (int c = threadIdx.x; c < nb; c += blockDim.x) {
      const long long pi = row_major ? (long long)r * pld + c : r + (long long)c * pld;
      const long long ui = (long long)r * urs + (long long)c * ucs;
      if (to_packed) pk[pi] = user[ui];
      else user[ui] = pk[pi];
    }
}

}  // namespace vb

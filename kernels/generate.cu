// vbatch: test and benchmark batches generated on the device.
//
// spd_fill writes k diagonally dominant SPD matrices into a packed buffer in one launch (block b
// fills matrix b): off-diagonal entries are a hash of (seed, b, min(r, c), max(r, c)) mapped to
// [-1, 1], so the matrix is symmetric by construction, and the diagonal is n, so it is SPD by
// Gershgorin with condition number below 2n. The same numbers as ops/generate.py are not
// promised; the same distribution of matrices is.

namespace vb {

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <typename T>
__global__ void __launch_bounds__(256)
spd_fill(T* data, const long long* off, const long long* ld, const int* n, int k, int row_major,
         unsigned long long seed) {
  const int b = blockIdx.x;
  if (b >= k) return;
  const int nb = n[b];
  const long long l = ld[b];
  T* a = data + off[b];
  const unsigned long long base = splitmix64(seed ^ splitmix64((unsigned long long)b));
  for (int r = threadIdx.y; r < nb; r += blockDim.y)
    for (int c = threadIdx.x; c < nb; c += blockDim.x) {
      T v;
      if (r == c) {
        v = T(nb);
      } else {
        const unsigned long long lo = r < c ? r : c, hi = r < c ? c : r;
        const unsigned long long h = splitmix64(base ^ (lo << 32 | hi));
        v = T(2.0 * ((double)(h >> 11) * (1.0 / 9007199254740992.0)) - 1.0);
      }
      a[row_major ? (long long)r * l + c : r + (long long)c * l] = v;
    }
}

}  // namespace vb

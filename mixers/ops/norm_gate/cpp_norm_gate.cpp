// RMSNorm over groups of channels, times a weight and a silu gate (mixers/ops/norm_gate), in one pass over each row
// on the CPU, forward and backward:
//
//     y = x rstd w silu(z),    rstd = 1 / sqrt(mean(x^2) + eps) over each group of S channels of a row
//
// As PyTorch ops the forward was eight passes over (R, C) and its backward about seventeen, each with a fixed cost
// per call (mamba2 and gla at the micro preset, where a row is 64 channels).
//
// Plain C++ on raw pointers, built and loaded by mixers/ops/cpu_kernels.py. x and z are (R, C) at any row stride
// with their channels adjacent; w (S,) is the same for every group (C = G S); y, dy, dx, dz (R, C) contiguous. Work
// is split over runs of rows; the inner loops run over a group's channels, so they vectorise for any S. The
// backward recomputes rstd and silu(z) from x and z (a group's mean square is one more pass over data it reads
// anyway; nothing is stored between the two), and adds the weight's gradient into a slice per thread (part,
// (threads, S), zeroed by the caller, which sums it).
//
// Backward, with n = x rstd and s = silu(z): dw += dy s n, dz = dy n w silu'(z), and through the norm
// dx = rstd (g - n mean(g n)) with g = dy s w; silu'(z) = sigmoid(z) (1 + z (1 - sigmoid(z))).
#include <cmath>
#include <cstdint>

#include "../parallel_items.h"
#include "../vector_lanes.h"

namespace {

constexpr int64_t kRows = 32;  // rows per work item

struct Shape {
  int64_t rows, groups, size;  // R, G, S
  int64_t channels() const { return groups * size; }
  int64_t items() const { return (rows + kRows - 1) / kRows; }
};

// The rows of work item `item`: [first, end).
inline void rows_of(const Shape& s, int64_t item, int64_t* first, int64_t* end) {
  *first = item * kRows;
  *end = *first + kRows < s.rows ? *first + kRows : s.rows;
}

template <class T>
inline T mean_square(const T* __restrict x, int64_t n) {
  T sum = T(0);
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += x[j] * x[j];
  return sum / T(n);
}

template <class T>
void forward(const Shape& s, const T* x, int64_t x_row, const T* z, int64_t z_row, const T* w, T eps, T* y,
             int threads) {
  const int64_t S = s.size, C = s.channels();
  parallel_items(s.items(), threads, [&](int64_t item, int) {
    int64_t first, end;
    rows_of(s, item, &first, &end);
    for (int64_t r = first; r < end; ++r) {
      for (int64_t g = 0; g < s.groups; ++g) {
        const T* __restrict xg = x + r * x_row + g * S;
        const T* __restrict zg = z + r * z_row + g * S;
        T* __restrict yg = y + r * C + g * S;
        const T inv = T(1) / std::sqrt(mean_square(xg, S) + eps);
#pragma omp simd
        for (int64_t j = 0; j < S; ++j) yg[j] = xg[j] * inv * w[j] * silu_lane(zg[j]);
      }
    }
  });
}

template <class T>
void backward(const Shape& s, const T* x, int64_t x_row, const T* z, int64_t z_row, const T* w, T eps, const T* dy,
              T* dx, T* dz, T* part, int threads) {
  const int64_t S = s.size, C = s.channels();
  parallel_items(s.items(), threads, [&](int64_t item, int thread) {
    T* __restrict dw = part + thread * S;
    int64_t first, end;
    rows_of(s, item, &first, &end);
    for (int64_t r = first; r < end; ++r) {
      for (int64_t g = 0; g < s.groups; ++g) {
        const T* __restrict xg = x + r * x_row + g * S;
        const T* __restrict zg = z + r * z_row + g * S;
        const T* __restrict dyg = dy + r * C + g * S;
        T* __restrict dxg = dx + r * C + g * S;  // holds g = dy s w until the second loop
        T* __restrict dzg = dz + r * C + g * S;
        const T inv = T(1) / std::sqrt(mean_square(xg, S) + eps);
        T dot = T(0);
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < S; ++j) {
          const T n = xg[j] * inv, sig = sigmoid_lane(zg[j]), gate = zg[j] * sig;
          dw[j] += dyg[j] * gate * n;
          dzg[j] = dyg[j] * n * w[j] * sig * (T(1) + zg[j] * (T(1) - sig));
          const T gn = dyg[j] * gate * w[j];
          dxg[j] = gn;
          dot += gn * n;
        }
        const T mean = dot / T(S);
#pragma omp simd
        for (int64_t j = 0; j < S; ++j) dxg[j] = inv * (dxg[j] - xg[j] * inv * mean);
      }
    }
  });
}

}  // namespace

extern "C" {

int mixerbench_norm_gate_abi_version() { return 1; }

#define MIXERBENCH_NORM_GATE_ENTRY(T, suffix)                                                                        \
  void mixerbench_norm_gate_fwd_##suffix(int64_t rows, int64_t groups, int64_t size, const T* x, int64_t x_row,     \
                                         const T* z, int64_t z_row, const T* w, double eps, T* y, int threads) {     \
    forward<T>(Shape{rows, groups, size}, x, x_row, z, z_row, w, T(eps), y, threads);                              \
  }                                                                                                                  \
  void mixerbench_norm_gate_bwd_##suffix(int64_t rows, int64_t groups, int64_t size, const T* x, int64_t x_row,     \
                                         const T* z, int64_t z_row, const T* w, double eps, const T* dy, T* dx,      \
                                         T* dz, T* part, int threads) {                                              \
    backward<T>(Shape{rows, groups, size}, x, x_row, z, z_row, w, T(eps), dy, dx, dz, part, threads);               \
  }

MIXERBENCH_NORM_GATE_ENTRY(float, f32)
MIXERBENCH_NORM_GATE_ENTRY(double, f64)

}  // extern "C"

// The depthwise conv along time-major tokens (mixers/ops/token_conv) in one pass over memory on the CPU: the
// forward, and the weight's gradient (the input's gradient is the forward with the taps flipped, reaching the
// other way). As PyTorch ops the conv was a padded copy and K multiply-adds, each a pass over (B, L, C).
//
// Plain C++ on raw pointers, built and loaded by mixers/ops/cpu_kernels.py. x (B, L, C) at any batch and time
// strides with its channels adjacent; taps (K, C) contiguous (the weight transposed, so a tap's channels are
// adjacent too); out and grad (B, L, C) contiguous. Work is split over (sequence, run of steps); the inner loops
// run over channels, so they vectorise for any C. out[b, t, c] = bias[c] + sum_k taps[k, c] x[b, t - left + k, c],
// taps reaching outside the sequence skipped (zero padding); then, while the row is in cache rather than in a pass
// of its own, silu(out) (Mamba's activation after its conv) or, for its backward, grad * silu'(out) (the conv
// recomputed, never stored).
#include <cstdint>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../vector_lanes.h"

namespace {

constexpr int64_t kSteps = 32;  // steps per work item

struct Shape {
  int64_t batch, length, channels, width, left;
  int64_t runs() const { return (length + kSteps - 1) / kSteps; }
  int64_t items() const { return batch * runs(); }
};

inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;  // built without OpenMP the loops below run on one thread
#endif
}

// What becomes of each output row: nothing, silu, or the gradient through silu of `grad`'s row.
enum Activation : int { kNone = 0, kSilu = 1, kSiluGrad = 2 };

template <class T>
void forward(const Shape& s, const T* x, int64_t sb, int64_t st, const T* taps, const T* bias, Activation act,
             const T* grad, T* out, int threads) {
  const int64_t C = s.channels;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t item = 0; item < s.items(); ++item) {
    const int64_t b = item / s.runs(), t0 = (item % s.runs()) * kSteps;
    const int64_t t1 = t0 + kSteps < s.length ? t0 + kSteps : s.length;
    for (int64_t t = t0; t < t1; ++t) {
      T* __restrict o = out + (b * s.length + t) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = bias ? bias[c] : T(0);
      for (int64_t k = 0; k < s.width; ++k) {
        const int64_t src = t - s.left + k;
        if (src < 0 || src >= s.length) continue;
        const T* __restrict xr = x + b * sb + src * st;
        const T* __restrict w = taps + k * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] += w[c] * xr[c];
      }
      if (act == kSilu) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = silu_lane(o[c]);
      } else if (act == kSiluGrad) {
        const T* __restrict g = grad + (b * s.length + t) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const T sig = sigmoid_lane(o[c]);
          o[c] = g[c] * sig * (T(1) + o[c] * (T(1) - sig));
        }
      }
    }
  }
}

// dweight[k, c] = sum_{b, t} grad[b, t, c] x[b, t - left + k, c], each thread adding into its own (K, C) slice of
// part (threads, K, C, zeroed by the caller), which the caller sums.
template <class T>
void weight_grad(const Shape& s, const T* x, int64_t sb, int64_t st, const T* grad, T* part, int threads) {
  const int64_t C = s.channels;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t item = 0; item < s.items(); ++item) {
    const int64_t b = item / s.runs(), t0 = (item % s.runs()) * kSteps;
    const int64_t t1 = t0 + kSteps < s.length ? t0 + kSteps : s.length;
    T* acc = part + static_cast<int64_t>(thread_id()) * s.width * C;
    for (int64_t t = t0; t < t1; ++t) {
      const T* __restrict g = grad + (b * s.length + t) * C;
      for (int64_t k = 0; k < s.width; ++k) {
        const int64_t src = t - s.left + k;
        if (src < 0 || src >= s.length) continue;
        const T* __restrict xr = x + b * sb + src * st;
        T* __restrict a = acc + k * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) a[c] += g[c] * xr[c];
      }
    }
  }
}

}  // namespace

extern "C" {

int mixerbench_token_conv_abi_version() { return 2; }

#define MIXERBENCH_TOKEN_CONV_ENTRY(T, suffix)                                                                 \
  void mixerbench_token_conv_fwd_##suffix(int64_t batch, int64_t length, int64_t channels, int64_t width,     \
                                          int64_t left, const T* x, int64_t sb, int64_t st, const T* taps,      \
                                          const T* bias, int act, const T* grad, T* out, int threads) {        \
    forward<T>(Shape{batch, length, channels, width, left}, x, sb, st, taps, bias, static_cast<Activation>(act), \
               grad, out, threads);                                                                            \
  }                                                                                                            \
  void mixerbench_token_conv_dweight_##suffix(int64_t batch, int64_t length, int64_t channels, int64_t width, \
                                              int64_t left, const T* x, int64_t sb, int64_t st, const T* grad,  \
                                              T* part, int threads) {                                          \
    weight_grad<T>(Shape{batch, length, channels, width, left}, x, sb, st, grad, part, threads);                \
  }

MIXERBENCH_TOKEN_CONV_ENTRY(float, f32)
MIXERBENCH_TOKEN_CONV_ENTRY(double, f64)

}  // extern "C"

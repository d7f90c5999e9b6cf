// The depthwise conv along time-major tokens (mixers/ops/token_conv) on the CPU: the forward in one pass over memory,
// and the whole backward in another. As PyTorch ops the conv was a padded copy and K multiply-adds, each a pass over
// (B, L, C).
//
// Plain C++ on raw pointers, built and loaded by mixers/ops/cpu_kernels.py. x (B, L, C) at any batch and time
// strides with its channels adjacent; taps (K, C) contiguous (the weight transposed, so a tap's channels are
// adjacent too); out, grad and dx (B, L, C) contiguous. Work is split over (sequence, run of steps); the inner loops
// run over channels, so they vectorise for any C. out[b, t, c] = bias[c] + sum_k taps[k, c] x[b, t - left + k, c],
// taps reaching outside the sequence skipped (zero padding); then, while the row is in cache rather than in a pass
// of its own, silu(out) where asked (Mamba's activation after its conv; its backward recomputes out, never stored).
#include <cstdint>
#include <vector>
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

// Row t of sequence b of the conv's output, before any activation, into o (C values).
template <class T>
inline void conv_row(const Shape& s, const T* x, int64_t sb, int64_t st, const T* taps, const T* bias, int64_t b,
                     int64_t t, T* __restrict o) {
  const int64_t C = s.channels;
  for (int64_t c = 0; c < C; ++c) o[c] = bias ? bias[c] : T(0);
  for (int64_t k = 0; k < s.width; ++k) {
    const int64_t src = t - s.left + k;
    if (src < 0 || src >= s.length) continue;
    const T* __restrict xr = x + b * sb + src * st;
    const T* __restrict w = taps + k * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] += w[c] * xr[c];
  }
}

template <class T>
void forward(const Shape& s, const T* x, int64_t sb, int64_t st, const T* taps, const T* bias, bool silu, T* out,
             int threads) {
  const int64_t C = s.channels;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t item = 0; item < s.items(); ++item) {
    const int64_t b = item / s.runs(), t0 = (item % s.runs()) * kSteps;
    const int64_t t1 = t0 + kSteps < s.length ? t0 + kSteps : s.length;
    for (int64_t t = t0; t < t1; ++t) {
      T* __restrict o = out + (b * s.length + t) * C;
      conv_row(s, x, sb, st, taps, bias, b, t, o);
      if (silu) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = silu_lane(o[c]);
      }
    }
  }
}

// The whole backward in one pass per (sequence, run of steps), where it was three passes (the gradient through silu
// at the recomputed output, dx as the conv of that with the taps flipped, the weight's gradient) and a sum for the
// bias. g, the gradient at the conv's output (through silu where `silu`, the output recomputed), for the run's
// steps and the K - 1 around them that reach into it (a halo each run recomputes, so runs stay independent), goes
// to the thread's rows of a scratch buffer; then dx[s] = sum_k taps[k] g[s + left - k] for the run's steps, and
// their g x (the weight's gradient) and g (the bias's) are added into the thread's slices of part_w (threads, K,
// C) and part_b (threads, C), zeroed by the caller, which sums them.
template <class T>
void backward(const Shape& s, const T* x, int64_t sb, int64_t st, const T* taps, const T* bias, bool silu,
              const T* grad, T* dx, T* part_w, T* part_b, int threads) {
  const int64_t C = s.channels, K = s.width, before = K - 1 - s.left;
  std::vector<T> scratch(static_cast<size_t>(threads < 1 ? 1 : threads) * (kSteps + K) * C);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t item = 0; item < s.items(); ++item) {
    const int64_t b = item / s.runs(), t0 = (item % s.runs()) * kSteps;
    const int64_t t1 = t0 + kSteps < s.length ? t0 + kSteps : s.length;
    const int64_t g0 = t0 - before > 0 ? t0 - before : 0;  // g's rows: g0 .. g1 - 1
    const int64_t g1 = t1 + s.left < s.length ? t1 + s.left : s.length;
    const int tid = thread_id();
    T* gbuf = scratch.data() + static_cast<int64_t>(tid) * (kSteps + K) * C;
    for (int64_t t = g0; t < g1; ++t) {
      T* __restrict o = gbuf + (t - g0) * C;
      const T* __restrict gr = grad + (b * s.length + t) * C;
      if (!silu) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = gr[c];
        continue;
      }
      conv_row(s, x, sb, st, taps, bias, b, t, o);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const T sig = sigmoid_lane(o[c]);
        o[c] = gr[c] * sig * (T(1) + o[c] * (T(1) - sig));
      }
    }
    T* __restrict pw = part_w + static_cast<int64_t>(tid) * K * C;
    T* __restrict pb = part_b + static_cast<int64_t>(tid) * C;
    for (int64_t t = t0; t < t1; ++t) {
      T* __restrict d = dx + (b * s.length + t) * C;
      const T* __restrict g = gbuf + (t - g0) * C;
      for (int64_t c = 0; c < C; ++c) d[c] = T(0);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t from = t + s.left - k;  // the output step whose tap k read step t
        if (from >= 0 && from < s.length) {
          const T* __restrict gf = gbuf + (from - g0) * C;
          const T* __restrict w = taps + k * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) d[c] += w[c] * gf[c];
        }
        const int64_t src = t - s.left + k;  // the input step tap k read for output t
        if (src >= 0 && src < s.length) {
          const T* __restrict xr = x + b * sb + src * st;
          T* __restrict a = pw + k * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) a[c] += g[c] * xr[c];
        }
      }
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) pb[c] += g[c];
    }
  }
}

}  // namespace

extern "C" {

int mixerbench_token_conv_abi_version() { return 3; }

#define MIXERBENCH_TOKEN_CONV_ENTRY(T, suffix)                                                                 \
  void mixerbench_token_conv_fwd_##suffix(int64_t batch, int64_t length, int64_t channels, int64_t width,     \
                                          int64_t left, const T* x, int64_t sb, int64_t st, const T* taps,      \
                                          const T* bias, int silu, T* out, int threads) {                       \
    forward<T>(Shape{batch, length, channels, width, left}, x, sb, st, taps, bias, silu != 0, out, threads);    \
  }                                                                                                            \
  void mixerbench_token_conv_bwd_##suffix(int64_t batch, int64_t length, int64_t channels, int64_t width,     \
                                          int64_t left, const T* x, int64_t sb, int64_t st, const T* taps,      \
                                          const T* bias, int silu, const T* grad, T* dx, T* part_w, T* part_b,  \
                                          int threads) {                                                       \
    backward<T>(Shape{batch, length, channels, width, left}, x, sb, st, taps, bias, silu != 0, grad, dx, part_w, \
                part_b, threads);                                                                              \
  }

MIXERBENCH_TOKEN_CONV_ENTRY(float, f32)
MIXERBENCH_TOKEN_CONV_ENTRY(double, f64)

}  // extern "C"

// The selective scan's recurrence as a compiled CPU loop (impl `cpp_loop`), forward and backward.
//
// Plain C++ on raw pointers, no torch headers: it builds in about a second with any C++17 compiler, and
// cpp_scan.py calls it through ctypes. Threads are std::threads, sized by the caller from torch's own count,
// so no second OpenMP runtime spins beside torch's.
//
// Layouts (row-major, contiguous): u, delta, y, dy, du, ddelta (Bt, D, L) as the model has them (no transposes:
// a block reads its 16 channels at step t from 16 cache lines that the next steps reuse); A (D, N); Bm, Cm
// (Bt, G, L, N), B and C transposed by the caller so a step reads N adjacent values (G = 1 for one B, C per
// sequence). delta is the effective step (bias and softplus applied by the caller); y is sum_n C_t[n] h_t[n] only
// (the caller adds D u and the z gate).
//
// Work is split over (sequence b, block of 16 channels); every inner loop runs over the block's channels, so it
// vectorises for any N (vmamba's N = 1 included) and reads each step's inputs contiguously. The float exp is a
// polynomial (Cephes' expf, ~1 ulp) written so the compiler vectorises it without -ffast-math; double uses
// std::exp (the float64 path exists for tight tests).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace {

__attribute__((always_inline)) inline float exp_lane(float x) {
  // exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln2 / 2. Below -87.3 the result is below float's smallest
  // normal (1.2e-38) and is flushed to 0; above 88.7 it is clamped to finite (the scan's exponents are <= 0).
  const float hi = 88.7f, lo = -87.3f;
  float xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer
  float n = (xc * 1.44269504088896341f + shifter) - shifter;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  float out = p * scale;
  out = x < lo ? 0.0f : out;
  return x != x ? x : out;  // NaN in, NaN out
}

inline double exp_lane(double x) { return std::exp(x); }

// Channels per work item: the lanes of every vector loop, so any N (vmamba's 1 included) fills whole vectors.
constexpr int64_t kBlock = 16;
// Time steps whose states the backward recomputes and holds at once (a (kChunk, N, kBlock) buffer).
constexpr int64_t kChunk = 64;

// groups: B and C are (Bt, G, L, N) and channel d reads group d / (D / G) (mamba-ssm's "variable B" groups; vmamba
// stacks its four directions so). Blocks never straddle a group.
struct Shape {
  int64_t batch, channels, length, d_state, groups;
  int64_t group_channels() const { return channels / groups; }
  int64_t blocks_per_group() const { return (group_channels() + kBlock - 1) / kBlock; }
  int64_t blocks() const { return groups * blocks_per_group(); }
};

// Calls fn(item, thread) for items 0..count-1 on `threads` threads. Items are taken from a shared counter, not
// dealt out in advance: on a busy machine a thread that is not scheduled leaves its share to the others.
template <class Fn>
void parallel_items(int64_t count, int threads, Fn fn) {
  if (threads <= 1 || count <= 1) {
    for (int64_t i = 0; i < count; ++i) fn(i, 0);
    return;
  }
  int used = static_cast<int>(threads < count ? threads : count);
  std::atomic<int64_t> next{0};
  auto work = [&](int tid) {
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) fn(i, tid);
  };
  std::vector<std::thread> pool;
  pool.reserve(used - 1);
  for (int t = 1; t < used; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
}

// One state n over a block's channels: h <- exp(dt A_n) h + du b_n, the decays kept (KeepDecay), y += c_n h
// (ReadOut). A free function on restrict pointers with compile-time flags, so the loop vectorises.
template <class T, bool KeepDecay, bool ReadOut>
inline void update_lanes(const T* __restrict dt, const T* __restrict An, const T* __restrict du, T bn, T cn,
                         T* __restrict hn, T* __restrict an, T* __restrict y) {
#pragma omp simd
  for (int64_t c = 0; c < kBlock; ++c) {
    const T decay = exp_lane(dt[c] * An[c]);
    const T hv = decay * hn[c] + du[c] * bn;
    hn[c] = hv;
    if constexpr (KeepDecay) an[c] = decay;
    if constexpr (ReadOut) y[c] += hv * cn;
  }
}

// One work item: sequence b, channels d0 .. d0 + nd - 1 (nd <= kBlock; lanes past nd hold zeros and are never
// written back). Inputs are time-major so a step reads the block's channels contiguously.
template <class T>
struct Block {
  const Shape& s;
  int64_t b, g, d0, nd;
  T A[kBlock * 64];  // A transposed to (N, kBlock); N <= 64 here, larger N takes the heap copy below
  std::vector<T> A_heap;
  T* At;

  Block(const Shape& shape, int64_t item, const T* A_in) : s(shape) {
    b = item / s.blocks();
    const int64_t in_batch = item % s.blocks(), gc = s.group_channels();
    g = in_batch / s.blocks_per_group();
    const int64_t first = (in_batch % s.blocks_per_group()) * kBlock;  // within the group
    d0 = g * gc + first;
    nd = first + kBlock <= gc ? kBlock : gc - first;
    const int64_t N = s.d_state;
    if (N > 64) A_heap.assign(N * kBlock, T(0));
    At = N > 64 ? A_heap.data() : A;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < kBlock; ++c) At[n * kBlock + c] = c < nd ? A_in[(d0 + c) * N + n] : T(0);
  }
  // Index of (b, d0 + c, t) in a (Bt, D, L) tensor is row(t) + c * s.length.
  int64_t row(int64_t t) const { return (b * s.channels + d0) * s.length + t; }
  int64_t bc(int64_t t) const { return ((b * s.groups + g) * s.length + t) * s.d_state; }  // into (Bt, G, L, N)

  // The block's dt and dt * u at step t, zero past nd.
  void load(const T* u, const T* delta, int64_t t, T* dt, T* du) const {
    const T* ur = u + row(t);
    const T* dr = delta + row(t);
    const int64_t L = s.length;
    for (int64_t c = 0; c < kBlock; ++c) {
      dt[c] = c < nd ? dr[c * L] : T(0);
      du[c] = c < nd ? dr[c * L] * ur[c * L] : T(0);
    }
  }

  // h <- exp(dt A) h + du B_t for all N states; KeepDecay: the decays go to a; ReadOut: y = sum_n C_t[n] h[n].
  // Template flags, not branches, so the inner loop has no control flow and vectorises.
  template <bool KeepDecay, bool ReadOut>
  void step(const T* dt, const T* du, const T* Bt, const T* Ct, T* h, T* a, T* y) const {
    const int64_t N = s.d_state;
    if (ReadOut)
      for (int64_t c = 0; c < kBlock; ++c) y[c] = T(0);
    for (int64_t n = 0; n < N; ++n)
      update_lanes<T, KeepDecay, ReadOut>(dt, At + n * kBlock, du, Bt[n], ReadOut ? Ct[n] : T(0), h + n * kBlock,
                                          KeepDecay ? a + n * kBlock : nullptr, y);
  }
};

template <class T>
void forward(const Shape& s, const T* u, const T* delta, const T* A, const T* Bm, const T* Cm, T* y, bool reverse,
             int threads) {
  const int64_t L = s.length;
  parallel_items(s.batch * s.blocks(), threads, [&](int64_t item, int) {
    Block<T> blk(s, item, A);
    std::vector<T> h(s.d_state * kBlock, T(0));
    T dt[kBlock], du[kBlock], yv[kBlock];
    for (int64_t k = 0; k < L; ++k) {
      const int64_t t = reverse ? L - 1 - k : k;
      blk.load(u, delta, t, dt, du);
      blk.template step<false, true>(dt, du, Bm + blk.bc(t), Cm + blk.bc(t), h.data(), nullptr, yv);
      T* yr = y + blk.row(t);
      for (int64_t c = 0; c < blk.nd; ++c) yr[c * L] = yv[c];
    }
  });
}

// Gradients of y = sum_n C h with respect to delta (effective), u, A, B, C. With g_t = dL/dh_t:
// g_t = C_t dy_t + a_{t+1} g_{t+1}; d(delta_t A) = g_t h_{t-1} a_t; d(delta_t u_t B_t) = g_t. A first pass keeps
// the state at every kChunk-th step; each chunk's states and decays are recomputed from it, then read backwards,
// so a thread holds O(N kBlock (L / kChunk + kChunk)). dA, dB, dC are sums over items: each thread adds into its
// own slice of dA_part (threads, D, N), dB_part and dC_part (threads, Bt, G, L, N), which the caller sums.
// If y is not null the forward's y is written too (the z gate's gradient needs it), from the recomputed states.
template <class T>
void backward(const Shape& s, const T* u, const T* delta, const T* A, const T* Bm, const T* Cm, const T* dy,
              T* du_out, T* ddelta_out, T* dA_part, T* dB_part, T* dC_part, T* y, bool reverse, int threads) {
  const int64_t N = s.d_state, L = s.length, W = N * kBlock;
  const int64_t chunks = (L + kChunk - 1) / kChunk;
  parallel_items(s.batch * s.blocks(), threads, [&](int64_t item, int tid) {
    Block<T> blk(s, item, A);
    std::vector<T> starts(chunks * W), hs(kChunk * W), as(kChunk * W), h(W, T(0)), g(W, T(0)), dA(W, T(0));
    T dt[kBlock], du[kBlock], yv[kBlock], gy[kBlock], sgb[kBlock], sdd[kBlock];
    auto time_at = [&](int64_t k) { return reverse ? L - 1 - k : k; };
    for (int64_t k = 0; k < L; ++k) {  // states at chunk starts (and y)
      const int64_t t = time_at(k);
      if (k % kChunk == 0) std::memcpy(&starts[(k / kChunk) * W], h.data(), W * sizeof(T));
      blk.load(u, delta, t, dt, du);
      if (y) {
        blk.template step<false, true>(dt, du, Bm + blk.bc(t), Cm + blk.bc(t), h.data(), nullptr, yv);
        for (int64_t c = 0; c < blk.nd; ++c) y[blk.row(t) + c * L] = yv[c];
      } else {
        blk.template step<false, false>(dt, du, Bm + blk.bc(t), nullptr, h.data(), nullptr, nullptr);
      }
    }
    T* dB_t = dB_part + static_cast<int64_t>(tid) * s.batch * s.groups * L * N;
    T* dC_t = dC_part + static_cast<int64_t>(tid) * s.batch * s.groups * L * N;
    for (int64_t ci = chunks - 1; ci >= 0; --ci) {
      const int64_t k0 = ci * kChunk, k1 = k0 + kChunk < L ? k0 + kChunk : L;
      std::memcpy(h.data(), &starts[ci * W], W * sizeof(T));
      for (int64_t k = k0; k < k1; ++k) {  // recompute the chunk's states and decays
        const int64_t t = time_at(k);
        blk.load(u, delta, t, dt, du);
        blk.template step<true, false>(dt, du, Bm + blk.bc(t), nullptr, h.data(), &as[(k - k0) * W], nullptr);
        std::memcpy(&hs[(k - k0) * W], h.data(), W * sizeof(T));
      }
      for (int64_t k = k1 - 1; k >= k0; --k) {
        const int64_t t = time_at(k);
        blk.load(u, delta, t, dt, du);
        const T* dyr = dy + blk.row(t);
        for (int64_t c = 0; c < kBlock; ++c) {
          gy[c] = c < blk.nd ? dyr[c * L] : T(0);
          sgb[c] = T(0);
          sdd[c] = T(0);
        }
        const T* hk = &hs[(k - k0) * W];
        const T* prev = k > k0 ? &hs[(k - k0 - 1) * W] : &starts[ci * W];
        const T* ak = &as[(k - k0) * W];
        const T* Bt = Bm + blk.bc(t);
        const T* Ct = Cm + blk.bc(t);
        T* dBr = dB_t + blk.bc(t);
        T* dCr = dC_t + blk.bc(t);
        for (int64_t n = 0; n < N; ++n) {
          const int64_t o = n * kBlock;
          const T* An = blk.At + o;
          const T bn = Bt[n], cn = Ct[n];
          T* gn = &g[o];
          T* dAn = &dA[o];
          T db = 0, dc = 0;
#pragma omp simd reduction(+ : db, dc)
          for (int64_t c = 0; c < kBlock; ++c) {
            const T gv = cn * gy[c] + gn[c];  // gn holds a_{t+1} g_{t+1}
            const T dpre = gv * prev[o + c] * ak[o + c];
            dc += gy[c] * hk[o + c];
            db += gv * du[c];
            sgb[c] += gv * bn;
            sdd[c] += dpre * An[c];
            dAn[c] += dpre * dt[c];
            gn[c] = ak[o + c] * gv;
          }
          dBr[n] += db;
          dCr[n] += dc;
        }
        const T* ur = u + blk.row(t);
        T* ddr = ddelta_out + blk.row(t);
        T* dur = du_out + blk.row(t);
        for (int64_t c = 0; c < blk.nd; ++c) {
          ddr[c * L] = sdd[c] + sgb[c] * ur[c * L];
          dur[c * L] = sgb[c] * dt[c];
        }
      }
    }
    T* dA_t = dA_part + static_cast<int64_t>(tid) * s.channels * N;
    for (int64_t c = 0; c < blk.nd; ++c)
      for (int64_t n = 0; n < N; ++n) dA_t[(blk.d0 + c) * N + n] += dA[n * kBlock + c];
  });
}

}  // namespace

extern "C" {

int mixerbench_scan_abi_version() { return 2; }

#define MIXERBENCH_SCAN_ENTRY(T, suffix)                                                                        \
  void mixerbench_scan_fwd_##suffix(int64_t batch, int64_t channels, int64_t length, int64_t d_state,         \
                                    int64_t groups,                                                            \
                                    const T* u, const T* delta, const T* A, const T* Bm, const T* Cm, T* y,     \
                                    int reverse, int threads) {                                                \
    forward<T>(Shape{batch, channels, length, d_state, groups}, u, delta, A, Bm, Cm, y, reverse != 0, threads);        \
  }                                                                                                            \
  void mixerbench_scan_bwd_##suffix(int64_t batch, int64_t channels, int64_t length, int64_t d_state,         \
                                    int64_t groups,                                                            \
                                    const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,           \
                                    const T* dy, T* du, T* ddelta, T* dA_part, T* dB_part, T* dC_part, T* y,    \
                                    int reverse, int threads) {                                                \
    backward<T>(Shape{batch, channels, length, d_state, groups}, u, delta, A, Bm, Cm, dy, du, ddelta, dA_part, dB_part, \
                dC_part, y, reverse != 0, threads);                                                               \
  }

MIXERBENCH_SCAN_ENTRY(float, f32)
MIXERBENCH_SCAN_ENTRY(double, f64)

}  // extern "C"

// The selective scan's recurrence as a compiled CPU loop (impl `cpp_loop`), forward and backward.
//
// Plain C++ on raw pointers, no torch headers: it builds in about a second with any C++17 compiler, and
// cpp_scan.py calls it through ctypes. Threads are sized by the caller from torch's own count and are torch's
// OpenMP pool where the build has OpenMP (see mixers/ops/parallel_items.h).
//
// Layouts: u, delta, z, y, dy, du, ddelta, dz are (Bt, G, D / G, L) at any strides (`Strides`, one set per tensor;
// a group stride of 0 lets the G groups read one tensor), staged a tile of steps at a time into small step-major
// windows (see Block). Mamba hands them time-major (views of its (Bt, L, D) projections, a step's channels
// adjacent): channel-major copies of them cost as long as the scan. Bm, Cm are (Bt, G, L, N) at any batch, group
// and time strides with a step's N values adjacent (G = 1 for one B, C per sequence); A (D, N), delta_bias and Dskip
// (D,) contiguous; z, delta_bias and Dskip optional (null).
//
// order (optional, (G, L)): group g's step t reads and writes position order[g][t] of every tensor along L, so one
// call scans each group in its own order of one grid (vmamba's four cross-scan directions, its tensors kept in
// grid order: no gathered copies, no flips, no scatter back).
//
// The forward applies delta's bias and softplus as it loads a step and the D skip and the z gate as it stores one,
// so the element-wise work around the scan costs no passes over memory of its own (in PyTorch they took about as
// long as the recurrence at 1,024 tokens): y = (sum_n C_t[n] h_t[n] + D u_t) silu(z_t). The backward
// differentiates them the same way, step by step beside the scan's own gradients.
//
// Work is split over (sequence b, block of 16 channels); every inner loop runs over the block's channels, so it
// vectorises for any N (vmamba's N = 1 included) and reads each step's inputs from one window row. The float exp,
// sigmoid and silu are mixers/ops/vector_lanes.h's, written so the compiler vectorises them without -ffast-math;
// AVX-512 builds run the state loop, softplus and the gate in 16-float registers, with their exp and division;
// double uses std::exp (the float64 path exists for tight tests).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../parallel_items.h"
#include "../vector_lanes.h"
#if defined(__AVX2__) && !defined(__AVX512F__)
#include <immintrin.h>  // transpose_8
#endif

namespace {

// log(1 + v) for v in [0, 1] (softplus's use), v a float or F16: Cephes' logf polynomial on w = 1 + v in [1, 2],
// with Goldberg's correction log1p(v) = log(w) v / (w - 1), so a tiny v keeps its relative accuracy (w - 1 is
// exact).
template <class V>
__attribute__((always_inline)) inline V log1p_lane(V v) {
  const V w = v + 1.0f;
  const auto high = w > 1.41421356f;
  const V e = high ? V{} + 1.0f : V{};
  const V x = high ? w * 0.5f - 1.0f : w - 1.0f;
  const V z = x * x;
  V y = V{} + 7.0376836292e-2f;
  y = y * x - 1.1514610310e-1f;
  y = y * x + 1.1676998740e-1f;
  y = y * x - 1.2420140846e-1f;
  y = y * x + 1.4249322787e-1f;
  y = y * x - 1.6668057665e-1f;
  y = y * x + 2.0000714765e-1f;
  y = y * x - 2.4999993993e-1f;
  y = y * x + 3.3333331174e-1f;
  y = y * x * z;
  y = y + e * -2.12194440e-4f - 0.5f * z;
  const V logw = x + y + e * 0.693359375f;
  const V wm1 = w - 1.0f;
  return wm1 == 0.0f ? v : logw * divide_lane(v, wm1);
}

inline double log1p_lane(double v) { return std::log1p(v); }

// torch's softplus (beta 1, threshold 20): x above 20, else log(1 + e^x), as max(x, 0) + log1p(e^-|x|) so nothing
// overflows. T is float, double or F16.
template <class T>
__attribute__((always_inline)) inline T softplus_lane(T x) {
  const T zero = T{};
  const T ax = x < zero ? -x : x;
  const T out = (x > zero ? x : zero) + log1p_lane(exp_nonpositive_lane(-ax));
  return x > 20.0f ? x : out;
}

// Channels per work item: the lanes of every vector loop, so any N (vmamba's 1 included) fills whole vectors.
constexpr int64_t kBlock = 16;
// Time steps per tile: staged at once (a (kChunk, kBlock) window per tensor), and the steps whose states the
// backward recomputes and holds at once (a (kChunk, N, kBlock) buffer).
constexpr int64_t kChunk = 64;

// Strides of a tensor in elements: (batch, group, channel within the group, time) for the (Bt, G, D / G, L) ones,
// (batch, group, unused, time) for B and C.
struct Strides {
  int64_t b, g, d, t;
};
// The tensors' places in the strides array the entry points take.
enum Slot : int { kU, kDelta, kZ, kB, kC, kY, kDy, kDu, kDdelta, kDz, kSlots };
static_assert(sizeof(Strides) == 4 * sizeof(int64_t), "the entry points pass strides as int64 quadruples");

// groups: B and C are (Bt, G, L, N) and channel d reads group d / (D / G) (mamba-ssm's "variable B" groups; vmamba's
// four directions are its groups). Blocks never straddle a group.
struct Shape {
  int64_t batch, channels, length, d_state, groups;
  int64_t group_channels() const { return channels / groups; }
  int64_t blocks_per_group() const { return (group_channels() + kBlock - 1) / kBlock; }
  int64_t blocks() const { return groups * blocks_per_group(); }
};

// One state n over a block's channels: h_out <- exp(dt A_n) h_in + du b_n, the decays kept (KeepDecay),
// y += c_n h_out (ReadOut); Nonpositive: dt A_n <= 0 is known (Block::nonpositive), so exp needs no cap. h_in and
// h_out are one buffer, or (the backward's recompute) the previous step's state and the current one's: each lane
// reads its own element before writing it, so either is safe. A free function with compile-time flags, so the loop
// vectorises.
template <class T, bool KeepDecay, bool ReadOut, bool Nonpositive>
inline void update_lanes(const T* __restrict dt, const T* __restrict An, const T* __restrict du, T bn, T cn,
                         const T* h_in, T* h_out, T* __restrict an, T* __restrict y) {
#pragma omp simd
  for (int64_t c = 0; c < kBlock; ++c) {
    const T decay = Nonpositive ? exp_nonpositive_lane(dt[c] * An[c]) : exp_lane(dt[c] * An[c]);
    const T hv = decay * h_in[c] + du[c] * bn;
    h_out[c] = hv;
    if constexpr (KeepDecay) an[c] = decay;
    if constexpr (ReadOut) y[c] += hv * cn;
  }
}

// update_lanes over all N states with the output read out (ReadOut), in 16-float registers (kRegister16 builds):
// y is summed in two registers, where the compiler's loop stored and reloaded it after every state, a chain of
// store-to-load latencies through the step (about a tenth of the forward at 1,024 tokens). Not on AVX2: written so in
// 8-float registers the forward ran 5-12% slower (AMD EPYC), its 16 registers spilling, and there GCC's loop already
// keeps y in registers.
template <bool KeepDecay>
inline void read_out_16(int64_t N, const float* dt, const float* At, const float* du, const float* Bt, const float* Ct,
                        const float* h_in, float* h_out, float* a, float* y) {
  F16 dtv, duv, even = {}, odd = {};
  std::memcpy(&dtv, dt, sizeof dtv);
  std::memcpy(&duv, du, sizeof duv);
  auto state = [&](int64_t n, F16& sum) {
    F16 An, hv;
    std::memcpy(&An, At + n * kBlock, sizeof An);
    std::memcpy(&hv, h_in + n * kBlock, sizeof hv);
    const F16 decay = exp_lane(dtv * An);
    hv = decay * hv + duv * Bt[n];
    std::memcpy(h_out + n * kBlock, &hv, sizeof hv);
    if constexpr (KeepDecay) std::memcpy(a + n * kBlock, &decay, sizeof decay);
    sum += hv * Ct[n];
  };
  int64_t n = 0;
  for (; n + 1 < N; n += 2) {
    state(n, even);
    state(n + 1, odd);
  }
  if (n < N) state(n, even);
  const F16 total = even + odd;
  std::memcpy(y, &total, sizeof total);
}

// The backward's reverse step over all N states in 16-float registers (kRegister16 builds, N >= 8): with gv the
// state's gradient C_t gy + a_{t+1} g_{t+1} and dpre = gv h_{t-1} a_t, the per-lane dB and dC terms (gv du, gy h_t)
// go to `rows` (N rows each, W apart) for row_sums; sgb = sum_n gv B_t[n] and sdd = sum_n dpre A_n, in two registers
// each; dA += dpre dt; g <- a_t gv. gy, dt and du stay in registers across the states, where the compiler's loop
// over lanes reloaded them and kept sgb and sdd in memory.
inline void reverse_states_16(int64_t N, int64_t W, const float* At, const float* Bt, const float* Ct,
                              const float* gy_in, const float* dt_in, const float* du_in, const float* prev,
                              const float* hk, const float* ak, float* g, float* dA, float* rows, float* sgb,
                              float* sdd) {
  F16 gy, dt, du, sg_even = {}, sg_odd = {}, sd_even = {}, sd_odd = {};
  std::memcpy(&gy, gy_in, sizeof gy);
  std::memcpy(&dt, dt_in, sizeof dt);
  std::memcpy(&du, du_in, sizeof du);
  auto state = [&](int64_t n, F16& sg, F16& sd) {
    const int64_t o = n * kBlock;
    F16 gn, hp, a, h, An, dAn;
    std::memcpy(&gn, g + o, sizeof gn);
    std::memcpy(&hp, prev + o, sizeof hp);
    std::memcpy(&a, ak + o, sizeof a);
    std::memcpy(&h, hk + o, sizeof h);
    std::memcpy(&An, At + o, sizeof An);
    std::memcpy(&dAn, dA + o, sizeof dAn);
    const F16 gv = gy * Ct[n] + gn;
    const F16 dpre = gv * hp * a;
    const F16 db = gv * du, dc = gy * h;
    std::memcpy(rows + o, &db, sizeof db);
    std::memcpy(rows + W + o, &dc, sizeof dc);
    sg += gv * Bt[n];
    sd += dpre * An;
    dAn += dpre * dt;
    gn = a * gv;
    std::memcpy(dA + o, &dAn, sizeof dAn);
    std::memcpy(g + o, &gn, sizeof gn);
  };
  int64_t n = 0;
  for (; n + 1 < N; n += 2) {
    state(n, sg_even, sd_even);
    state(n + 1, sg_odd, sd_odd);
  }
  if (n < N) state(n, sg_even, sd_even);
  const F16 sg = sg_even + sg_odd, sd = sd_even + sd_odd;
  std::memcpy(sgb, &sg, sizeof sg);
  std::memcpy(sdd, &sd, sizeof sd);
}

// A step's gradients of the raw delta and of u from the scan's (sdd: of dt through the decays, sgb: of dt u through
// B), the skip's and softplus's: d raw delta = d dt sigmoid(delta + bias). A free function on restrict pointers with
// softplus a template flag: written inline in the backward's loop, the compiler could not prove its rows apart and
// ran the scalar fallback of the loop, the largest single cost of the backward at N = 1.
template <class T, bool Softplus>
inline void input_grads_lanes(const T* __restrict delta, const T* __restrict bias, const T* __restrict sdd,
                              const T* __restrict sgb, const T* __restrict u, const T* __restrict dt,
                              const T* __restrict gy, const T* __restrict skip, T* __restrict ddelta,
                              T* __restrict du, T* __restrict dbias) {
#pragma omp simd
  for (int64_t c = 0; c < kBlock; ++c) {
    const T d_dt = sdd[c] + sgb[c] * u[c];
    T d_pre = d_dt;
    if constexpr (Softplus) {
      const T pre = delta[c] + bias[c];
      d_pre = d_dt * (pre > T(20) ? T(1) : sigmoid_lane(pre));
    }
    ddelta[c] = d_pre;
    dbias[c] += d_pre;
    du[c] = sgb[c] * dt[c] + gy[c] * skip[c];
  }
}

// Sums of the kBlock values of each of 2N rows (kBlock apart) added into a[r] for rows r < N and b[r - N] after:
// the backward's dB and dC of one step, sums over a block's channels. Reduced one row at a time (a horizontal
// reduction each, four dependent shuffle-and-add stages) they were about a quarter of the backward at N = 8. For
// float on AVX-512, 16 rows at a time go through a transpose-and-add network instead (15 vector adds and 30
// two-source shuffles for 16 sums), in the compiler's vector extensions. A 16-float vector is one register only
// there: built for AVX2 or SSE2 the same network ran slower than the row-at-a-time sums, so those keep them.
template <class T>
inline void row_sums_scalar(const T* rows, int64_t first, int64_t end, int64_t N, T* a, T* b) {
  for (int64_t r = first; r < end; ++r) {
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < kBlock; ++c) sum += rows[r * kBlock + c];
    (r < N ? a[r] : b[r - N]) += sum;
  }
}

template <class T>
inline void row_sums(const T* rows, int64_t N, T* a, T* b) {
  row_sums_scalar(rows, 0, 2 * N, N, a, b);
}

// The shuffle networks below (row sums, tile transposes) are built where 16 floats are one register (kRegister16);
// AVX2 builds have their own tile transposes after them (kRegisterVector covers both).
#if defined(__AVX512F__)
static_assert(kBlock == 16, "the network below sums rows of 16 floats");
#if defined(__clang__)
#define MIXERBENCH_SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define MIXERBENCH_SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (I16){__VA_ARGS__})
#endif

// Each stage adds the two halves of every row's partial sums and packs two vectors' rows into one: 16 rows of 16
// lanes, then 8 vectors holding 2 rows x 8 partial sums, 4 holding 4 x 4, 2 holding 8 x 2, 1 holding 16 x 1.
inline F16 sum_16_rows(const float* rows) {
  F16 v[16];
  for (int r = 0; r < 16; ++r) std::memcpy(&v[r], rows + r * kBlock, sizeof(F16));
  for (int i = 0; i < 8; ++i)
    v[i] = MIXERBENCH_SHUFFLE(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           MIXERBENCH_SHUFFLE(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    v[i] = MIXERBENCH_SHUFFLE(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           MIXERBENCH_SHUFFLE(v[2 * i], v[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    v[i] = MIXERBENCH_SHUFFLE(v[2 * i], v[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           MIXERBENCH_SHUFFLE(v[2 * i], v[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return MIXERBENCH_SHUFFLE(v[0], v[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         MIXERBENCH_SHUFFLE(v[0], v[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// dst row r, column c = src row c, column r, for a 16 x 16 float tile (rows `src_stride` and `dst_stride` apart):
// four stages, each exchanging the off-diagonal halves of every 2h x 2h block between the row pairs (i, i + h).
// The staged windows of channel-major (B, D, L) tensors are such transposes; element by element they were about a
// quarter of the scan of vmamba's stacked directions (before it kept its tensors in grid order).
inline void transpose_16(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  F16 v[16];
  for (int r = 0; r < 16; ++r) std::memcpy(&v[r], src + r * src_stride, sizeof(F16));
  for (int i = 0; i < 8; ++i) {
    const F16 a = v[i], b = v[i + 8];
    v[i] = MIXERBENCH_SHUFFLE(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    v[i + 8] = MIXERBENCH_SHUFFLE(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  for (int i = 0; i < 16; i += (i % 8 == 3) ? 5 : 1) {
    const F16 a = v[i], b = v[i + 4];
    v[i] = MIXERBENCH_SHUFFLE(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    v[i + 4] = MIXERBENCH_SHUFFLE(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  }
  for (int i = 0; i < 16; i += (i % 4 == 1) ? 3 : 1) {
    const F16 a = v[i], b = v[i + 2];
    v[i] = MIXERBENCH_SHUFFLE(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    v[i + 2] = MIXERBENCH_SHUFFLE(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  }
  for (int i = 0; i < 16; i += 2) {
    const F16 a = v[i], b = v[i + 1];
    v[i] = MIXERBENCH_SHUFFLE(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    v[i + 1] = MIXERBENCH_SHUFFLE(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  }
  for (int r = 0; r < 16; ++r) std::memcpy(dst + r * dst_stride, &v[r], sizeof(F16));
}
#undef MIXERBENCH_SHUFFLE

template <>
inline void row_sums<float>(const float* rows, int64_t N, float* a, float* b) {
  int64_t r = 0;
  for (; r + 16 <= 2 * N; r += 16) {
    const F16 sums = sum_16_rows(rows + r * kBlock);
    for (int64_t j = 0; j < 16; ++j) (r + j < N ? a[r + j] : b[r + j - N]) += sums[j];
  }
  row_sums_scalar(rows, r, 2 * N, N, a, b);
}
#elif defined(__AVX2__)
// dst row r, column c = src row c, column r, for an 8 x 8 float tile, AVX2's register: pairs of rows interleaved,
// then pairs of pairs, then the 128-bit halves exchanged (24 shuffles for 64 moves).
inline void transpose_8(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * src_stride);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * dst_stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * dst_stride, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// The 16 x 16 tile of the AVX-512 build's transpose_16, as four 8 x 8 ones: channel-major windows, which element by
// element took about 30% of the forward of vmamba's stacked directions (AMD EPYC, micro and tiny presets).
inline void transpose_16(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  for (int64_t i = 0; i < 16; i += 8)
    for (int64_t j = 0; j < 16; j += 8)
      transpose_8(src + i * src_stride + j, src_stride, dst + j * dst_stride + i, dst_stride);
}
#endif

// A tile of the sequence: kChunk steps, taken in the order the scan runs (from the end when reversed). Steps
// [t0, t1); the k-th step run in it is t0 + at(k); step t0 + j sits at position pos(j) along L (itself, or the
// group's order; an order is never reversed, it is the order).
struct Tile {
  int64_t t0, t1;
  bool reverse;
  const int64_t* order;  // the group's row of the order, or null
  Tile(int64_t index, int64_t length, bool rev, const int64_t* group_order = nullptr)
      : reverse(rev), order(group_order) {
    const int64_t k0 = index * kChunk, k1 = k0 + kChunk < length ? k0 + kChunk : length;
    t0 = rev ? length - k1 : k0;
    t1 = rev ? length - k0 : k1;
  }
  int64_t size() const { return t1 - t0; }
  int64_t at(int64_t k) const { return reverse ? size() - 1 - k : k; }
  int64_t pos(int64_t j) const { return order ? order[t0 + j] : t0 + j; }
};

// One work item: sequence b, channels d0 .. d0 + nd - 1 (nd <= kBlock; lanes past nd hold zeros and are never
// written back).
//
// The (Bt, D, L) tensors are staged a tile at a time in step-major windows (kChunk, kBlock), so a step reads its
// channels from one cache line. Read in place, a step's 16 channels are 16 lines L elements apart; at L = 1,024
// floats they fall in one L1 set, which holds 8, and every step missed: the staged scan is about twice as fast.
template <class T>
struct Block {
  const Shape& s;
  const Strides* st;  // kSlots sets
  int64_t b, g, c0, d0, nd;  // sequence, group, first channel within the group and overall, channels
  const int64_t* order;  // the group's row of the order (G, L), or null: steps in place
  T A[kBlock * 64];  // A transposed to (N, kBlock); N <= 64 here, larger N takes the heap copy below
  std::vector<T> A_heap;
  T* At;
  T bias[kBlock] = {};  // delta's bias and the D skip of the block's channels, zero where not given or past nd
  T skip[kBlock] = {};
  T mask[kBlock] = {};  // 1 for the block's channels, 0 past nd
  bool softplus = false;
  bool nonpositive = false;  // every dt A <= 0: dt from softplus (>= 0) and the block's A <= 0, as Mamba's always are

  Block(const Shape& shape, const Strides* strides, int64_t item, const int64_t* order_in, const T* A_in,
        const T* delta_bias = nullptr, const T* D_in = nullptr, bool softplus_in = false)
      : s(shape), st(strides), softplus(softplus_in) {
    b = item / s.blocks();
    const int64_t in_batch = item % s.blocks(), gc = s.group_channels();
    g = in_batch / s.blocks_per_group();
    order = order_in ? order_in + g * s.length : nullptr;
    c0 = (in_batch % s.blocks_per_group()) * kBlock;
    d0 = g * gc + c0;
    nd = c0 + kBlock <= gc ? kBlock : gc - c0;
    const int64_t N = s.d_state;
    if (N > 64) A_heap.assign(N * kBlock, T(0));
    At = N > 64 ? A_heap.data() : A;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < kBlock; ++c) At[n * kBlock + c] = c < nd ? A_in[(d0 + c) * N + n] : T(0);
    nonpositive = softplus && std::all_of(At, At + N * kBlock, [](T a) { return a <= T(0); });
    for (int64_t c = 0; c < nd; ++c) {
      bias[c] = delta_bias ? delta_bias[d0 + c] : T(0);
      skip[c] = D_in ? D_in[d0 + c] : T(0);
      mask[c] = T(1);
    }
  }
  // The tile of the index-th kChunk steps in the scan's order.
  Tile tile(int64_t index, bool reverse) const { return Tile(index, s.length, reverse, order); }
  // The N values of B or C (slot kB, kC) at position p along L.
  int64_t bc(Slot slot, int64_t p) const { return b * st[slot].b + g * st[slot].g + p * st[slot].t; }
  // Position p's row of the per-thread gradients of B and C, contiguous (Bt, G, L, N).
  int64_t part(int64_t p) const { return ((b * s.groups + g) * s.length + p) * s.d_state; }
  // The block's first channel of the (Bt, G, D / G, L) tensor in `slot` at position 0.
  template <class P>
  P* origin(P* t, Slot slot) const {
    const Strides& x = st[slot];
    return t + b * x.b + g * x.g + c0 * x.d;
  }

  // The tile's steps of the block's channels of the tensor in `slot` into the window w (kChunk, kBlock); lanes past
  // nd are 0. The loops follow the memory: a row of channels per step where channels are adjacent (time-major),
  // a run of steps per channel where steps are.
  void gather(const T* src, Slot slot, const Tile& tile, T* w) const {
    const Strides& x = st[slot];
    const T* first = origin(src, slot);  // step t0 + j is at position tile.pos(j) from here
    if (x.d == 1 && nd == kBlock) {  // a whole block: plain row copies (the masked form below ran scalar)
      for (int64_t j = 0; j < tile.size(); ++j) {
        const T* row = first + tile.pos(j) * x.t;
#pragma omp simd
        for (int64_t c = 0; c < kBlock; ++c) w[j * kBlock + c] = row[c];
      }
      return;
    }
    if (x.d == 1) {
      for (int64_t j = 0; j < tile.size(); ++j) {
        const T* row = first + tile.pos(j) * x.t;
        for (int64_t c = 0; c < kBlock; ++c) w[j * kBlock + c] = c < nd ? row[c] : T(0);
      }
      return;
    }
    int64_t j0 = 0;
    if constexpr (kRegisterVector && std::is_same_v<T, float>) {  // channel-major rows: 16 x 16 tiles transposed
      if (!tile.order && x.t == 1 && nd == kBlock)
        for (; j0 + 16 <= tile.size(); j0 += 16) transpose_16(first + tile.t0 + j0, x.d, w + j0 * kBlock, kBlock);
    }
    for (int64_t c = 0; c < kBlock; ++c)
      for (int64_t j = j0; j < tile.size(); ++j)
        w[j * kBlock + c] = c < nd ? first[c * x.d + tile.pos(j) * x.t] : T(0);
  }
  // The window w back to the tile's steps of the block's channels of the tensor in `slot`.
  void scatter(const T* w, Slot slot, const Tile& tile, T* dst) const {
    const Strides& x = st[slot];
    T* first = origin(dst, slot);
    if (x.d == 1 && nd == kBlock) {  // a whole block: plain row copies, as in `gather` (the loop to nd ran scalar)
      for (int64_t j = 0; j < tile.size(); ++j) {
        T* row = first + tile.pos(j) * x.t;
#pragma omp simd
        for (int64_t c = 0; c < kBlock; ++c) row[c] = w[j * kBlock + c];
      }
      return;
    }
    if (x.d == 1) {
      for (int64_t j = 0; j < tile.size(); ++j) {
        T* row = first + tile.pos(j) * x.t;
        for (int64_t c = 0; c < nd; ++c) row[c] = w[j * kBlock + c];
      }
      return;
    }
    int64_t j0 = 0;
    if constexpr (kRegisterVector && std::is_same_v<T, float>) {
      if (!tile.order && x.t == 1 && nd == kBlock)
        for (; j0 + 16 <= tile.size(); j0 += 16) transpose_16(w + j0 * kBlock, kBlock, first + tile.t0 + j0, x.d);
    }
    for (int64_t c = 0; c < nd; ++c)
      for (int64_t j = j0; j < tile.size(); ++j) first[c * x.d + tile.pos(j) * x.t] = w[j * kBlock + c];
  }

  // The tile's dt (delta's bias and softplus applied here, in the forward and the backward alike) and dt * u,
  // from its `steps` rows of the u and delta windows into the dt and du windows; zero past nd. A pass over the tile
  // before its steps, not each step's row as the step needs it (softplus, an exp, a log and a division, is a
  // chain every state of the step waits on; over a tile the rows are independent and overlap), in vector registers
  // where the build has them (`load_in`; on AVX-512 with its exp and division, vector_lanes.h). Stubbed out,
  // softplus had been a fifth of the forward at 1,024 tokens.
  void load(const T* uw, const T* dw, int64_t steps, T* dtw, T* duw) const {
    if constexpr (kRegisterVector && std::is_same_v<T, float>) return load_in<FRegister>(uw, dw, steps, dtw, duw);
    for (int64_t j = 0; j < steps; ++j) {
      const T *ur = uw + j * kBlock, *dr = dw + j * kBlock;
      T *dt = dtw + j * kBlock, *du = duw + j * kBlock;
#pragma omp simd
      for (int64_t c = 0; c < kBlock; ++c) {
        const T pre = dr[c] + bias[c];
        const T v = (softplus ? softplus_lane(pre) : pre) * mask[c];
        dt[c] = v;
        du[c] = v * ur[c];
      }
    }
  }
  // `load` in registers of V (F16 or F8), a run of lanes at a time. Built for AVX2, the loop above was vectorised
  // behind a runtime check that sent the steps to its scalar copy (softplus with branches, a division per lane):
  // in F8 the forward took about a fifth less time (mamba's shapes, one thread, AMD EPYC).
  template <class V>
  void load_in(const float* uw, const float* dw, int64_t steps, float* dtw, float* duw) const {
    constexpr int64_t lanes = sizeof(V) / sizeof(float);
    for (int64_t p = 0; p < kBlock; p += lanes) {
      V bv, mv, dr, ur, v;
      std::memcpy(&bv, bias + p, sizeof bv);
      std::memcpy(&mv, mask + p, sizeof mv);
      for (int64_t j = 0; j < steps; ++j) {
        const int64_t o = j * kBlock + p;
        std::memcpy(&dr, dw + o, sizeof dr);
        std::memcpy(&ur, uw + o, sizeof ur);
        v = (softplus ? softplus_lane(dr + bv) : dr + bv) * mv;
        std::memcpy(dtw + o, &v, sizeof v);
        v *= ur;
        std::memcpy(duw + o, &v, sizeof v);
      }
    }
  }

  // The tile's gates silu(z), in place in the z window, before its steps (for the reason `load` gives).
  void gate(T* zw, int64_t steps) const {
    if constexpr (kRegisterVector && std::is_same_v<T, float>) return gate_in<FRegister>(zw, steps);  // as `load`
    for (int64_t j = 0; j < steps; ++j) {
      T* zr = zw + j * kBlock;
#pragma omp simd
      for (int64_t c = 0; c < kBlock; ++c) zr[c] = silu_lane(zr[c]);
    }
  }
  template <class V>
  void gate_in(float* zw, int64_t steps) const {
    constexpr int64_t lanes = sizeof(V) / sizeof(float);
    V zr;
    for (int64_t i = 0; i < steps * kBlock; i += lanes) {
      std::memcpy(&zr, zw + i, sizeof zr);
      zr = silu_lane(zr);
      std::memcpy(zw + i, &zr, sizeof zr);
    }
  }

  // The step's output row: (core + D u) silu(z), the gate's row where given (`gate`). Two loops, not
  // `gr ? ... : ...` inside one: that form ran several times slower without z (vmamba) on an Intel Xeon when u was
  // channel-major, a loss that flushing denormals to zero also removed (seen, not traced to the instructions).
  void store(const T* core, const T* ur, const T* gr, T* yr) const {
    if (gr) {
#pragma omp simd
      for (int64_t c = 0; c < kBlock; ++c) yr[c] = (core[c] + skip[c] * ur[c]) * gr[c];
      return;
    }
#pragma omp simd
    for (int64_t c = 0; c < kBlock; ++c) yr[c] = core[c] + skip[c] * ur[c];
  }

  // h_out <- exp(dt A) h_in + du B_t for all N states (h_out may be h_in); KeepDecay: the decays go to a; ReadOut:
  // y = sum_n C_t[n] h_out[n]. Template flags, not branches, so the inner loop has no control flow and vectorises.
  template <bool KeepDecay, bool ReadOut>
  void step(const T* dt, const T* du, const T* Bt, const T* Ct, const T* h_in, T* h_out, T* a, T* y) const {
    const int64_t N = s.d_state;
    if constexpr (ReadOut && kRegister16 && std::is_same_v<T, float>) {
      read_out_16<KeepDecay>(N, dt, At, du, Bt, Ct, h_in, h_out, a, y);
      return;
    }
    if (ReadOut)
      for (int64_t c = 0; c < kBlock; ++c) y[c] = T(0);
    if (nonpositive)
      states<KeepDecay, ReadOut, true>(dt, du, Bt, Ct, h_in, h_out, a, y);
    else
      states<KeepDecay, ReadOut, false>(dt, du, Bt, Ct, h_in, h_out, a, y);
  }
  template <bool KeepDecay, bool ReadOut, bool Nonpositive>
  void states(const T* dt, const T* du, const T* Bt, const T* Ct, const T* h_in, T* h_out, T* a, T* y) const {
    for (int64_t n = 0; n < s.d_state; ++n)
      update_lanes<T, KeepDecay, ReadOut, Nonpositive>(dt, At + n * kBlock, du, Bt[n], ReadOut ? Ct[n] : T(0),
                                                       h_in + n * kBlock, h_out + n * kBlock,
                                                       KeepDecay ? a + n * kBlock : nullptr, y);
  }
};

// The steps a tile holds at most: kChunk, or the whole sequence where it is shorter. Buffers are sized by it, not
// by kChunk: at the micro preset's 16 tokens a kChunk-sized buffer is four times what is used.
inline int64_t tile_span(int64_t length) { return length < kChunk ? length : kChunk; }

// Scratch memory of each thread, allocated once per call: `per_thread` elements for each of `threads` threads. Taken
// per work item (a sequence's block of channels, hundreds per call at batch 32), allocating and zeroing the
// buffers cost as long as the backward's arithmetic at short sequences.
template <class T>
struct Scratch {
  int64_t per_thread;
  std::vector<T> memory;
  Scratch(int threads, int64_t per_thread_in)
      : per_thread(per_thread_in), memory(static_cast<size_t>(threads < 1 ? 1 : threads) * per_thread_in) {}
  T* of(int tid) { return memory.data() + tid * per_thread; }
};

template <class T>
void forward(const Shape& s, const Strides* st, const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
             const T* delta_bias, bool softplus, const T* D, const T* z, T* y, bool reverse, const int64_t* order,
             int threads) {
  const int64_t L = s.length, tiles = (L + kChunk - 1) / kChunk, W = tile_span(L) * kBlock, H = s.d_state * kBlock;
  Scratch<T> scratch(threads, H + 6 * W);
  parallel_items(s.batch * s.blocks(), threads, [&](int64_t item, int tid) {
    Block<T> blk(s, st, item, order, A, delta_bias, D, softplus);
    T* h = scratch.of(tid);  // the state, zero at the start of each item; then the windows, written before read
    std::fill(h, h + H, T(0));
    T *uw = h + H, *dw = uw + W, *zw = dw + W, *yw = zw + W, *dtw = yw + W, *dxw = dtw + W;
    T core[kBlock];
    for (int64_t ti = 0; ti < tiles; ++ti) {
      const Tile tile = blk.tile(ti, reverse);
      blk.gather(u, kU, tile, uw);
      blk.gather(delta, kDelta, tile, dw);
      blk.load(uw, dw, tile.size(), dtw, dxw);
      if (z) {
        blk.gather(z, kZ, tile, zw);
        blk.gate(zw, tile.size());
      }
      for (int64_t k = 0; k < tile.size(); ++k) {
        const int64_t j = tile.at(k), p = tile.pos(j), o = j * kBlock;
        blk.template step<false, true>(dtw + o, dxw + o, Bm + blk.bc(kB, p), Cm + blk.bc(kC, p), h, h, nullptr, core);
        blk.store(core, uw + o, z ? zw + o : nullptr, yw + o);
      }
      blk.scatter(yw, kY, tile, y);
    }
  });
}

// Gradients of y = (sum_n C h + D u) silu(z) with respect to u, the raw delta, A, B, C, D, z and delta's bias.
// With g_t = dL/dh_t and gy_t = dy_t silu(z_t), the gradient of the core sum: g_t = C_t gy_t + a_{t+1} g_{t+1};
// d(delta_t A) = g_t h_{t-1} a_t; d(delta_t u_t B_t) = g_t. A first pass keeps the state at the start of every
// tile; each tile's states, decays and core outputs are recomputed from it, then read backwards, so a thread holds
// O(N kBlock (L / kChunk + kChunk)). The element-wise parts (the gate, the skip, softplus) are differentiated per
// step beside the scan's. dA, dB, dC, dD and the bias's gradient are sums over items: each thread adds into its
// own slice of dA_part (threads, D, N), dB_part and dC_part (threads, Bt, G, L, N), dD_part and dbias_part
// (threads, D), which the caller sums. dz is written where z is given.
template <class T>
void backward(const Shape& s, const Strides* st, const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
              const T* delta_bias, bool softplus, const T* D, const T* z, const T* dy, T* du_out, T* ddelta_out,
              T* dA_part, T* dB_part, T* dC_part, T* dD_part, T* dbias_part, T* dz_out, bool reverse,
              const int64_t* order, int threads) {
  const int64_t N = s.d_state, L = s.length, W = N * kBlock, span = tile_span(L), V = span * kBlock;
  const int64_t tiles = (L + kChunk - 1) / kChunk;
  // Per thread: h, g, dA (zeroed per item), then the tile starts, the tile's states and decays, and the windows,
  // each written before it is read.
  Scratch<T> scratch(threads, 5 * W + tiles * W + 2 * span * W + 10 * V);
  parallel_items(s.batch * s.blocks(), threads, [&](int64_t item, int tid) {
    Block<T> blk(s, st, item, order, A, delta_bias, D, softplus);
    T* h = scratch.of(tid);
    // rows: a step's per-lane terms of dB (N rows) then dC (N rows), for row_sums' network where there is one and
    // N >= 8 fills it; otherwise each is reduced in place (vmamba's N = 1 ran slower through the rows)
    T *g = h + W, *dA = g + W, *rows = dA + W, *starts = rows + 2 * W, *hs = starts + tiles * W, *as = hs + span * W;
    const bool through_rows = kRegister16 && std::is_same_v<T, float> && 2 * N >= 16;
    std::fill(h, h + 3 * W, T(0));
    T *uw = as + span * W, *dw = uw + V, *gw = dw + V, *zw = gw + V, *cw = zw + V, *duw = cw + V, *ddw = duw + V,
      *dzw = ddw + V, *dtw = dzw + V, *dxw = dtw + V;  // dtw, dxw: each step's dt and dt u, from the recompute
    T sgb[kBlock], sdd[kBlock], gy[kBlock], dD[kBlock] = {}, dbias[kBlock] = {};
    for (int64_t ti = 0; ti < tiles; ++ti) {  // states at tile starts
      std::memcpy(&starts[ti * W], h, W * sizeof(T));
      if (ti + 1 == tiles) break;  // the last tile's own steps lead to no start: at L <= kChunk, no pass at all
      const Tile tile = blk.tile(ti, reverse);
      blk.gather(u, kU, tile, uw);
      blk.gather(delta, kDelta, tile, dw);
      blk.load(uw, dw, tile.size(), dtw, dxw);
      for (int64_t k = 0; k < tile.size(); ++k) {
        const int64_t j = tile.at(k), p = tile.pos(j), o = j * kBlock;
        blk.template step<false, false>(dtw + o, dxw + o, Bm + blk.bc(kB, p), nullptr, h, h, nullptr, nullptr);
      }
    }
    T* dB_t = dB_part + static_cast<int64_t>(tid) * s.batch * s.groups * L * N;
    T* dC_t = dC_part + static_cast<int64_t>(tid) * s.batch * s.groups * L * N;
    for (int64_t ti = tiles - 1; ti >= 0; --ti) {
      const Tile tile = blk.tile(ti, reverse);
      blk.gather(u, kU, tile, uw);
      blk.gather(delta, kDelta, tile, dw);
      blk.gather(dy, kDy, tile, gw);
      if (z) blk.gather(z, kZ, tile, zw);
      blk.load(uw, dw, tile.size(), dtw, dxw);
      for (int64_t k = 0; k < tile.size(); ++k) {  // recompute the tile's states, decays and core outputs
        const int64_t j = tile.at(k), p = tile.pos(j), o = j * kBlock;
        const T* prev = k > 0 ? &hs[(k - 1) * W] : &starts[ti * W];
        blk.template step<true, true>(dtw + o, dxw + o, Bm + blk.bc(kB, p), Cm + blk.bc(kC, p), prev, &hs[k * W],
                                      &as[k * W], cw + o);
      }
      for (int64_t k = tile.size() - 1; k >= 0; --k) {
        const int64_t j = tile.at(k), p = tile.pos(j), o = j * kBlock;
        const T* dt = dtw + o;
        const T* du = dxw + o;
        const T* ur = uw + o;
        const T* dyr = gw + o;
        // The gate: gy = dy silu(z), dz = dy (core + D u) silu'(z); without z, gy = dy. Two loops, as in `store`.
        if (z) {
#pragma omp simd
          for (int64_t c = 0; c < kBlock; ++c) {
            const T zv = zw[o + c], sig = sigmoid_lane(zv);
            gy[c] = dyr[c] * zv * sig;
            dzw[o + c] = dyr[c] * (cw[o + c] + blk.skip[c] * ur[c]) * sig * (T(1) + zv * (T(1) - sig));
          }
        } else {
#pragma omp simd
          for (int64_t c = 0; c < kBlock; ++c) gy[c] = dyr[c];
        }
#pragma omp simd
        for (int64_t c = 0; c < kBlock; ++c) {
          sgb[c] = T(0);
          sdd[c] = T(0);
          dD[c] += gy[c] * ur[c];
        }
        const T* hk = &hs[k * W];
        const T* prev = k > 0 ? &hs[(k - 1) * W] : &starts[ti * W];
        const T* ak = &as[k * W];
        const T* Bt = Bm + blk.bc(kB, p);
        const T* Ct = Cm + blk.bc(kC, p);
        T* dBr = dB_t + blk.part(p);
        T* dCr = dC_t + blk.part(p);
        if constexpr (kRegister16 && std::is_same_v<T, float>) {
          if (through_rows)
            reverse_states_16(N, W, blk.At, Bt, Ct, gy, dt, du, prev, hk, ak, g, dA, rows, sgb, sdd);
        }
        for (int64_t n = 0; n < N && !through_rows; ++n) {  // each state's dB and dC terms summed here
          const int64_t o_n = n * kBlock;
          const T* An = blk.At + o_n;
          const T bn = Bt[n], cn = Ct[n];
          T* gn = &g[o_n];
          T* dAn = &dA[o_n];
          T db = 0, dc = 0;
#pragma omp simd reduction(+ : db, dc)
          for (int64_t c = 0; c < kBlock; ++c) {
            const T gv = cn * gy[c] + gn[c];  // gn holds a_{t+1} g_{t+1}
            const T dpre = gv * prev[o_n + c] * ak[o_n + c];
            dc += gy[c] * hk[o_n + c];
            db += gv * du[c];
            sgb[c] += gv * bn;
            sdd[c] += dpre * An[c];
            dAn[c] += dpre * dt[c];
            gn[c] = ak[o_n + c] * gv;
          }
          dBr[n] += db;
          dCr[n] += dc;
        }
        if (through_rows) row_sums<T>(rows, N, dBr, dCr);
        if (softplus)
          input_grads_lanes<T, true>(dw + o, blk.bias, sdd, sgb, ur, dt, gy, blk.skip, ddw + o, duw + o, dbias);
        else
          input_grads_lanes<T, false>(dw + o, blk.bias, sdd, sgb, ur, dt, gy, blk.skip, ddw + o, duw + o, dbias);
      }
      blk.scatter(ddw, kDdelta, tile, ddelta_out);
      blk.scatter(duw, kDu, tile, du_out);
      if (z) blk.scatter(dzw, kDz, tile, dz_out);
    }
    T* dA_t = dA_part + static_cast<int64_t>(tid) * s.channels * N;
    T* dD_t = dD_part + static_cast<int64_t>(tid) * s.channels;
    T* dbias_t = dbias_part + static_cast<int64_t>(tid) * s.channels;
    for (int64_t c = 0; c < blk.nd; ++c) {
      for (int64_t n = 0; n < N; ++n) dA_t[(blk.d0 + c) * N + n] += dA[n * kBlock + c];
      dD_t[blk.d0 + c] += dD[c];
      dbias_t[blk.d0 + c] += dbias[c];
    }
  });
}

}  // namespace

extern "C" {

int mixerbench_scan_abi_version() { return 8; }

// strides: kSlots x 4 int64 (see Slot and Strides), those of absent tensors unread; order: (G, L) int64 or null.
#define MIXERBENCH_SCAN_ENTRY(T, suffix)                                                                        \
  void mixerbench_scan_fwd_##suffix(int64_t batch, int64_t channels, int64_t length, int64_t d_state,         \
                                    int64_t groups, const int64_t* strides, const T* u, const T* delta,         \
                                    const T* A, const T* Bm, const T* Cm, const T* delta_bias, int softplus,    \
                                    const T* D, const T* z, T* y, int reverse, const int64_t* order,            \
                                    int threads) {                                                             \
    forward<T>(Shape{batch, channels, length, d_state, groups}, reinterpret_cast<const Strides*>(strides), u,   \
               delta, A, Bm, Cm, delta_bias, softplus != 0, D, z, y, reverse != 0, order, threads);            \
  }                                                                                                            \
  void mixerbench_scan_bwd_##suffix(int64_t batch, int64_t channels, int64_t length, int64_t d_state,         \
                                    int64_t groups, const int64_t* strides, const T* u, const T* delta,         \
                                    const T* A, const T* Bm, const T* Cm, const T* delta_bias, int softplus,    \
                                    const T* D, const T* z, const T* dy, T* du, T* ddelta, T* dA_part,          \
                                    T* dB_part, T* dC_part, T* dD_part, T* dbias_part, T* dz, int reverse,      \
                                    const int64_t* order, int threads) {                                       \
    backward<T>(Shape{batch, channels, length, d_state, groups}, reinterpret_cast<const Strides*>(strides), u,  \
                delta, A, Bm, Cm, delta_bias, softplus != 0, D, z, dy, du, ddelta, dA_part, dB_part, dC_part,   \
                dD_part, dbias_part, dz, reverse != 0, order, threads);                                        \
  }

MIXERBENCH_SCAN_ENTRY(float, f32)
MIXERBENCH_SCAN_ENTRY(double, f64)

}  // extern "C"

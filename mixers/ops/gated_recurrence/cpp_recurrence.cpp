// The gated linear recurrence as a compiled CPU loop, forward and backward: GLA's (one decay per key) and SSD's
// (one decay per head) in one kernel.
//
//     S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = scale * S_t^T q_t,    S_0 = 0      (S is K x V per row)
//
// Each row (a sequence and head, in one direction) keeps its state in a small buffer while the loop walks the
// sequence, so a step costs 2 K V multiply-adds and K exps, with no Python or dispatch per step or per chunk. In
// PyTorch the chunked form ran tens of small ops per layer and at the micro preset those ops' fixed cost, not their
// arithmetic, was most of the mixer's time.
//
// Plain C++ on raw pointers, built and loaded by mixers/ops/cpu_kernels.py. Every tensor is (direction, batch,
// head, time, last) at any strides but the last dimension's (`Strides`, one quadruple per tensor), which is 1. A
// row is one (direction, sequence, head); direction 1 runs the recurrence from the last step to the first (the
// backward direction of a bidirectional mixer) and writes its outputs in the sequence's own order, so neither the
// inputs nor the outputs are flipped. A stride of 0 shares a tensor: among the directions (GLA's q, k, v), among
// the heads (SSD's B and C); a gate of width 1 is one decay for all keys (SSD's scalar per head); an optional value
// scale s, one per row and step, makes the values s_t v_t (SSD's x dt, never a tensor of its own). The gradients
// are written per row, so a shared tensor's gradient comes out per direction or head, for the caller to sum.
//
// Backward (fla's recipe, without storing a state): a forward sweep recomputes S_t for dq_t = scale S_t do_t; a
// reverse sweep carries dS_t = scale q_t do_t^T + diag(exp(g_{t+1})) dS_{t+1} for dk_t = dS_t v_t and
// dv_t = dS_t^T k_t. The gates' gradient needs no state at all: with b the cumulative log decay, o depends on b_t
// through q_t exp(b_t) and k_t exp(-b_t) only, so d b_t = q_t dq_t - k_t dk_t (element-wise) and d g_t is its sum
// over the steps from t on, accumulated in double.
#include <cstdint>
#include <vector>

#include "../parallel_items.h"
#include "../vector_lanes.h"

namespace {

// Strides of a tensor in elements: (direction, batch, head, time); the last dimension's is 1.
struct Strides {
  int64_t d, b, h, t;
};
static_assert(sizeof(Strides) == 4 * sizeof(int64_t), "the entry points pass strides as int64 quadruples");
// The tensors' places in the strides array the entry points take.
enum Slot : int { kQ, kK, kV, kG, kO, kDo, kDq, kDk, kDv, kDg, kVs, kDvs, kSlots };

struct Shape {
  int64_t directions, batch, heads, length, keys, values, gate_width;  // gate_width: keys, or 1 (one per head)
  int64_t rows() const { return directions * batch * heads; }
};

// One row of a tensor walked in its direction's order: step t of the walk at base + t * step.
template <class P>
struct Walk {
  P base;
  int64_t step;
  P at(int64_t t) const { return base + t * step; }
};

template <class P>
inline Walk<P> walk(P data, const Strides& st, const Shape& s, int64_t row) {
  if (!data) return {data, 0};  // an absent tensor (the value scale), never read
  const int64_t per_direction = s.batch * s.heads, direction = row / per_direction, rest = row % per_direction;
  P base = data + direction * st.d + (rest / s.heads) * st.b + (rest % s.heads) * st.h;
  if (direction == 0) return {base, st.t};
  return {base + (s.length - 1) * st.t, -st.t};  // from the last step back
}

// The step's decays exp(g_t), one per key (a gate of width 1 repeated).
template <class T>
inline void decays(const Shape& s, const T* __restrict g, T* __restrict a) {
  if (s.gate_width == 1) {
    const T one = exp_lane(g[0]);
    for (int64_t k = 0; k < s.keys; ++k) a[k] = one;
    return;
  }
#pragma omp simd
  for (int64_t k = 0; k < s.keys; ++k) a[k] = exp_lane(g[k]);
}

// State rows k: S[k] <- a[k] S[k] + key[k] v, then out += w[k] S[k] (the forward's o with w = scale q, the reverse
// sweep's dv with w = k). Four rows per pass over `out`, so it is loaded and stored once per four rows rather than
// once per row (a store-to-load chain through the step). Dot: also each new row's dot product with `with`,
// dots[k] = S[k] . with, in the same pass, four sums at a time (the reverse sweep's dk_t = dS_t v_t beside dv_t,
// where a second pass over the state had taken a horizontal sum per row); without it `with` and `dots` are unread.
template <bool Dot, class T>
inline void update_rows(int64_t keys, int64_t values, const T* __restrict a, const T* __restrict key,
                        const T* __restrict v, const T* __restrict w, T* __restrict S, T* __restrict out,
                        const T* __restrict with = nullptr, T* __restrict dots = nullptr) {
  int64_t k = 0;
  for (; k + 4 <= keys; k += 4) {
    T* __restrict s0 = S + k * values;
    T* __restrict s1 = s0 + values;
    T* __restrict s2 = s1 + values;
    T* __restrict s3 = s2 + values;
    T d0 = T(0), d1 = T(0), d2 = T(0), d3 = T(0);
#pragma omp simd reduction(+ : d0, d1, d2, d3)
    for (int64_t j = 0; j < values; ++j) {
      const T n0 = a[k] * s0[j] + key[k] * v[j];
      const T n1 = a[k + 1] * s1[j] + key[k + 1] * v[j];
      const T n2 = a[k + 2] * s2[j] + key[k + 2] * v[j];
      const T n3 = a[k + 3] * s3[j] + key[k + 3] * v[j];
      s0[j] = n0;
      s1[j] = n1;
      s2[j] = n2;
      s3[j] = n3;
      out[j] += (w[k] * n0 + w[k + 1] * n1) + (w[k + 2] * n2 + w[k + 3] * n3);
      if constexpr (Dot) {
        d0 += n0 * with[j];
        d1 += n1 * with[j];
        d2 += n2 * with[j];
        d3 += n3 * with[j];
      }
    }
    if constexpr (Dot) {
      dots[k] = d0;
      dots[k + 1] = d1;
      dots[k + 2] = d2;
      dots[k + 3] = d3;
    }
  }
  for (; k < keys; ++k) {
    T* __restrict s0 = S + k * values;
    T d0 = T(0);
#pragma omp simd reduction(+ : d0)
    for (int64_t j = 0; j < values; ++j) {
      const T n0 = a[k] * s0[j] + key[k] * v[j];
      s0[j] = n0;
      out[j] += w[k] * n0;
      if constexpr (Dot) d0 += n0 * with[j];
    }
    if constexpr (Dot) dots[k] = d0;
  }
}

// The same update on a transposed state, S^T (V rows of K): S^T[j] <- a S^T[j] + v[j] key (element-wise over the
// keys), then out += w[j] S^T[j]. The backward's forward sweep runs it with w = do: dq_t = S_t do_t then sums rows
// vertically, where on S (K rows of V) each of its K entries was a horizontal sum.
template <class T>
inline void update_columns(int64_t keys, int64_t values, const T* __restrict a, const T* __restrict key,
                           const T* __restrict v, const T* __restrict w, T* __restrict ST, T* __restrict out) {
  int64_t j = 0;
  for (; j + 4 <= values; j += 4) {
    T* __restrict s0 = ST + j * keys;
    T* __restrict s1 = s0 + keys;
    T* __restrict s2 = s1 + keys;
    T* __restrict s3 = s2 + keys;
#pragma omp simd
    for (int64_t c = 0; c < keys; ++c) {
      const T n0 = a[c] * s0[c] + key[c] * v[j];
      const T n1 = a[c] * s1[c] + key[c] * v[j + 1];
      const T n2 = a[c] * s2[c] + key[c] * v[j + 2];
      const T n3 = a[c] * s3[c] + key[c] * v[j + 3];
      s0[c] = n0;
      s1[c] = n1;
      s2[c] = n2;
      s3[c] = n3;
      out[c] += (w[j] * n0 + w[j + 1] * n1) + (w[j + 2] * n2 + w[j + 3] * n3);
    }
  }
  for (; j < values; ++j) {
    T* __restrict s0 = ST + j * keys;
#pragma omp simd
    for (int64_t c = 0; c < keys; ++c) {
      const T n0 = a[c] * s0[c] + key[c] * v[j];
      s0[c] = n0;
      out[c] += w[j] * n0;
    }
  }
}

// Step t's values v_t, or s_t v_t into `scaled` where a value scale s is given (SSD's x dt, so x dt is never a
// tensor of its own).
template <class T>
inline const T* values_at(const Walk<const T*>& vr, const Walk<const T*>& sr, bool scaled_values, int64_t t,
                          int64_t V, T* __restrict scaled) {
  const T* __restrict vt = vr.at(t);
  if (!scaled_values) return vt;
  const T sv = *sr.at(t);
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) scaled[j] = sv * vt[j];
  return scaled;
}

template <class T>
void forward(const Shape& s, const Strides* st, const T* q, const T* k, const T* v, const T* vs, const T* g, T scale,
             T* o, int threads) {
  const int64_t K = s.keys, V = s.values;
  parallel_items(s.rows(), threads, [&](int64_t row, int) {
    const auto qr = walk(q, st[kQ], s, row), kr = walk(k, st[kK], s, row), vr = walk(v, st[kV], s, row),
               gr = walk(g, st[kG], s, row), sr = walk(vs, st[kVs], s, row);
    const auto orow = walk(o, st[kO], s, row);
    std::vector<T> state(K * V, T(0)), a(K), w(K), scaled(V);
    for (int64_t t = 0; t < s.length; ++t) {
      const T* qt = qr.at(t);
      decays(s, gr.at(t), a.data());
      for (int64_t j = 0; j < K; ++j) w[j] = scale * qt[j];
      T* ot = orow.at(t);
      for (int64_t j = 0; j < V; ++j) ot[j] = T(0);
      const T* vt = values_at(vr, sr, vs != nullptr, t, V, scaled.data());
      update_rows<false>(K, V, a.data(), kr.at(t), vt, w.data(), state.data(), ot);
    }
  });
}

template <class T>
void backward(const Shape& s, const Strides* st, const T* q, const T* k, const T* v, const T* vs, const T* g, T scale,
              const T* dout, T* dq, T* dk, T* dv, T* dvs, T* dg, int threads) {
  const int64_t K = s.keys, V = s.values;
  parallel_items(s.rows(), threads, [&](int64_t row, int) {
    const auto qr = walk(q, st[kQ], s, row), kr = walk(k, st[kK], s, row), vr = walk(v, st[kV], s, row),
               gr = walk(g, st[kG], s, row), dor = walk(dout, st[kDo], s, row), sr = walk(vs, st[kVs], s, row);
    const auto dqr = walk(dq, st[kDq], s, row), dkr = walk(dk, st[kDk], s, row), dvr = walk(dv, st[kDv], s, row),
               dgr = walk(dg, st[kDg], s, row), dsr = walk(dvs, st[kDvs], s, row);
    std::vector<T> state(K * V, T(0)), a(K), w(K), scaled(V);
    // Forward sweep: the states again (transposed), read against do for dq; the readout itself is not needed.
    for (int64_t t = 0; t < s.length; ++t) {
      decays(s, gr.at(t), a.data());
      T* dqt = dqr.at(t);
      for (int64_t j = 0; j < K; ++j) w[j] = T(0);
      const T* vt = values_at(vr, sr, vs != nullptr, t, V, scaled.data());
      update_columns(K, V, a.data(), kr.at(t), vt, dor.at(t), state.data(), w.data());
#pragma omp simd
      for (int64_t j = 0; j < K; ++j) dqt[j] = scale * w[j];
    }
    // Reverse sweep: dS in `state`, decayed by the next step's gates; d g summed from the end in double.
    for (int64_t j = 0; j < K * V; ++j) state[j] = T(0);
    for (int64_t j = 0; j < K; ++j) a[j] = T(0);  // no step after the last
    std::vector<double> running(s.gate_width, 0.0);
    for (int64_t t = s.length - 1; t >= 0; --t) {
      const T *qt = qr.at(t), *kt = kr.at(t), *dot_ = dor.at(t);
      const T* vt = values_at(vr, sr, vs != nullptr, t, V, scaled.data());
      for (int64_t j = 0; j < K; ++j) w[j] = scale * qt[j];
      T* dvt = dvr.at(t);
      for (int64_t j = 0; j < V; ++j) dvt[j] = T(0);
      // dS <- a_{t+1} dS + (scale q_t) do_t^T, dv_t = dS^T k_t (update_rows with the roles of k and q swapped), and
      // dk_t = dS v_t in the same pass.
      const T* dqt = dqr.at(t);
      T *dkt = dkr.at(t), *dgt = dgr.at(t);
      update_rows<true>(K, V, a.data(), w.data(), dot_, kt, state.data(), dvt, vt, dkt);
      if (vs) {  // dvt holds the gradient of s_t v_t: v_t's is s_t times it, s_t's its product with v_t
        const T* __restrict raw = vr.at(t);
        const T sv = *sr.at(t);
        T ds = T(0);
#pragma omp simd reduction(+ : ds)
        for (int64_t j = 0; j < V; ++j) {
          ds += raw[j] * dvt[j];
          dvt[j] *= sv;
        }
        *dsr.at(t) = ds;
      }
      if (s.gate_width == 1) {
        double step = 0.0;
#pragma omp simd reduction(+ : step)
        for (int64_t j = 0; j < K; ++j) step += double(qt[j]) * double(dqt[j]) - double(kt[j]) * double(dkt[j]);
        running[0] += step;
        dgt[0] = T(running[0]);
      } else {
        double* __restrict sum = running.data();
#pragma omp simd
        for (int64_t j = 0; j < K; ++j) {
          sum[j] += double(qt[j]) * double(dqt[j]) - double(kt[j]) * double(dkt[j]);
          dgt[j] = T(sum[j]);
        }
      }
      decays(s, gr.at(t), a.data());
    }
  });
}

}  // namespace

extern "C" {

int mixerbench_gated_recurrence_abi_version() { return 3; }

// strides: kSlots quadruples (direction, batch, head, time) in Slot order; the forward reads the first five
// (q, k, v, g, o) and the value scale's. vs, the value scale (one per row and step, a last dimension of 1), and its
// gradient dvs are null where the values are not scaled.
#define MIXERBENCH_GATED_RECURRENCE_ENTRY(T, suffix)                                                             \
  void mixerbench_gated_recurrence_fwd_##suffix(int64_t directions, int64_t batch, int64_t heads, int64_t length, \
                                                int64_t keys, int64_t values, int64_t gate_width,                \
                                                const int64_t* strides, const T* q, const T* k, const T* v,      \
                                                const T* vs, const T* g, double scale, T* o, int threads) {      \
    const Shape shape{directions, batch, heads, length, keys, values, gate_width};                              \
    forward<T>(shape, reinterpret_cast<const Strides*>(strides), q, k, v, vs, g, T(scale), o, threads);          \
  }                                                                                                              \
  void mixerbench_gated_recurrence_bwd_##suffix(int64_t directions, int64_t batch, int64_t heads, int64_t length, \
                                                int64_t keys, int64_t values, int64_t gate_width,                \
                                                const int64_t* strides, const T* q, const T* k, const T* v,      \
                                                const T* vs, const T* g, double scale, const T* dout, T* dq,     \
                                                T* dk, T* dv, T* dvs, T* dg, int threads) {                      \
    const Shape shape{directions, batch, heads, length, keys, values, gate_width};                              \
    backward<T>(shape, reinterpret_cast<const Strides*>(strides), q, k, v, vs, g, T(scale), dout, dq, dk, dv,    \
                dvs, dg, threads);                                                                               \
  }

MIXERBENCH_GATED_RECURRENCE_ENTRY(float, f32)
MIXERBENCH_GATED_RECURRENCE_ENTRY(double, f64)

}  // extern "C"

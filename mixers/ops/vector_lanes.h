// Element-wise math the compiled CPU kernels share (mixers/ops/*/cpp_*.cpp): a float exp written so the compiler
// vectorises it without -ffast-math, sigmoid and silu on it, and the 16- and 8-float vector types the AVX-512 and
// AVX2 builds write loops in. Header-only, in an anonymous namespace, so each kernel's library has its own copy;
// the builds track it as a dependency of the source that includes it (torch's ninja files keep gcc's dependency
// lists), so editing it rebuilds them.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

// 16 floats, and their bits, in the compiler's vector extensions (the kernels need GCC or clang already). Only
// AVX-512 builds (kRegister16, where 16 floats are one register) run them in hot loops: built for AVX2 or SSE2 the
// scan's shuffle networks ran slower than the compiler's vectorisation of the scalar loops.
typedef float F16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));
#if defined(__AVX512F__)
constexpr bool kRegister16 = true;
#else
constexpr bool kRegister16 = false;
#endif
// 8 floats, one register in AVX2 builds (kRegister8), where a loop the compiler vectorised only behind a runtime
// check, with a scalar copy beside it, is written in these instead (the scan's softplus and gate). F16 is no
// substitute there: GCC lowered its compares and selects to scalar code, and the scan ran three times slower.
typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
#if defined(__AVX2__) && !defined(__AVX512F__)
constexpr bool kRegister8 = true;
#else
constexpr bool kRegister8 = false;
#endif
// The wider of the two that is one register in this build (F16 on AVX-512, F8 on AVX2; kRegisterVector: either),
// for the loops written in vectors on both.
#if defined(__AVX512F__)
typedef F16 FRegister;
#else
typedef F8 FRegister;
#endif
constexpr bool kRegisterVector = kRegister16 || kRegister8;

// The integer type of a float's bits, or of a vector's: exp_lane is one source for the loops the compiler vectorises
// (float) and those written in vectors (F16, F8).
template <class V> struct BitsOf { using type = int32_t; };
template <> struct BitsOf<F16> { using type = I16; };
template <> struct BitsOf<F8> { using type = I8; };

constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer, kept in the low mantissa bits

// exp(r) for exp(x) = 2^n exp(r), with x / ln 2 + kShifter into `biased` (n = biased - kShifter, an integer).
template <class V>
__attribute__((always_inline)) inline V exp_reduced(V x, V& biased) {
  biased = x * 1.44269504088896341f + kShifter;
  const V n = biased - kShifter;
  V r = x - n * 0.693145751953125f;  // ln 2's high part (exact times any n here), then the rest
  r = r - n * 1.42860677e-6f;
  V p = r * 8.290305733680725e-3f + 4.18979749083519e-2f;
  p = p * r + 1.666763722896576e-1f;
  p = p * r + 4.999915063381195e-1f;
  p = p * r + 9.999997019767761e-1f;
  return p * r + 1.0f;
}

// exp(x) = 2^n exp(r) with n = round(x / ln 2) and r = x - n ln 2 (|r| <= ln2 / 2) in two fused steps (ln 2 in two
// parts, so r keeps float precision at any n); exp(r) a degree-5 minimax polynomial (relative error 1e-7 before
// rounding; about 2 ulp after), 2^n written into the exponent bits. With Cephes' expf (degree 6, separate clamps and
// conversions) the scan's forward took 20% longer on AVX-512 and 39% longer on AVX2 (1,024 tokens, one thread).
// Below -87.3 the result would be below float's smallest normal and is flushed to 0 (a denormal decay slows every
// later step). NaN goes through the arithmetic.
//
// For x <= 88 only (the exponent bits overflow above): the callers' arguments that are <= 0 by construction
// (softplus's and sigmoid's exp(-|x|), the scan's decays where delta went through softplus and A <= 0) skip the cap
// exp_lane adds, two of its seventeen vector operations.
template <class V>
__attribute__((always_inline)) inline V exp_nonpositive_lane(V x) {
  const V floor = V{} - 87.3f, zero = V{};  // V{} + c: c, or c in every lane
  V biased;
  const V p = exp_reduced(x, biased);
  typename BitsOf<V>::type bits;
  std::memcpy(&bits, &biased, sizeof bits);
  bits = (bits - 0x4B400000 + 127) << 23;  // n from biased's low bits (those of 1.5 * 2^23 taken off), plus the bias
  V scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const V out = p * scale;
  return x < floor ? zero : out;
}

// exp for any x: capped at 88, so the bits stay finite.
template <class V>
__attribute__((always_inline)) inline V exp_lane(V x) {
  const V cap = V{} + 88.0f;
  return exp_nonpositive_lane(x > cap ? cap : x);
}

#if defined(__AVX512F__)
// 16 floats at once (the loops written in F16): p 2^n in one instruction, vscalefps, which also gives inf above
// float's range and 0 below, so neither the cap nor the integer steps are needed (4 of the 15 operations after the
// argument's product; the scan's forward at 1,024 tokens took a seventh less time on an Intel Xeon). The flush
// below -87.3 stays, for the reason above; NaN still goes through (an unordered compare keeps its lane).
template <>
__attribute__((always_inline)) inline F16 exp_lane<F16>(F16 x) {
  F16 biased;
  const F16 p = exp_reduced(x, biased);
  const __mmask16 normal = _mm512_cmp_ps_mask(__m512(x), _mm512_set1_ps(-87.3f), _CMP_NLT_UQ);
  return F16(_mm512_maskz_scalef_ps(normal, __m512(p), __m512(biased - kShifter)));
}
template <>
__attribute__((always_inline)) inline F16 exp_nonpositive_lane<F16>(F16 x) {
  return exp_lane(x);  // vscalefps needs no cap
}
#endif

inline double exp_lane(double x) { return std::exp(x); }
inline double exp_nonpositive_lane(double x) { return std::exp(x); }

// a / b; in 16-float registers (AVX-512) a times b's reciprocal from vrcp14ps refined by one Newton step (relative
// error about 2^-28 before rounding, so the quotient is within an ulp or two of the division's), where a vector
// division issues once in ten or more cycles. With this exp and division, the scan's softplus and gate in 16-float
// registers took a tenth off its forward at 1,024 tokens (Intel Xeon).
template <class V>
__attribute__((always_inline)) inline V divide_lane(V a, V b) {
  return a / b;
}

#if defined(__AVX512F__)
template <>
__attribute__((always_inline)) inline F16 divide_lane<F16>(F16 a, F16 b) {
  const F16 r0 = F16(_mm512_rcp14_ps(__m512(b)));
  return a * (r0 + r0 * (1.0f - b * r0));
}
#endif

// sigmoid(x) from e = exp(-|x|) <= 1, so nothing overflows: 1 / (1 + e) for x >= 0, e / (1 + e) below. T is float,
// double or F16 (T{} + c: c in every lane).
template <class T>
__attribute__((always_inline)) inline T sigmoid_lane(T x) {
  const T zero = T{}, one = T{} + 1.0f;
  const T e = exp_nonpositive_lane(x < zero ? x : -x);
  return divide_lane(x < zero ? e : one, one + e);
}

// x sigmoid(x): the scan's z gate, the token conv's activation.
template <class T>
__attribute__((always_inline)) inline T silu_lane(T x) {
  return x * sigmoid_lane(x);
}

}  // namespace

// exp and exp2 on Highway vectors, and row loops with a partial tail, for the kernels compiled per SIMD target
// (docs/performance.md). Included from inside a foreach_target translation unit, so it has a per-target include
// guard instead of #pragma once.
// Both reduce to 2^n * e^r with |r| <= ln2/2 and a degree-7 Taylor polynomial (truncation < 1e-8 relative):
// the same formulas as the scalar ops/fast_exp.h, about 2 ulp.
#if defined(HLM_OPS_SIMD_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef HLM_OPS_SIMD_MATH_INL_H_
#undef HLM_OPS_SIMD_MATH_INL_H_
#else
#define HLM_OPS_SIMD_MATH_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// e^r for |r| <= ln2/2 (Horner, FMA where the target has it).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V exp_reduced(D d, V r) {
  V p = hn::Set(d, 1.f / 5040.f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.f / 720.f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f / 120.f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f / 24.f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f / 6.f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.f));
  return hn::MulAdd(p, r, hn::Set(d, 1.f));
}

// 2^n for integral n in [-126, 127] (held in a float vector).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V pow2i(D d, V n) {
  const hn::RebindToSigned<D> di;
  return hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127))));
}

// p * 2^n for integral n in [-126, 127] (held in a float vector). On AVX-512 one vscalefps instead of the float to
// int conversion (Highway's carries a fix-up for out-of-range lanes), shift, add and multiply of pow2i: the same
// exactly scaled, once rounded product, so the same bits.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V mul_pow2(D d, V p, V n) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (sizeof(V) == 64) return V{_mm512_scalef_ps(p.raw, n.raw)};
  if constexpr (sizeof(V) == 32) return V{_mm256_scalef_ps(p.raw, n.raw)};
  if constexpr (sizeof(V) == 16) return V{_mm_scalef_ps(p.raw, n.raw)};
#endif
  return hn::Mul(p, pow2i(d, n));
}

// 2^x; 0 where x < -125 (where 2^x is near or below the subnormal range) or where `valid` is false.
template <class D, class V = hn::Vec<D>, class M = hn::Mask<D>>
HWY_INLINE V exp2_masked(D d, V x, M valid) {
  valid = hn::And(valid, hn::Ge(x, hn::Set(d, -125.f)));
  x = hn::Min(hn::IfThenElseZero(valid, x), hn::Set(d, 127.f));  // also clears NaN (-inf - -inf) lanes
  const V n = hn::Round(x);
  const V r = hn::Mul(hn::Sub(x, n), hn::Set(d, 0.6931471805599453f));
  return hn::IfThenElseZero(valid, mul_pow2(d, exp_reduced(d, r), n));
}

// e^x on [-87.3, 88.37] (Cody-Waite reduction), 0 below, saturated above: ops/fast_exp.h on vectors.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V exp(D d, V x) {
  const V lo = hn::Set(d, -87.3f);
  const V xc = hn::Min(hn::Max(x, lo), hn::Set(d, 88.37f));
  const V n = hn::Round(hn::Mul(xc, hn::Set(d, 1.44269504088896341f)));
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693145751953125f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, 1.42860682030941723212e-6f), r);
  return hn::IfThenZeroElse(hn::Lt(x, lo), mul_pow2(d, exp_reduced(d, r), n));
}

// logistic(x) = sigmoid(x) = 1 / (1 + e^-x) through exp() above, which is 0 / saturated at the extremes: stays finite.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V logistic(D d, V x) {
  const V one = hn::Set(d, 1.f);
  return hn::Div(one, hn::Add(one, exp(d, hn::Neg(x))));
}

// ---- loops over a row of n elements in whole vectors and one partial tail -------------------------------------
// The elementwise kernels (SwiGLU, RMSNorm, RoPE, conv1d) are written once as body(i, count): `count` lanes from
// index i, count == Lanes(d) except in the tail, where loads zero the missing lanes and stores leave them untouched.

// Whether Highway's MaskedLoad and BlendedStore on this target read or write lanes outside the mask. On NEON (and
// EMU128's MaskedLoad) they are a whole-vector load, then a blend, and for BlendedStore a whole-vector store of
// what was loaded: past the end of a row that reads, and writes back, memory the kernel does not own (a fault
// where the row ends a page; a lost update where another thread writes the next element). Such targets copy the
// first `count` lanes through a buffer instead. AVX2 (vmaskmov) and AVX-512 (masked moves) touch only the mask.
constexpr bool kMaskedOpsTouchWholeVector = HWY_TARGET == HWY_NEON || HWY_TARGET == HWY_EMU128;

// The first `count` lanes from p (m = FirstN(d, count), hoisted by callers in loops), zero in the others.
template <class D>
HWY_INLINE hn::Vec<D> load_first(D d, hn::Mask<D> m, const hn::TFromD<D>* p, size_t count) {
  if constexpr (kMaskedOpsTouchWholeVector) {
    hn::TFromD<D> buf[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)] = {};
    for (size_t i = 0; i < count; ++i) buf[i] = p[i];
    return hn::LoadU(d, buf);
  } else {
    return hn::MaskedLoad(m, d, p);
  }
}

// Stores the first `count` lanes of v to p (m = FirstN(d, count)); p[count..] is not touched.
template <class D>
HWY_INLINE void store_first(D d, hn::Vec<D> v, hn::Mask<D> m, hn::TFromD<D>* p, size_t count) {
  if constexpr (kMaskedOpsTouchWholeVector) {
    hn::TFromD<D> buf[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)];
    hn::StoreU(v, d, buf);
    for (size_t i = 0; i < count; ++i) p[i] = buf[i];
  } else {
    hn::BlendedStore(v, m, d, p);
  }
}

template <class D>
HWY_INLINE hn::Vec<D> load_part(D d, const hn::TFromD<D>* p, size_t count) {
  if (count == hn::Lanes(d)) return hn::LoadU(d, p);
  return load_first(d, hn::FirstN(d, count), p, count);
}

template <class D>
HWY_INLINE void store_part(D d, hn::Vec<D> v, hn::TFromD<D>* p, size_t count) {
  if (count == hn::Lanes(d)) hn::StoreU(v, d, p);
  else store_first(d, v, hn::FirstN(d, count), p, count);
}

template <class D, class Body>
HWY_INLINE void for_each_vector(D d, int64_t n, const Body& body) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) body(i, static_cast<size_t>(L));
  if (i < n) body(i, static_cast<size_t>(n - i));
}

// dst[i] += rows[r * n + i] for r = 0, 1, ..., nrows - 1 in that order (per-chunk partials of a parameter
// gradient, summed in a fixed order: deterministic for a thread count).
template <class D>
HWY_INLINE void add_rows_in_order(D d, const hn::TFromD<D>* rows, int64_t nrows, int64_t n, hn::TFromD<D>* dst) {
  for (int64_t r = 0; r < nrows; ++r)
    for_each_vector(d, n, [&](int64_t i, size_t c) {
      store_part(d, hn::Add(load_part(d, dst + i, c), load_part(d, rows + r * n + i, c)), dst + i, c);
    });
}

// sum over lanes, in the vector's element type.
template <class D>
HWY_INLINE hn::TFromD<D> sum_lanes(D d, hn::Vec<D> v) {
  return hn::GetLane(hn::SumOfLanes(d, v));
}

// dst[i] = a * src[i] for i < n; dst may be src.
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE void scale_row(D d, T a, const T* src, T* dst, int64_t n) {
  const auto av = hn::Set(d, a);
  for_each_vector(d, n, [&](int64_t i, size_t c) { store_part(d, hn::Mul(av, load_part(d, src + i, c)), dst + i, c); });
}

// y[i] += a * x[i] for i < n.
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE void axpy_row(D d, T a, const T* x, T* y, int64_t n) {
  const auto av = hn::Set(d, a);
  for_each_vector(d, n, [&](int64_t i, size_t c) {
    store_part(d, hn::MulAdd(av, load_part(d, x + i, c), load_part(d, y + i, c)), y + i, c);
  });
}

// The first `count` bf16 values at p widened to fp32 (exact: a bf16 is the upper half of an fp32); lanes past
// `count` read as zero.
template <class D>
HWY_INLINE hn::Vec<D> load_bf16_part(D d, const uint16_t* p, size_t count) {
  static_assert(std::is_same_v<hn::TFromD<D>, float>);
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<uint16_t, D> d16;
  auto widen = [&](const uint16_t* q) {
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, q))));
  };
  if (count == hn::Lanes(d)) return widen(p);
  uint16_t buf[HWY_MAX_BYTES / sizeof(float)] = {};  // zeroed only for a partial tail
  for (size_t i = 0; i < count; ++i) buf[i] = p[i];
  return widen(buf);
}

// Stores the first `count` lanes of v to p as bf16, rounded exactly as ops::to_bf16 (nearest, ties to even; a NaN
// stays a NaN), so a kernel that writes a bf16 step's matmul operand directly gives the bits that rounding its
// fp32 output afterwards would. A partial tail goes through a buffer: 16-bit masked stores are not native on
// every target.
template <class D>
HWY_INLINE void store_bf16_part(D d, hn::Vec<D> v, uint16_t* p, size_t count) {
  static_assert(std::is_same_v<hn::TFromD<D>, float>);
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const hn::Rebind<uint16_t, D> d16;
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), lsb)));
  const auto quiet_nan = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  const auto bits = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan, rounded);
  const auto half = hn::DemoteTo(d16, hn::BitCast(di, bits));  // every value is below 2^16: no saturation
  if (count == hn::Lanes(d)) {
    hn::StoreU(half, d16, p);
  } else {
    uint16_t buf[HWY_MAX_BYTES / sizeof(float)];
    hn::StoreU(half, d16, buf);
    for (size_t i = 0; i < count; ++i) p[i] = buf[i];
  }
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // HLM_OPS_SIMD_MATH_INL_H_

// LM head + cross-entropy, fused and tiled over the vocabulary (the logits never exist whole). The per-row
// softmax statistics and gradients are written once with Google Highway and dispatched per SIMD target at run
// time (docs/performance.md); the tiling, the matmuls (oneDNN) and the fixed-order reductions are shared.
#include "ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/aligned.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/simd_target.h"
#include "ops/add.h"
#include "ops/matmul.h"
#include "ops/matmul_bf16.h"
#include "ops/precision.h"

#include "core/simd_config.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cross_entropy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "ops/simd_math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace hlm::ops::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// One row of a logits tile against the running log-sum-exp state (m, s) of its row: m becomes
// max(m, max(row)), s is rescaled to it and gains sum exp(row - m). exp(-inf) = 0 covers the first chunk.
void ce_row_lse_impl(const float* row, i64 cols, float* m, float* s) {
  const DF d;
  VF vmax = hn::Set(d, -std::numeric_limits<float>::infinity());
  for_each_vector(d, cols, [&](i64 k, size_t c) {
    const VF x = load_part(d, row + k, c);
    vmax = c == hn::Lanes(d) ? hn::Max(vmax, x) : hn::IfThenElse(hn::FirstN(d, c), hn::Max(vmax, x), vmax);
  });
  const float m_new = std::max(*m, hn::GetLane(hn::MaxOfLanes(d, vmax)));
  const VF vm = hn::Set(d, m_new);
  VF acc = hn::Zero(d);
  for_each_vector(d, cols, [&](i64 k, size_t c) {
    const VF e = exp(d, hn::Sub(load_part(d, row + k, c), vm));
    acc = hn::Add(acc, c == hn::Lanes(d) ? e : hn::IfThenElseZero(hn::FirstN(d, c), e));
  });
  const float scale = hn::GetLane(exp(d, hn::Set(d, *m - m_new)));  // 0 when *m is -inf
  *s = *s * scale + sum_lanes(d, acc);
  *m = m_new;
}

// dlogits of one row in place: exp(row - lse) * grad_scale (the target's -grad_scale is the caller's).
void ce_row_grad_impl(float* row, i64 cols, float lse, float grad_scale) {
  const DF d;
  const VF vl = hn::Set(d, lse), vg = hn::Set(d, grad_scale);
  for_each_vector(d, cols, [&](i64 k, size_t c) {
    store_part(d, hn::Mul(exp(d, hn::Sub(load_part(d, row + k, c), vl)), vg), row + k, c);
  });
}

}  // namespace hlm::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hlm::ops {

HWY_EXPORT(ce_row_lse_impl);
HWY_EXPORT(ce_row_grad_impl);

namespace {

// Bounds: scratch partials (floats; 128 MiB) and the fused pass's [rows, V] logits block (floats; 4 MiB).
constexpr i64 kMaxScratchFloats = i64{32} << 20;
constexpr i64 kFusedBlockFloats = i64{1} << 20;

// A tile of logits computed at once by one thread: rows x cols floats (kept in L2); its row stride is
// padded so that consecutive rows do not alias in L1.
inline i64 tile_ld(const CeTiling& t) { return t.cols + 16; }

// Threads form a p x q grid: p row groups x q vocab groups. Thread (i, j) owns rows R_i and vocab
// chunks V_j. In backward, dh rows R_i get one partial per vocab group and dW rows V_j one partial per
// row group; partial 0 is the output itself, the rest are scratch summed in a fixed order afterwards.
struct Grid {
  i64 p = 1, q = 1;
};

Grid choose_grid(i64 N, i64 D, i64 V, const CeTiling& tl) {
  const i64 nchunks = (V + tl.cols - 1) / tl.cols;
  if (tl.grid_p > 0 && tl.grid_q > 0) return {std::min(tl.grid_p, N), std::min(tl.grid_q, nchunks)};
  const i64 nt = std::max(1, num_threads());
  const i64 max_scratch = kMaxScratchFloats;
  Grid best;
  i64 best_work = 1, best_cost = 0;
  for (i64 p = 1; p <= nt; ++p) {
    const i64 q = std::min(nt / p, nchunks);
    if (p > N || q < 1) continue;
    const i64 cost = (q - 1) * N * D + (p - 1) * V * D;  // scratch floats written and summed in backward
    if (cost > max_scratch) continue;
    const i64 work = p * q;
    if (work > best_work || (work == best_work && cost < best_cost)) best = {p, q}, best_work = work, best_cost = cost;
  }
  return best;
}

// Per-thread logits tile, reused across calls.
float* tile_buffer(const CeTiling& tl) {
  thread_local std::vector<float> buf;
  const size_t n = static_cast<size_t>(tl.rows * tile_ld(tl));
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

void check_args(const char* op, const int32_t* targets, i64 N, i64 D, i64 V, const CeTiling& tl) {
  HLM_CHECK(N >= 0 && D > 0 && V > 0, "{}: bad shape h[{}, {}] W[{}, {}]", op, N, D, V, D);
  HLM_CHECK(tl.rows > 0 && tl.cols > 0 && tl.grid_p >= 0 && tl.grid_q >= 0,
            "{}: bad tiling rows={} cols={} grid {}x{} (h[{}, {}] W[{}, {}])", op, tl.rows, tl.cols, tl.grid_p,
            tl.grid_q, N, D, V, D);
  for (i64 n = 0; n < N; ++n)
    HLM_CHECK(targets[n] < V, "{}: target {} at row {} >= V={} (h[{}, {}] W[{}, {}])", op, targets[n], n, V, N, D, V,
              D);
}

// The head's operands under --precision bf16 (ops/precision.h): h and W rounded once per call, in the calling
// thread, before the tiles fan out; both null under fp32.
struct Bf16Operands {
  const bf16* h = nullptr;
  const bf16* W = nullptr;
  Bf16Operands(const float* h32, const float* W32, i64 N, i64 D, i64 V) {
    if (precision() != Precision::bf16 || N == 0) return;
    thread_local aligned_vector<bf16> hb, Wb;
    if (hb.size() < static_cast<size_t>(N * D)) hb.resize(static_cast<size_t>(N * D));
    if (Wb.size() < static_cast<size_t>(V * D)) Wb.resize(static_cast<size_t>(V * D));
    round_to_bf16(h32, N, D, D, hb.data());
    round_to_bf16(W32, V, D, D, Wb.data());
    h = hb.data(), W = Wb.data();
  }
};

// logits tile[rows, cols] = h[rb : rb + rows] W[v0 : v0 + cols]^T, in the matmul precision.
void logits_tile(const float* h, const float* W, const Bf16Operands& b, i64 rb, i64 rows, i64 v0, i64 cols, i64 D,
                 float* tile, i64 ldt) {
  if (b.h) matmul_bf16(false, true, rows, cols, D, 1.f, b.h + rb * D, D, b.W + v0 * D, D, 0.f, tile, ldt);
  else matmul(false, true, rows, cols, D, 1.f, h + rb * D, D, W + v0 * D, D, 0.f, tile, ldt);
}

// Row range of group g out of G over n items.
inline i64 split(i64 n, i64 g, i64 G) { return n * g / G; }

// dst[0, n) += parts[0][0, n) + parts[1][0, n) + ... (count partials of n floats each), in partial order.
void add_partials(float* dst, const float* parts, i64 count, i64 n) {
  for (i64 j = 0; j < count; ++j) add_into(dst, parts + j * n, n);
}

}  // namespace

double lm_head_ce_forward(const float* h, const float* W, const int32_t* targets, i64 N, i64 D, i64 V, float* lse,
                          float* token_loss) {
  return lm_head_ce_forward(h, W, targets, N, D, V, lse, token_loss, CeTiling{});
}

void lm_head_ce_backward(const float* h, const float* W, const int32_t* targets, const float* lse, i64 N, i64 D,
                         i64 V, float grad_scale, float* dh, float* dW) {
  lm_head_ce_backward(h, W, targets, lse, N, D, V, grad_scale, dh, dW, CeTiling{});
}

double lm_head_ce_forward(const float* h, const float* W, const int32_t* targets, i64 N, i64 D, i64 V, float* lse,
                          float* token_loss, const CeTiling& tl) {
  check_args("lm_head_ce_forward", targets, N, D, V, tl);
  if (N == 0) return 0.0;
  init_simd();
  const Grid g = choose_grid(N, D, V, tl);
  const i64 R = tl.rows, C = tl.cols, ldt = tile_ld(tl);
  const i64 nchunks = (V + C - 1) / C;
  const Bf16Operands b16(h, W, N, D, V);
  // Online log-sum-exp partials per vocab group: running max and sum of exp(logit - max).
  std::vector<float> part_m(g.q * N), part_s(g.q * N);  // [q, N]
  std::vector<float> tgt(N, 0.f);                         // [N] target logit (written by the owning group)

  parallel_for_each(g.p * g.q, [&](i64 t) {
    const i64 i = t / g.q, j = t % g.q;
    const i64 r0 = split(N, i, g.p), r1 = split(N, i + 1, g.p);
    const i64 c0 = split(nchunks, j, g.q), c1 = split(nchunks, j + 1, g.q);
    float* tile = tile_buffer(tl);  // [R, ldt]
    float* M = part_m.data() + j * N;
    float* S = part_s.data() + j * N;
    for (i64 rb = r0; rb < r1; rb += R) {
      const i64 rows = std::min(R, r1 - rb);
      for (i64 r = rb; r < rb + rows; ++r) M[r] = -std::numeric_limits<float>::infinity(), S[r] = 0.f;
      for (i64 c = c0; c < c1; ++c) {
        const i64 v0 = c * C, cols = std::min(C, V - v0);
        logits_tile(h, W, b16, rb, rows, v0, cols, D, tile, ldt);
        for (i64 r = 0; r < rows; ++r) {
          const float* row = tile + r * ldt;
          HWY_DYNAMIC_DISPATCH(ce_row_lse_impl)(row, cols, M + rb + r, S + rb + r);
          const i64 tg = targets[rb + r];
          if (tg >= v0 && tg < v0 + cols) tgt[rb + r] = row[tg - v0];
        }
      }
    }
  });

  // Combine the vocab-group partials in group order, then sum losses in row order (deterministic).
  double total = 0.0;
  for (i64 n = 0; n < N; ++n) {
    float m = part_m[n];
    for (i64 j = 1; j < g.q; ++j) m = std::max(m, part_m[j * N + n]);
    double s = 0.0;
    for (i64 j = 0; j < g.q; ++j) s += static_cast<double>(part_s[j * N + n]) * std::exp(double(part_m[j * N + n]) - m);
    const double l = static_cast<double>(m) + std::log(s);
    lse[n] = static_cast<float>(l);
    const double loss = targets[n] >= 0 ? l - static_cast<double>(tgt[n]) : 0.0;
    if (token_loss) token_loss[n] = static_cast<float>(loss);
    total += loss;
  }
  return total;
}

void lm_head_ce_backward(const float* h, const float* W, const int32_t* targets, const float* lse, i64 N, i64 D,
                         i64 V, float grad_scale, float* dh, float* dW, const CeTiling& tl) {
  check_args("lm_head_ce_backward", targets, N, D, V, tl);
  if (N == 0) return;
  init_simd();
  const Grid g = choose_grid(N, D, V, tl);
  const i64 R = tl.rows, C = tl.cols, ldt = tile_ld(tl);
  const i64 nchunks = (V + C - 1) / C;
  const Bf16Operands b16(h, W, N, D, V);
  // Scratch partials: dh for vocab groups 1..q-1 ([q-1, N, D]), dW for row groups 1..p-1 ([p-1, V, D]).
  // Kept per calling thread and only grown, so steady-state training does not page-fault here.
  thread_local std::vector<float> scratch;
  const size_t need = static_cast<size_t>((g.q - 1) * N * D + (g.p - 1) * V * D);
  if (scratch.size() < need) scratch.resize(need);
  float* dh_part = scratch.data();
  float* dW_part = scratch.data() + (g.q - 1) * N * D;

  parallel_for_each(g.p * g.q, [&](i64 t) {
    const i64 i = t / g.q, j = t % g.q;
    const i64 r0 = split(N, i, g.p), r1 = split(N, i + 1, g.p);
    const i64 c0 = split(nchunks, j, g.q), c1 = split(nchunks, j + 1, g.q);
    float* tile = tile_buffer(tl);                                      // [R, ldt] dlogits
    float* dh_dst = j == 0 ? dh : dh_part + (j - 1) * N * D;          // [N, D]
    float* dW_dst = i == 0 ? dW : dW_part + (i - 1) * V * D;          // [V, D]
    for (i64 rb = r0; rb < r1; rb += R) {
      const i64 rows = std::min(R, r1 - rb);
      for (i64 c = c0; c < c1; ++c) {
        const i64 v0 = c * C, cols = std::min(C, V - v0);
        logits_tile(h, W, b16, rb, rows, v0, cols, D, tile, ldt);
        // dlogits = (softmax - onehot) * grad_scale; ignored rows contribute nothing.
        for (i64 r = 0; r < rows; ++r) {
          float* row = tile + r * ldt;
          const i64 tg = targets[rb + r];
          if (tg < 0) {
            std::fill(row, row + cols, 0.f);
            continue;
          }
          HWY_DYNAMIC_DISPATCH(ce_row_grad_impl)(row, cols, lse[rb + r], grad_scale);
          if (tg >= v0 && tg < v0 + cols) row[tg - v0] -= grad_scale;
        }
        // dh[rows, D] (+)= dlogits[rows, cols] W[v0:v0+cols, D]; the group's first chunk overwrites.
        // dW[v0:v0+cols, D] += dlogits^T h[rows, D]; a scratch partial is overwritten by its first row tile.
        const float beta_dh = c == c0 ? 0.f : 1.f, beta = (i == 0 || rb != r0) ? 1.f : 0.f;
        if (b16.h) {
          thread_local aligned_vector<bf16> tb;  // dlogits in bf16, dense [rows, cols]
          if (tb.size() < static_cast<size_t>(R * C)) tb.resize(static_cast<size_t>(R * C));
          round_to_bf16(tile, rows, cols, ldt, tb.data());
          matmul_bf16(false, false, rows, D, cols, 1.f, tb.data(), cols, b16.W + v0 * D, D, beta_dh, dh_dst + rb * D, D);
          matmul_bf16(true, false, cols, D, rows, 1.f, tb.data(), cols, b16.h + rb * D, D, beta, dW_dst + v0 * D, D);
        } else {
          matmul(false, false, rows, D, cols, 1.f, tile, ldt, W + v0 * D, D, beta_dh, dh_dst + rb * D, D);
          matmul(true, false, cols, D, rows, 1.f, tile, ldt, h + rb * D, D, beta, dW_dst + v0 * D, D);
        }
      }
    }
  });

  add_partials(dh, dh_part, g.q - 1, N * D);
  add_partials(dW, dW_part, g.p - 1, V * D);
}

namespace {
// The fused pass's layout: p row groups (one per thread), blocks of R rows whose logits rows are padded to ldt floats,
// a dW partial of V * D floats per row group but the first; fused == false where lm_head_ce_forward_backward makes the
// two calls instead.
struct FusedPlan {
  bool fused = false;
  i64 p = 1, R = 1, ldt = 1, partial = 0;
  i64 partials_floats() const { return (p - 1) * partial; }
  i64 workspace_floats() const { return fused ? partials_floats() + p * R * ldt : 0; }
};
FusedPlan fused_plan(i64 N, i64 D, i64 V, const CeTiling& tl) {
  FusedPlan f;
  f.p = tl.grid_p > 0 ? std::min(tl.grid_p, N) : std::min<i64>(std::max(1, num_threads()), N);
  f.partial = V * D;
  f.fused = N > 0 && tl.grid_q <= 1 && f.partials_floats() <= kMaxScratchFloats;
  f.R = tl.fused_rows > 0 ? tl.fused_rows : std::clamp<i64>(kFusedBlockFloats / V, 8, 256);
  f.ldt = V + 16;  // padded like tile_ld, so consecutive rows do not alias in L1
  return f;
}
}  // namespace

i64 lm_head_ce_workspace_floats(i64 N, i64 D, i64 V, const CeTiling& tl) {
  return fused_plan(N, D, V, tl).workspace_floats();
}

double lm_head_ce_forward_backward(const float* h, const float* W, const int32_t* targets, i64 N, i64 D, i64 V,
                                   float grad_scale, float* lse, float* token_loss, float* dh, float* dW,
                                   const CeTiling& tl, float* workspace, i64 workspace_floats) {
  check_args("lm_head_ce_forward_backward", targets, N, D, V, tl);
  if (N == 0) return 0.0;
  const FusedPlan plan = fused_plan(N, D, V, tl);
  if (!plan.fused) {
    const double loss = lm_head_ce_forward(h, W, targets, N, D, V, lse, token_loss, tl);
    lm_head_ce_backward(h, W, targets, lse, N, D, V, grad_scale, dh, dW, tl);
    return loss;
  }
  init_simd();
  const i64 p = plan.p, R = plan.R, ldt = plan.ldt;
  const Bf16Operands b16(h, W, N, D, V);
  // The dW partials of row groups 1..p-1 ([p-1, V, D]), then one [R, ldt] block per row group: logits, then dlogits
  // in place. In the caller's workspace when it is large enough, else in buffers kept per thread (only grown).
  const bool in_workspace = workspace != nullptr && workspace_floats >= plan.workspace_floats();
  float* dW_part = workspace;
  if (!in_workspace) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < static_cast<size_t>(plan.partials_floats()))
      scratch.resize(static_cast<size_t>(plan.partials_floats()));
    dW_part = scratch.data();
  }
  std::vector<double> row_loss(static_cast<size_t>(N));

  parallel_for_each(p, [&](i64 i) {
    const i64 r0 = split(N, i, p), r1 = split(N, i + 1, p);
    float* block = nullptr;
    if (in_workspace) {
      block = workspace + plan.partials_floats() + i * R * ldt;
    } else {
      thread_local std::vector<float> own;
      if (own.size() < static_cast<size_t>(R * ldt)) own.resize(static_cast<size_t>(R * ldt));
      block = own.data();
    }
    float* dW_dst = i == 0 ? dW : dW_part + (i - 1) * V * D;
    for (i64 rb = r0; rb < r1; rb += R) {
      const i64 rows = std::min(R, r1 - rb);
      logits_tile(h, W, b16, rb, rows, 0, V, D, block, ldt);
      for (i64 r = 0; r < rows; ++r) {
        float* row = block + r * ldt;
        float m = -std::numeric_limits<float>::infinity(), s = 0.f;
        HWY_DYNAMIC_DISPATCH(ce_row_lse_impl)(row, V, &m, &s);
        const double l = static_cast<double>(m) + std::log(static_cast<double>(s));
        lse[rb + r] = static_cast<float>(l);
        const i64 tg = targets[rb + r];
        if (tg < 0) {
          row_loss[rb + r] = 0.0;
          std::fill(row, row + V, 0.f);
          continue;
        }
        row_loss[rb + r] = l - static_cast<double>(row[tg]);
        HWY_DYNAMIC_DISPATCH(ce_row_grad_impl)(row, V, lse[rb + r], grad_scale);
        row[tg] -= grad_scale;
      }
      // dh rows = dlogits W (overwritten); dW (+)= dlogits^T h rows (a scratch partial: overwritten first).
      const float beta = (i == 0 || rb != r0) ? 1.f : 0.f;
      if (b16.h) {
        thread_local aligned_vector<bf16> tb;  // dlogits in bf16, dense [rows, V]
        if (tb.size() < static_cast<size_t>(R * V)) tb.resize(static_cast<size_t>(R * V));
        round_to_bf16(block, rows, V, ldt, tb.data());
        matmul_bf16(false, false, rows, D, V, 1.f, tb.data(), V, b16.W, D, 0.f, dh + rb * D, D);
        matmul_bf16(true, false, V, D, rows, 1.f, tb.data(), V, b16.h + rb * D, D, beta, dW_dst, D);
      } else {
        matmul(false, false, rows, D, V, 1.f, block, ldt, W, D, 0.f, dh + rb * D, D);
        matmul(true, false, V, D, rows, 1.f, block, ldt, h + rb * D, D, beta, dW_dst, D);
      }
    }
  });

  add_partials(dW, dW_part, p - 1, V * D);
  double total = 0.0;  // in row order: the same sum for any thread count
  for (i64 n = 0; n < N; ++n) {
    if (token_loss) token_loss[n] = static_cast<float>(row_loss[n]);
    total += row_loss[n];
  }
  return total;
}

}  // namespace hlm::ops
#endif  // HWY_ONCE

#include "mixers/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/arena_count.h"
#include "core/parallel.h"
#include "ops/attention.h"
#include "ops/fast_exp.h"
#include "ops/matmul.h"
#include "ops/rmsnorm.h"

namespace hlm {

namespace {

struct KvCache final : MixerState {
  // Full attention: capacity = max_len; sliding window: a ring buffer of `window` entries.
  i64 capacity = 0, pos = 0, B = 0, width = 0;
  std::vector<float> k, v;  // [B, capacity, Hkv*hd]
  // step()'s buffers: qkv [B, W3], o [B, H*hd], scores [B*H, capacity], qk-norm rstd, 1/sum [B*H], positions.
  std::vector<float> qkv, o, sc, rstd, inv;
  std::vector<int32_t> posv;
  i64 bytes() const override {
    return static_cast<i64>((k.size() + v.size() + qkv.size() + o.size() + sc.size() + rstd.size() + inv.size()) *
                                sizeof(float) +
                            posv.size() * sizeof(int32_t));
  }
};

}  // namespace

AttentionMixer::AttentionMixer(const MixerSpec& spec, ParamRegistry& reg) : letter_(spec.letter) {
  const auto& t = spec.type;
  D_ = spec.d_model;
  H_ = t.n_heads;
  Hkv_ = t.n_kv_heads;
  hd_ = t.head_dim;
  window_ = letter_ == 'S' ? t.window : 0;
  rope_ = t.rope;
  qk_norm_ = t.qk_norm;
  if (t.query_pre_attn_scalar > 0) scale_ = static_cast<float>(std::pow(t.query_pre_attn_scalar, -0.5));
  const std::string p = spec.name_prefix + "self_attn.";
  const double in_std = spec.init_std;
  int iq = reg.add(p + "q_proj.weight", {H_ * hd_, D_}, Init::Normal, in_std);
  reg.add(p + "k_proj.weight", {Hkv_ * hd_, D_}, Init::Normal, in_std, 0, true, true);
  reg.add(p + "v_proj.weight", {Hkv_ * hd_, D_}, Init::Normal, in_std, 0, true, true);
  off_wqkv_ = reg.info(iq).offset;
  off_wo_ = reg.info(reg.add(p + "o_proj.weight", {D_, H_ * hd_}, Init::Normal, spec.out_proj_init_std)).offset;
  if (qk_norm_) {
    off_qn_ = reg.info(reg.add(p + "q_norm.weight", {hd_}, Init::Ones, 0, 0, false)).offset;
    off_kn_ = reg.info(reg.add(p + "k_norm.weight", {hd_}, Init::Ones, 0, 0, false)).offset;
  }
  if (rope_) rope_tab_ = ops::RopeTable(spec.max_seq_len, hd_, spec.rope_theta);
  rope_theta_ = spec.rope_theta;
}

i64 AttentionMixer::effective_window() const {
  if (max_span_ <= 0) return window_;
  return window_ <= 0 ? max_span_ : std::min(window_, max_span_);
}

void AttentionMixer::ensure_rope(i64 T) {
  if (rope_ && rope_tab_.max_pos < T) rope_tab_ = ops::RopeTable(std::max(T, 2 * rope_tab_.max_pos), hd_, rope_theta_);
}

template <class Alloc>
AttentionMixer::ForwardBuffers AttentionMixer::forward_buffers(Alloc& arena, i64 B, i64 T) const {
  const i64 N = B * T, W3 = qkv_width();
  ForwardBuffers b;
  Saved& s = b.saved;
  s.qkv = arena.floats(N * W3, qk_norm_ ? "attention qkv before the QK norm" : "attention qkv");
  if (qk_norm_) s.qk_rstd = arena.floats(N * (H_ + Hkv_), "attention qk rstd");
  s.o = arena.floats(N * H_ * hd_, "attention out");
  s.lse = arena.floats(B * H_ * T, "attention lse");
  b.temp_mark = arena.mark();
  if (qk_norm_) b.qkv_normed = arena.floats(N * W3, "attention qkv normed");
  return b;
}

template <class Alloc>
AttentionMixer::BackwardBuffers AttentionMixer::backward_buffers(Alloc& arena, i64 B, i64 T) const {
  const i64 N = B * T;
  BackwardBuffers b;
  b.d_o = arena.floats(N * H_ * hd_, "attention d_out");
  b.dqkv = arena.floats(N * qkv_width(), "attention dqkv");
  if (qk_norm_) b.qkv_normed = arena.floats(N * qkv_width(), "attention d: qkv normed, recomputed");
  return b;
}

template <class Alloc>
AttentionMixer::PrefillBuffers AttentionMixer::prefill_buffers(Alloc& arena, i64 B, i64 T, i64 Tk) const {
  const i64 N = B * T, KW = Hkv_ * hd_;
  PrefillBuffers b;
  b.qkv = arena.floats(N * qkv_width(), "attention prefill qkv");
  if (qk_norm_) b.rstd = arena.floats(N * (H_ + Hkv_), "attention prefill qk rstd");
  b.pos = arena.ints(N, "attention prefill positions");
  b.o = arena.floats(N * H_ * hd_, "attention prefill out");
  b.lse = arena.floats(B * H_ * T, "attention prefill lse");
  if (Tk > 0) {
    b.ks = arena.floats(B * Tk * KW, "attention prefill staged keys");
    b.vs = arena.floats(B * Tk * KW, "attention prefill staged values");
  }
  return b;
}

ArenaUse AttentionMixer::arena_use(i64 B, i64 T) const {
  // A windowed prefill at its worst: a full window behind it, W-1 cached entries staged before the chunk's.
  const i64 w = effective_window(), Tk = w > 0 ? w - 1 + T : 0;
  return count_arena_use([&](ArenaCount& c) { c.release_to(forward_buffers(c, B, T).temp_mark); },
                         [&](ArenaCount& c) { backward_buffers(c, B, T); },
                         [&](ArenaCount& c) { prefill_buffers(c, B, T, Tk); });
}

FlopCount AttentionMixer::flops_per_token(i64 T) const {
  FlopCount f;
  f.matmul = 2.0 * (static_cast<double>(qkv_width()) * D_ + static_cast<double>(D_) * H_ * hd_);
  // QK^T and PV over the visible context, averaged over positions: mean of min(t+1, W).
  const i64 W = window_ > 0 ? window_ : T;
  double ctx = 0;
  for (i64 t = 0; t < T; ++t) ctx += static_cast<double>(std::min(t + 1, W));
  ctx /= static_cast<double>(T);
  f.core = 4.0 * H_ * hd_ * ctx;
  return f;
}

const ops::RopeTable& AttentionMixer::rope_rows(i64 pos0, i64 n) {
  if (pos0 + n <= rope_tab_.max_pos) return rope_tab_;
  // Past the training length: rows for positions pos0 .. pos0+n-1 only, so decoding memory does not grow
  // with the context.
  rope_rows_.fill(pos0, n, hd_, rope_theta_);
  return rope_rows_;
}

void AttentionMixer::norm_and_rope(float* qkv, float* rstd, i64 B, i64 T, i64 pos0, int32_t* pos_buf) {
  const i64 N = B * T, W3 = qkv_width();
  if (qk_norm_) {
    parallel_for(N, [&](i64 b, i64 e) {
      for (i64 n = b; n < e; ++n) {
        float* row = qkv + n * W3;
        ops::rmsnorm_forward(row, P(off_qn_), row, rstd + n * (H_ + Hkv_), H_, hd_, norm_eps_);
        ops::rmsnorm_forward(row + H_ * hd_, P(off_kn_), row + H_ * hd_, rstd + n * (H_ + Hkv_) + H_, Hkv_, hd_,
                             norm_eps_);
      }
    });
  }
  if (!rope_) return;
  const ops::RopeTable& tab = pos0 < 0 ? rope_tab_ : rope_rows(pos0, T);
  const int32_t* pos = nullptr;
  if (pos0 >= 0) {
    const i64 first = &tab == &rope_tab_ ? pos0 : 0;  // the window table's row 0 is position pos0
    for (i64 n = 0; n < N; ++n) pos_buf[n] = static_cast<int32_t>(first + n % T);
    pos = pos_buf;
  }
  ops::rope_forward(tab, qkv, B, T, H_, W3, pos);
  ops::rope_forward(tab, qkv + H_ * hd_, B, T, Hkv_, W3, pos);
}

void AttentionMixer::forward(const float* x, float* y, const SeqInfo& s, Arena& arena) {
  const i64 N = s.B * s.T, W3 = qkv_width();
  ensure_rope(s.T);
  const ForwardBuffers fb = forward_buffers(arena, s.B, s.T);
  const Saved& sv = saved_ = fb.saved;
  ops::linear_forward(x, P(off_wqkv_), sv.qkv, N, D_, W3);  // [N, (H + 2 Hkv) hd]
  float* qkv = sv.qkv;  // RoPE'd in place, or (QK norm) a normed copy
  if (qk_norm_)
    qkv = normed_copy(sv, fb.qkv_normed, s.B, s.T);
  else
    norm_and_rope(qkv, nullptr, s.B, s.T, -1, nullptr);
  ops::attention_forward(attention_args(qkv, s.B, s.T, s.doc_start), sv.o, sv.lse);
  ops::linear_forward(sv.o, P(off_wo_), y, N, H_ * hd_, D_);
  arena.release_to(fb.temp_mark);
}

float* AttentionMixer::normed_copy(const Saved& sv, float* copy, i64 B, i64 T) {
  const i64 n = B * T * qkv_width();
  parallel_for(n, [&](i64 lo, i64 hi) { std::memcpy(copy + lo, sv.qkv + lo, sizeof(float) * (hi - lo)); });
  norm_and_rope(copy, sv.qk_rstd, B, T, -1, nullptr);
  return copy;
}

void AttentionMixer::backward(const float* x, const float* dy, float* dx, const SeqInfo& s, Arena& arena) {
  const i64 N = s.B * s.T, W3 = qkv_width();
  const Saved& sv = saved_;
  auto mark = arena.mark();
  const BackwardBuffers bb = backward_buffers(arena, s.B, s.T);
  float *d_o = bb.d_o, *dqkv = bb.dqkv;
  ops::linear_backward(sv.o, P(off_wo_), dy, d_o, G(off_wo_), N, H_ * hd_, D_);
  // The kernel's q | k | v: saved after RoPE, or (QK norm) normed again from the saved projection.
  const float* qkv = qk_norm_ ? normed_copy(sv, bb.qkv_normed, s.B, s.T) : sv.qkv;
  ops::attention_backward(attention_args(qkv, s.B, s.T, s.doc_start), sv.o, sv.lse, d_o,
                          {dqkv, dqkv + H_ * hd_, dqkv + (H_ + Hkv_) * hd_});
  if (rope_) {
    ops::rope_backward(rope_tab_, dqkv, s.B, s.T, H_, W3);
    ops::rope_backward(rope_tab_, dqkv + H_ * hd_, s.B, s.T, Hkv_, W3);
  }
  if (qk_norm_) {
    // Per-token norm weights gradients are reduced in a fixed order: per-thread partials, then summed.
    const int nt = num_threads();
    std::vector<float> dwq(static_cast<size_t>(nt * hd_), 0.f), dwk(static_cast<size_t>(nt * hd_), 0.f);
    parallel_for(N, [&](i64 b, i64 e) {
      const int th = omp_get_thread_num();
      std::vector<float> tmp(static_cast<size_t>(std::max(H_, Hkv_) * hd_));
      for (i64 n = b; n < e; ++n) {
        const float* pre = sv.qkv + n * W3;  // q | k before the norm
        float* drow = dqkv + n * W3;
        const float* rs = sv.qk_rstd + n * (H_ + Hkv_);
        ops::rmsnorm_backward(pre, P(off_qn_), rs, drow, tmp.data(), dwq.data() + th * hd_, H_, hd_);
        std::memcpy(drow, tmp.data(), sizeof(float) * H_ * hd_);
        ops::rmsnorm_backward(pre + H_ * hd_, P(off_kn_), rs + H_, drow + H_ * hd_, tmp.data(),
                              dwk.data() + th * hd_, Hkv_, hd_);
        std::memcpy(drow + H_ * hd_, tmp.data(), sizeof(float) * Hkv_ * hd_);
      }
    });
    for (int th = 0; th < nt; ++th)
      for (i64 i = 0; i < hd_; ++i) {
        G(off_qn_)[i] += dwq[th * hd_ + i];
        G(off_kn_)[i] += dwk[th * hd_ + i];
      }
  }
  ops::linear_backward(x, P(off_wqkv_), dqkv, dx, G(off_wqkv_), N, D_, W3);
  arena.release_to(mark);
}

std::unique_ptr<MixerState> AttentionMixer::new_state(i64 B, i64 max_len) const {
  auto st = std::make_unique<KvCache>();
  const i64 w = effective_window();
  st->capacity = w > 0 ? std::min(w, max_len) : max_len;
  st->B = B;
  st->width = Hkv_ * hd_;
  st->k.assign(static_cast<size_t>(B * st->capacity * st->width), 0.f);
  st->v.assign(st->k.size(), 0.f);
  return st;
}

void AttentionMixer::step(const float* x, float* y, MixerState& state, i64 B) {
  auto& c = static_cast<KvCache&>(state);
  const i64 W3 = qkv_width(), pos = c.pos, cap = c.capacity, KW = c.width;
  const i64 w = effective_window();
  HLM_CHECK(B == c.B, "attention step: batch {} but the cache has {} rows", B, c.B);
  HLM_CHECK(w > 0 || pos < cap, "attention step: context {} exceeds the KV cache capacity {}", pos + 1, cap);
  // Per-step buffers live in the state (sized once): decoding allocates and page-faults nothing.
  if (c.qkv.empty()) {
    c.qkv.resize(static_cast<size_t>(B * W3));
    c.o.resize(static_cast<size_t>(B * H_ * hd_));
    c.sc.resize(static_cast<size_t>(B * H_ * cap));
    c.rstd.resize(static_cast<size_t>(B * (H_ + Hkv_)));
    c.posv.resize(static_cast<size_t>(B));
    c.inv.resize(static_cast<size_t>(B * H_));
  }
  float* qkv = c.qkv.data();  // [B, W3]
  float* o = c.o.data();      // [B, H, hd]
  ops::linear_forward(x, P(off_wqkv_), qkv, B, D_, W3);
  norm_and_rope(qkv, c.rstd.data(), B, 1, pos, c.posv.data());
  const i64 slot = pos % cap, n_ctx = std::min(pos + 1, cap);
  if (record_) {
    record_->top1.assign(static_cast<size_t>(H_), -1);
    if (record_->keep_probs) record_->probs.emplace_back(static_cast<size_t>(H_));
  }
  const float scale = scale_ > 0 ? scale_ : 1.0f / std::sqrt(static_cast<float>(hd_));
  for (i64 b = 0; b < B; ++b) {
    std::memcpy(&c.k[(b * cap + slot) * KW], qkv + b * W3 + H_ * hd_, sizeof(float) * KW);
    std::memcpy(&c.v[(b * cap + slot) * KW], qkv + b * W3 + (H_ + Hkv_) * hd_, sizeof(float) * KW);
  }
  const i64 hpg = H_ / Hkv_;
  // One batch row: a pass down the key rows, then one down the value rows, all heads per row. Rows are
  // contiguous, so the hardware prefetcher streams the cache (head by head, each pass would read 256 B of
  // every 1 KB row and restart the prefetcher at every page: the cache read is what decoding at long
  // context costs).
  auto row = [&](i64 b) {
    const float* q = qkv + b * W3;  // [H, hd]
    const float* kb = &c.k[b * cap * KW];
    const float* vb = &c.v[b * cap * KW];
    float* sc = &c.sc[b * H_ * cap];  // [H, capacity]
    for (i64 j = 0; j < n_ctx; ++j) {
      const float* k = kb + j * KW;
      for (i64 h = 0; h < H_; ++h) {
        const float* qh = q + h * hd_;
        const float* kh = k + (h / hpg) * hd_;
        float d = 0;
#pragma omp simd reduction(+ : d)
        for (i64 i = 0; i < hd_; ++i) d += qh[i] * kh[i];
        sc[h * cap + j] = d * scale;
      }
    }
    float* inv = c.inv.data() + b * H_;
    for (i64 h = 0; h < H_; ++h) {
      float* sh = sc + h * cap;
      float mx = -INFINITY;
      for (i64 j = 0; j < n_ctx; ++j) mx = std::max(mx, sh[j]);
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (i64 j = 0; j < n_ctx; ++j) {
        sh[j] = ops::fast_exp(sh[j] - mx);
        sum += sh[j];
      }
      inv[h] = 1.0f / sum;
      if (record_ && b == 0) {
        // Slot j of the ring holds absolute position pos - ((pos - j) mod capacity).
        auto abs_pos = [&](i64 j) { return pos - ((pos % cap - j + cap) % cap); };
        i64 best = 0;
        for (i64 j = 1; j < n_ctx; ++j)
          if (sh[j] > sh[best]) best = j;
        record_->top1[h] = abs_pos(best);
        if (record_->keep_probs) {
          auto& pr = record_->probs.back()[h];
          pr.assign(static_cast<size_t>(pos + 1), 0.f);
          for (i64 j = 0; j < n_ctx; ++j) pr[abs_pos(j)] = sh[j] / sum;
        }
      }
    }
    float* out = o + b * H_ * hd_;  // [H, hd]
    std::fill(out, out + H_ * hd_, 0.f);
    for (i64 j = 0; j < n_ctx; ++j) {
      const float* v = vb + j * KW;
      for (i64 h = 0; h < H_; ++h) {
        const float p = sc[h * cap + j] * inv[h];
        const float* vh = v + (h / hpg) * hd_;
        float* oh = out + h * hd_;
#pragma omp simd
        for (i64 i = 0; i < hd_; ++i) oh[i] += p * vh[i];
      }
    }
  };
  // Rows in parallel only when there are several and enough work: a parallel region costs more than a
  // short window's (SWA at W = 128: ~65K multiply-adds per row).
  if (B > 1 && B * H_ * n_ctx * hd_ >= (i64{1} << 20))
    parallel_for_each(B, row);
  else
    for (i64 b = 0; b < B; ++b) row(b);
  ops::linear_forward(o, P(off_wo_), y, B, H_ * hd_, D_);
  c.pos++;
}

ops::AttentionArgs AttentionMixer::attention_args(const float* qkv, i64 B, i64 T, const int32_t* doc_start) const {
  ops::AttentionArgs a;
  a.B = B, a.T = T, a.H = H_, a.Hkv = Hkv_, a.hd = hd_, a.window = effective_window(), a.scale = scale_;
  a.q = qkv, a.k = qkv + H_ * hd_, a.v = qkv + (H_ + Hkv_) * hd_, a.q_stride = a.kv_stride = qkv_width();
  a.doc_start = doc_start;
  return a;
}

void AttentionMixer::prefill(const float* x, float* y, i64 B, i64 T, MixerState& state, Arena& arena) {
  auto& c = static_cast<KvCache&>(state);
  if (record_) {  // the probes' recorder works per step
    Mixer::prefill(x, y, B, T, state, arena);
    return;
  }
  const i64 w = effective_window(), pos = c.pos, N = B * T, W3 = qkv_width(), KW = c.width, cap = c.capacity;
  HLM_CHECK(B == c.B, "attention prefill: batch {} but the cache has {} rows", B, c.B);
  HLM_CHECK(w > 0 || pos + T <= cap, "attention prefill: context {} exceeds the KV cache capacity {}", pos + T, cap);
  // Window: the last min(pos, W-1) cached entries in position order, then the chunk's, staged (in ks, vs)
  // before the ring is overwritten by the chunk.
  const i64 n0 = w > 0 ? std::min(pos, w - 1) : 0, Tk = w > 0 ? n0 + T : 0;
  const auto mark = arena.mark();
  const PrefillBuffers pb = prefill_buffers(arena, B, T, Tk);
  float *qkv = pb.qkv, *o = pb.o, *lse = pb.lse;  // [B, T, (H + 2 Hkv) hd], [B, T, H, hd], [B, H, T]
  ops::linear_forward(x, P(off_wqkv_), qkv, N, D_, W3);
  norm_and_rope(qkv, pb.rstd, B, T, pos, pb.pos);
  const float* kc = qkv + H_ * hd_;  // the chunk's keys and values (row stride W3)
  const float* vc = qkv + (H_ + Hkv_) * hd_;
  ops::AttentionArgs a = attention_args(qkv, B, T, nullptr);
  if (w <= 0) {
    // Full: the cache holds positions 0..pos-1 in order; append the chunk and attend over the cache rows.
    for (i64 b = 0; b < B; ++b)
      for (i64 t = 0; t < T; ++t) {
        std::memcpy(&c.k[(b * cap + pos + t) * KW], kc + (b * T + t) * W3, sizeof(float) * KW);
        std::memcpy(&c.v[(b * cap + pos + t) * KW], vc + (b * T + t) * W3, sizeof(float) * KW);
      }
    a.B = 1;
    a.Tk = pos + T;
    a.kv_stride = KW;
    for (i64 b = 0; b < B; ++b) {  // rows of the cache are `cap` apart, the kernel wants them Tk apart
      a.q = qkv + b * T * W3, a.k = &c.k[b * cap * KW], a.v = &c.v[b * cap * KW];
      ops::attention_forward(a, o + b * T * H_ * hd_, lse + b * H_ * T);
    }
  } else {
    float *ks = pb.ks, *vs = pb.vs;  // [B, Tk, Hkv*hd]
    for (i64 b = 0; b < B; ++b) {
      for (i64 j = 0; j < n0; ++j) {
        const i64 slot = (pos - n0 + j) % cap;
        std::memcpy(ks + (b * Tk + j) * KW, &c.k[(b * cap + slot) * KW], sizeof(float) * KW);
        std::memcpy(vs + (b * Tk + j) * KW, &c.v[(b * cap + slot) * KW], sizeof(float) * KW);
      }
      for (i64 t = 0; t < T; ++t) {
        std::memcpy(ks + (b * Tk + n0 + t) * KW, kc + (b * T + t) * W3, sizeof(float) * KW);
        std::memcpy(vs + (b * Tk + n0 + t) * KW, vc + (b * T + t) * W3, sizeof(float) * KW);
      }
      for (i64 t = std::max<i64>(0, T - cap); t < T; ++t) {
        const i64 slot = (pos + t) % cap;
        std::memcpy(&c.k[(b * cap + slot) * KW], kc + (b * T + t) * W3, sizeof(float) * KW);
        std::memcpy(&c.v[(b * cap + slot) * KW], vc + (b * T + t) * W3, sizeof(float) * KW);
      }
    }
    a.Tk = Tk;
    a.k = ks, a.v = vs, a.kv_stride = KW;
    ops::attention_forward(a, o, lse);
  }
  ops::linear_forward(o, P(off_wo_), y, N, H_ * hd_, D_);
  c.pos = pos + T;
  arena.release_to(mark);
}

}  // namespace hlm

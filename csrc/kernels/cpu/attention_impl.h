// CPU kernels built once per CPU capability: packed variable-length bidirectional attention over
// per-row KV, and the SwiGLU activation.
//
// Work item = (head, row). For each item the keys are first gathered into a transposed float
// buffer Kt[head_dim][n_keys] (from the KV row's cache slots and/or the row's fresh keys), so
// that the score loop S[i][j] += q[i][d] * Kt[d][j] runs along contiguous keys and vectorises;
// then a row softmax; then O[i] += p[i][j] * V[j] along contiguous head_dim. Everything
// accumulates in float32.
// Included once per CPU capability (attention_{generic,avx2,avx512}.cpp, each compiled with its
// own -m flags); attention.cpp picks the best one the running CPU supports.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace blockbatch::cpu::BLOCKBATCH_CPU_CAPABILITY {

namespace {
constexpr int64_t kTile = 8;  // queries scored together

// Native float vector of this capability (GCC vector extension): the micro-kernels below keep
// their accumulators in registers, which plain loops left to the auto-vectoriser did not.
#if defined(__AVX512F__)
constexpr int64_t kW = 16;
#elif defined(__AVX2__)
constexpr int64_t kW = 8;
#else
constexpr int64_t kW = 4;
#endif
typedef float vfloat __attribute__((vector_size(kW * sizeof(float))));
inline vfloat vload(const float* p) {
  vfloat v;
  __builtin_memcpy(&v, p, sizeof(vfloat));
  return v;
}
inline void vstore(float* p, vfloat v) { __builtin_memcpy(p, &v, sizeof(vfloat)); }
typedef int32_t vint __attribute__((vector_size(kW * sizeof(int32_t))));

// S[i][j0 .. j0 + 2W) = sum_d q[i][d] * kt[d][j], for the kTile queries of a tile (rows of q
// past the real queries are zero). 16 accumulators stay in registers across the d loop.
inline void score_block(const float* __restrict q, int64_t hd, const float* __restrict kt, int64_t ld, int64_t j0,
                        float* __restrict s) {
  vfloat acc[kTile][2];
  for (int64_t i = 0; i < kTile; ++i) acc[i][0] = acc[i][1] = vfloat{};
  for (int64_t d = 0; d < hd; ++d) {
    const vfloat k0 = vload(kt + d * ld + j0), k1 = vload(kt + d * ld + j0 + kW);
    for (int64_t i = 0; i < kTile; ++i) {
      const float qv = q[i * hd + d];
      acc[i][0] += qv * k0;
      acc[i][1] += qv * k1;
    }
  }
  for (int64_t i = 0; i < kTile; ++i) {
    vstore(s + i * ld + j0, acc[i][0]);
    vstore(s + i * ld + j0 + kW, acc[i][1]);
  }
}

// O[i][d0 .. d0 + C*W) = sum_j p[i][j] * v[j][d0 ..], for R queries: R*C = 16 accumulators in
// registers (C = 4, 2, 1 vectors across head_dim, so that head_dim 32 on AVX-512 is covered too).
template <int R, int C>
inline void value_block(const float* __restrict p, int64_t ld, const float* __restrict v, int64_t hd, int64_t nk,
                        int64_t d0, float* __restrict o) {
  vfloat acc[R][C];
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = vfloat{};
  for (int64_t j = 0; j < nk; ++j) {
    const float* vj = v + j * hd + d0;
    vfloat vv[C];
    for (int c = 0; c < C; ++c) vv[c] = vload(vj + c * kW);
    for (int i = 0; i < R; ++i) {
      const float pij = p[i * ld + j];
      for (int c = 0; c < C; ++c) acc[i][c] += pij * vv[c];
    }
  }
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < C; ++c) vstore(o + i * hd + d0 + c * kW, acc[i][c]);
}

// O = P V for the nq (<= kTile) queries of a tile with the widest register block head_dim allows.
inline void values_tile(const float* p, int64_t ld, const float* v, int64_t hd, int64_t nk, int64_t nq, float* o) {
  const int64_t chunks = hd / kW;
  if (chunks % 4 == 0) {
    for (int64_t i0 = 0; i0 < nq; i0 += 4)
      for (int64_t d0 = 0; d0 < hd; d0 += 4 * kW) value_block<4, 4>(p + i0 * ld, ld, v, hd, nk, d0, o + i0 * hd);
  } else if (chunks % 2 == 0) {
    for (int64_t d0 = 0; d0 < hd; d0 += 2 * kW) value_block<kTile, 2>(p, ld, v, hd, nk, d0, o);
  } else {
    for (int64_t d0 = 0; d0 < hd; d0 += kW) value_block<kTile, 1>(p, ld, v, hd, nk, d0, o);
  }
}

template <typename T>
inline void rows_to_float(float* __restrict dst, const T* src, int64_t stride, int64_t n, int64_t hd) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t d = 0; d < hd; ++d) dst[j * hd + d] = to_float(src[j * stride + d]);
  }
}

// kt[d * ld + offset + j] = keys[j * stride + d] for j < n, d < hd, in 16x16 blocks so that
// neither the reads nor the writes stride through memory one element at a time.
template <typename T>
inline void transpose_keys(float* __restrict kt, int64_t ld, int64_t offset, const T* keys, int64_t stride, int64_t n,
                           int64_t hd) {
  constexpr int64_t B = 16;
  for (int64_t j0 = 0; j0 < n; j0 += B) {
    const int64_t j1 = std::min(j0 + B, n);
    for (int64_t d0 = 0; d0 < hd; d0 += B) {
      const int64_t d1 = std::min(d0 + B, hd);
      for (int64_t j = j0; j < j1; ++j) {
        const T* kj = keys + j * stride;
        for (int64_t d = d0; d < d1; ++d) kt[d * ld + offset + j] = to_float(kj[d]);
      }
    }
  }
}

// acc[i][0:hd] += p[i][j] * v_j[0:hd] for the nq queries of a tile, one key at a time, so that
// each value row is read once per tile.
template <typename T>
inline void accumulate_values(float* __restrict acc, const float* __restrict p, int64_t ldp, int64_t nq,
                              const T* values, int64_t stride, int64_t n, int64_t hd) {
  for (int64_t j = 0; j < n; ++j) {
    const T* vj = values + j * stride;
    for (int64_t i = 0; i < nq; ++i) {
      const float pij = p[i * ldp + j];
      float* __restrict ai = acc + i * hd;
      for (int64_t d = 0; d < hd; ++d) ai[d] += pij * to_float(vj[d]);
    }
  }
}
}  // namespace

template <typename T>
void packed_attention_impl(const AttentionArgs& a) {
  const T* q = static_cast<const T*>(a.q);
  const T* kf = static_cast<const T*>(a.k);
  const T* vf = static_cast<const T*>(a.v);
  const T* cache = static_cast<const T*>(a.cache);
  T* out = static_cast<T*>(a.out);
  const int64_t hd = a.head_dim;
  const int64_t group = a.heads / a.kv_heads;
  const float inv_sqrt_hd = 1.0f / std::sqrt(static_cast<float>(hd));

  // Work item = (head, row), head-major: every head carries the same total work, so the
  // static split of parallel_for is balanced whatever the row lengths.
  const int64_t items = a.heads * a.rows;
  int64_t work = 0;  // multiply-adds of one head over all rows
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t nq = a.cu_seqlens[r + 1] - a.cu_seqlens[r];
    work += 2 * nq * hd * ((cache ? a.row_cache_len(r) : 0) + (a.attend_fresh ? nq : 0));
  }
  at::parallel_for(0, items, grain_for(work / (a.rows > 0 ? a.rows : 1)), [&](int64_t begin, int64_t end) {
    std::vector<float> kt, vt, scores, qf(kTile * hd), acc(kTile * hd);
    const bool vector_values = hd % kW == 0;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / a.rows, r = item % a.rows;
      const int64_t kvh = h / group;
      const int64_t row_begin = a.cu_seqlens[r], row_end = a.cu_seqlens[r + 1];
      if (row_end == row_begin) continue;
      const int64_t n_cache = cache ? a.row_cache_len(r) : 0;
      const int64_t* keys = cache ? a.row_keys(r) : nullptr;  // gathered key set, or [0, n_cache)
      const int64_t n_fresh = a.attend_fresh ? row_end - row_begin : 0;
      const int64_t nk = n_cache + n_fresh;
      const int64_t ld = (nk + 2 * kW - 1) / (2 * kW) * (2 * kW);  // keys padded for score_block
      const T* kfr = kf + row_begin * a.kv_stride + kvh * hd;
      const T* vfr = vf + row_begin * a.kv_stride + kvh * hd;
      kt.assign(hd * ld, 0.0f);
      vt.resize(nk * hd);  // values as contiguous float rows [nk, hd]
      // Cached keys run by run: a run is consecutive slots of one page (dense: the whole row;
      // gathered: consecutive positions of the list), head_dim apart. Key j lands in column j
      // whatever the runs: a list of the whole range gives the contiguous row's buffers exactly.
      for (int64_t j = 0; j < n_cache;) {
        const int64_t pos = keys ? keys[j] : j;
        int64_t run = std::min(n_cache - j, a.geometry.key_run(pos));
        if (keys) {
          int64_t n = 1;
          while (n < run && keys[j + n] == pos + n) ++n;
          run = n;
        }
        const T* kc = cache + a.geometry.offset(a.kv_rows[r], a.layer, 0, kvh, pos);
        const T* vc = cache + a.geometry.offset(a.kv_rows[r], a.layer, 1, kvh, pos);
        transpose_keys(kt.data(), ld, j, kc, hd, run, hd);
        rows_to_float(vt.data() + j * hd, vc, hd, run, hd);
        j += run;
      }
      if (n_fresh) transpose_keys(kt.data(), ld, n_cache, kfr, a.kv_stride, n_fresh, hd);
      if (n_fresh) rows_to_float(vt.data() + n_cache * hd, vfr, a.kv_stride, n_fresh, hd);
      scores.resize(kTile * ld);
      for (int64_t tt = row_begin; tt < row_end; tt += kTile) {
        const int64_t nq = std::min(kTile, row_end - tt);
        std::fill(qf.begin(), qf.end(), 0.0f);
        for (int64_t i = 0; i < nq; ++i) {
          const T* qi = q + (tt + i) * a.q_stride + h * hd;
          for (int64_t d = 0; d < hd; ++d) qf[i * hd + d] = to_float(qi[d]) * inv_sqrt_hd;
        }
        // Scores S[i][j] = (q_i / sqrt(hd)) . k_j.
        for (int64_t j0 = 0; j0 < ld; j0 += 2 * kW) score_block(qf.data(), hd, kt.data(), ld, j0, scores.data());
        // Row softmax over the nk real keys (probabilities normalised in place).
        for (int64_t i = 0; i < nq; ++i) {
          float* __restrict si = scores.data() + i * ld;
          const float mx = max_of(si, nk);
          // Over the padded width ld (a multiple of kW): the padding keys score 0, finite, unused.
          for (int64_t j = 0; j < ld; j += kW) vstore(si + j, fast_exp_vec<vfloat, vint>(vload(si + j) - mx));
          const float inv = 1.0f / sum_of(si, nk);
          for (int64_t j = 0; j < nk; ++j) si[j] *= inv;
        }
        // O_i = sum_j p_ij v_j.
        if (vector_values) {
          values_tile(scores.data(), ld, vt.data(), hd, nk, nq, acc.data());
        } else {
          std::fill(acc.begin(), acc.begin() + nq * hd, 0.0f);
          accumulate_values(acc.data(), scores.data(), ld, nq, vt.data(), hd, nk, hd);
        }
        for (int64_t i = 0; i < nq; ++i) {
          T* o = out + (tt + i) * a.heads * hd + h * hd;
          for (int64_t d = 0; d < hd; ++d) o[d] = from_float<T>(acc[i * hd + d]);
        }
      }
    }
  });
}

// out[r] = silu(g) * u over rows of [g | u] (width 2m), kW lanes at a time; silu is rounded to T
// before the product, as torch's F.silu(g) * u does.
template <typename T>
void silu_mul_impl(const T* gate_up, T* out, int64_t rows, int64_t m) {
  at::parallel_for(0, rows, grain_for(4 * m), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate_up + r * 2 * m;
      const T* u = g + m;
      T* o = out + r * m;
      int64_t i = 0;
      for (; i + kW <= m; i += kW) {
        vfloat gv, uv;
        for (int64_t k = 0; k < kW; ++k) {
          gv[k] = to_float(g[i + k]);
          uv[k] = to_float(u[i + k]);
        }
        const vfloat act = gv / (1.0f + fast_exp_vec<vfloat, vint>(-gv));
        for (int64_t k = 0; k < kW; ++k) o[i + k] = from_float<T>(to_float(from_float<T>(act[k])) * uv[k]);
      }
      for (; i < m; ++i) {
        const float gv = to_float(g[i]);
        const float act = to_float(from_float<T>(gv / (1.0f + std::exp(-gv))));  // tail: m % kW lanes
        o[i] = from_float<T>(act * to_float(u[i]));
      }
    }
  });
}

void silu_mul(const void* gate_up, void* out, int64_t rows, int64_t m, int dtype_code) {
  switch (dtype_code) {
    case 0: silu_mul_impl(static_cast<const float*>(gate_up), static_cast<float*>(out), rows, m); break;
    case 1: silu_mul_impl(static_cast<const c10::BFloat16*>(gate_up), static_cast<c10::BFloat16*>(out), rows, m); break;
    default: silu_mul_impl(static_cast<const c10::Half*>(gate_up), static_cast<c10::Half*>(out), rows, m); break;
  }
}

void packed_attention(const AttentionArgs& a, int dtype_code) {
  switch (dtype_code) {
    case 0: packed_attention_impl<float>(a); break;
    case 1: packed_attention_impl<c10::BFloat16>(a); break;
    default: packed_attention_impl<c10::Half>(a); break;
  }
}

}  // namespace blockbatch::cpu::BLOCKBATCH_CPU_CAPABILITY

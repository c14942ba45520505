// Packed variable-length bidirectional attention over per-row KV (CPU).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace blockbatch::cpu {

namespace {
constexpr int64_t kQueryChunk = 8;
}

template <typename T>
void packed_attention(const AttentionArgs& a) {
  const T* q = static_cast<const T*>(a.q);
  const T* kf = static_cast<const T*>(a.k);
  const T* vf = static_cast<const T*>(a.v);
  const T* cache = static_cast<const T*>(a.cache);
  T* out = static_cast<T*>(a.out);
  const int64_t hd = a.head_dim;
  const int64_t group = a.heads / a.kv_heads;
  const float sqrt_hd = std::sqrt(static_cast<float>(hd));

  // Work items: (row, first query of a chunk); each is run for every head.
  std::vector<std::pair<int64_t, int64_t>> chunks;
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t t = a.cu_seqlens[r]; t < a.cu_seqlens[r + 1]; t += kQueryChunk) chunks.emplace_back(r, t);
  }
  const int64_t items = static_cast<int64_t>(chunks.size()) * a.heads;

  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> qf(hd), acc(hd);
    for (int64_t item = begin; item < end; ++item) {
      const auto [r, t0] = chunks[item / a.heads];
      const int64_t h = item % a.heads;
      const int64_t kvh = h / group;
      const int64_t row_begin = a.cu_seqlens[r], row_end = a.cu_seqlens[r + 1];
      const int64_t n_cache = cache ? a.cache_lens[r] : 0;
      const int64_t n_fresh = a.attend_fresh ? row_end - row_begin : 0;
      const T* kc = cache ? cache + a.geometry.offset(a.kv_rows[r], a.layer, 0, kvh, 0) : nullptr;
      const T* vc = cache ? cache + a.geometry.offset(a.kv_rows[r], a.layer, 1, kvh, 0) : nullptr;
      scores.resize(n_cache + n_fresh);
      for (int64_t t = t0; t < std::min(t0 + kQueryChunk, row_end); ++t) {
        const T* qt = q + t * a.q_stride + h * hd;
        for (int64_t d = 0; d < hd; ++d) qf[d] = to_float(qt[d]);
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n_cache; ++j) {
          scores[j] = dot(qf.data(), kc + j * hd, hd) / sqrt_hd;
          mx = std::max(mx, scores[j]);
        }
        for (int64_t j = 0; j < n_fresh; ++j) {
          float sc = dot(qf.data(), kf + (row_begin + j) * a.kv_stride + kvh * hd, hd) / sqrt_hd;
          scores[n_cache + j] = sc;
          mx = std::max(mx, sc);
        }
        float sum = 0;
        for (int64_t j = 0; j < n_cache + n_fresh; ++j) {
          scores[j] = std::exp(scores[j] - mx);
          sum += scores[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < n_cache; ++j) {
          const float p = scores[j] / sum;
          const T* vj = vc + j * hd;
          for (int64_t d = 0; d < hd; ++d) acc[d] += p * to_float(vj[d]);
        }
        for (int64_t j = 0; j < n_fresh; ++j) {
          const float p = scores[n_cache + j] / sum;
          const T* vj = vf + (row_begin + j) * a.kv_stride + kvh * hd;
          for (int64_t d = 0; d < hd; ++d) acc[d] += p * to_float(vj[d]);
        }
        T* o = out + t * a.heads * hd + h * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = from_float<T>(acc[d]);
      }
    }
  });
}

#define INSTANTIATE(T) template void packed_attention<T>(const AttentionArgs&);
BLOCKBATCH_INSTANTIATE_FLOATING(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cpu

// RMSNorm, the fused confidence kernel and the sparse probability map (CPU).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace blockbatch::cpu {

template <typename T>
void rms_norm(const T* x, int64_t x_stride, const T* w, T* out, int64_t rows, int64_t dim, float eps) {
  at::parallel_for(0, rows, grain_for(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * x_stride;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= dim; i += 8) {
        for (int j = 0; j < 8; ++j) {
          float v = to_float(xr[i + j]);
          acc[j] += v * v;
        }
      }
      float tail = 0;
      for (; i < dim; ++i) tail += to_float(xr[i]) * to_float(xr[i]);
      float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
      float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
      T* o = out + r * dim;
      for (int64_t k = 0; k < dim; ++k) {
        // Round the normalised value to T first (as LLaDA does), then scale by the weight.
        T normed = from_float<T>(to_float(xr[k]) * inv);
        o[k] = from_float<T>(to_float(normed) * to_float(w[k]));
      }
    }
  });
}

template <typename T>
void confidence(const T* logits, int64_t rows, int64_t vocab, int64_t exclude, int64_t* argmax, double* conf) {
  at::parallel_for(0, rows, grain_for(2 * vocab), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* l = logits + r * vocab;
      float mx = -std::numeric_limits<float>::infinity();    // max over all ids (softmax shift)
      float best = -std::numeric_limits<float>::infinity();  // max over proposable ids
      int64_t best_id = exclude == 0 ? 1 : 0;
      for (int64_t j = 0; j < vocab; ++j) {
        const float v = to_float(l[j]);
        mx = std::max(mx, v);
        if (v > best && j != exclude) {  // strict: the lowest id wins ties
          best = v;
          best_id = j;
        }
      }
      double sum = 0;
      const double m = mx;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(to_float(l[j])) - m);
      argmax[r] = best_id;
      conf[r] = std::exp(static_cast<double>(best) - m) / sum;
    }
  });
}

template <typename T>
void sparse_probs(const T* logits, int64_t rows, int64_t vocab, double floor, int64_t max_k, int64_t* ids,
                  double* probs) {
  at::parallel_for(0, rows, grain_for(2 * vocab), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* l = logits + r * vocab;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, to_float(l[j]));
      double sum = 0;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(to_float(l[j])) - mx);
      // p_j > floor needs l_j - max > log(floor * sum): only those few ids pay a second exp
      // (the bound is loosened by 1e-9 so the exact comparison below decides ties).
      const double cut = std::log(floor * sum) - 1e-9;
      int64_t k = 0;
      for (int64_t j = 0; j < vocab && k < max_k; ++j) {
        const double z = static_cast<double>(to_float(l[j])) - mx;
        if (z <= cut) continue;
        const double p = std::exp(z) / sum;
        if (p > floor) {
          ids[r * max_k + k] = j;
          probs[r * max_k + k] = p;
          ++k;
        }
      }
      for (; k < max_k; ++k) {
        ids[r * max_k + k] = -1;
        probs[r * max_k + k] = 0;
      }
    }
  });
}

#define INSTANTIATE(T)                                                                 \
  template void rms_norm<T>(const T*, int64_t, const T*, T*, int64_t, int64_t, float); \
  template void confidence<T>(const T*, int64_t, int64_t, int64_t, int64_t*, double*); \
  template void sparse_probs<T>(const T*, int64_t, int64_t, double, int64_t, int64_t*, double*);
BLOCKBATCH_INSTANTIATE_FLOATING(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cpu

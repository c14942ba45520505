// Runtime choice of the kernel build (attention, SwiGLU): AVX-512, AVX2+FMA or the portable generic one.
#include <type_traits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace blockbatch::cpu {

#define DECLARE_CAPABILITY(CAP)                                                           \
  namespace CAP {                                                                         \
  void packed_attention(const AttentionArgs& a, int dtype_code);                          \
  void silu_mul(const void* gate_up, void* out, int64_t rows, int64_t m, int dtype_code); \
  }
DECLARE_CAPABILITY(generic)
DECLARE_CAPABILITY(avx2)
DECLARE_CAPABILITY(avx512)
#undef DECLARE_CAPABILITY

CpuCapability cpu_capability() {
#if defined(__x86_64__)
  static const CpuCapability best = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma")
                                        ? CpuCapability::kAvx512
                                    : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                                        ? CpuCapability::kAvx2
                                        : CpuCapability::kGeneric;
  return best;
#else
  return CpuCapability::kGeneric;
#endif
}

template <typename T>
constexpr int dtype_code() {
  return std::is_same_v<T, float> ? 0 : std::is_same_v<T, c10::BFloat16> ? 1 : 2;
}

template <typename T>
void packed_attention(const AttentionArgs& a) {
  constexpr int code = dtype_code<T>();
  switch (cpu_capability()) {
    case CpuCapability::kAvx512: avx512::packed_attention(a, code); break;
    case CpuCapability::kAvx2: avx2::packed_attention(a, code); break;
    default: generic::packed_attention(a, code); break;
  }
}

template <typename T>
void silu_mul(const T* gate_up, T* out, int64_t rows, int64_t m) {
  constexpr int code = dtype_code<T>();
  switch (cpu_capability()) {
    case CpuCapability::kAvx512: avx512::silu_mul(gate_up, out, rows, m, code); break;
    case CpuCapability::kAvx2: avx2::silu_mul(gate_up, out, rows, m, code); break;
    default: generic::silu_mul(gate_up, out, rows, m, code); break;
  }
}

#define INSTANTIATE(T)                                     \
  template void packed_attention<T>(const AttentionArgs&); \
  template void silu_mul<T>(const T*, T*, int64_t, int64_t);
BLOCKBATCH_INSTANTIATE_FLOATING(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cpu

// Runtime choice of the attention kernel build: AVX-512, AVX2+FMA or the portable generic one.
#include <type_traits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace blockbatch::cpu {

#define DECLARE_CAPABILITY(CAP)                                   \
  namespace CAP {                                                 \
  void packed_attention(const AttentionArgs& a, int dtype_code);  \
  }
DECLARE_CAPABILITY(generic)
DECLARE_CAPABILITY(avx2)
DECLARE_CAPABILITY(avx512)
#undef DECLARE_CAPABILITY

CpuCapability cpu_capability() {
#if defined(__x86_64__)
  static const CpuCapability best =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
              __builtin_cpu_supports("fma")
          ? CpuCapability::kAvx512
      : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? CpuCapability::kAvx2
                                                                          : CpuCapability::kGeneric;
  return best;
#else
  return CpuCapability::kGeneric;
#endif
}

template <typename T>
void packed_attention(const AttentionArgs& a) {
  const int code = std::is_same_v<T, float> ? 0 : std::is_same_v<T, c10::BFloat16> ? 1 : 2;
  switch (cpu_capability()) {
    case CpuCapability::kAvx512: avx512::packed_attention(a, code); break;
    case CpuCapability::kAvx2: avx2::packed_attention(a, code); break;
    default: generic::packed_attention(a, code); break;
  }
}

#define INSTANTIATE(T) template void packed_attention<T>(const AttentionArgs&);
BLOCKBATCH_INSTANTIATE_FLOATING(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cpu

// Tensor-core and cp.async building blocks of the CUDA kernels (flash_common.cuh, flash_tiles.cu).
// Under BLOCKBATCH_CUDA_EMULATION (tests/emu/cuda_emu/) each one calls the CPU emulator instead.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace blockbatch::cuda {

// D = A B + D on one m16n8k16 tile: A, B 16-bit (T: bf16 or fp16), fp32 accumulators.
#define BLOCKBATCH_MMA16816(TYPE)                                             \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE         \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
template <typename T>
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, const uint32_t* b) {
#if defined(BLOCKBATCH_CUDA_EMULATION)
  ::bbemu::mma16816(c, a, b, std::is_same_v<T, __nv_bfloat16>);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    BLOCKBATCH_MMA16816("bf16");
  } else {
    BLOCKBATCH_MMA16816("f16");
  }
#endif
}
#undef BLOCKBATCH_MMA16816

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared without passing through registers; valid = false writes 16 zero bytes
// (src-size 0: nothing is read, src need only be a mapped address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(BLOCKBATCH_CUDA_EMULATION)
  ::bbemu::cp_async16(dst, src, valid);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(BLOCKBATCH_CUDA_EMULATION)
  ::bbemu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(BLOCKBATCH_CUDA_EMULATION)
  ::bbemu::cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace blockbatch::cuda

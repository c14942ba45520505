// CUDA builds only: one stream waiting for the work queued so far on another, with a raw event
// (ATen's CUDAEvent.h pulls cuBLAS / cuSPARSE headers that a bare toolkit may not ship). Used
// where graphs are captured and replayed on a side stream (decode/step_runner.cpp,
// decode/batch/scheduler.cpp).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

namespace blockbatch {

// `waiter` runs nothing queued after this call before the work queued so far on `on` is done.
inline void stream_wait(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& on) {
  cudaEvent_t ready;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(ready, on.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(waiter.stream(), ready, 0));
  C10_CUDA_CHECK(cudaEventDestroy(ready));  // released once the wait is satisfied
}

}  // namespace blockbatch

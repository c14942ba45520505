// The programmatic-launch flag of launch.cuh: a plain process-wide switch, set by the ops layer
// (ops/cuda/settings.cpp, from BLOCKBATCH_PDL) and read by launch_kernel at every launch.
#include "kernels/cuda/launch.cuh"

#include <atomic>

namespace blockbatch::cuda {

namespace {
std::atomic<bool> g_programmatic_launch{false};
}  // namespace

bool programmatic_launch() { return g_programmatic_launch.load(std::memory_order_relaxed); }

void set_programmatic_launch(bool on) { g_programmatic_launch.store(on, std::memory_order_relaxed); }

}  // namespace blockbatch::cuda

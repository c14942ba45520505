// Sizing the scheduler's KV pool (decode/batch/kv_pool.h): bytes per row, the layout, the rows a
// budget gives, the pool decode_batch asks for; checked against the device's memory before anything
// is allocated.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

#include "decode/admit.h"
#include "model/network.h"

namespace blockbatch {

// ceil(a / b) for a >= 0, b > 0: pages of positions, rows of pages.
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of one KV row of `length` positions on `config`'s model in `dtype`.
int64_t kv_row_bytes(const ModelConfig& config, c10::ScalarType dtype, int64_t length);

// The KV pool's layout (decode/batch/kv_pool.h): kv_page_len -1 (automatic) is paged in pages of
// kDefaultKvPageLen positions on the CPU and dense rows on CUDA (the paged CUDA kernels are a
// candidate: docs/bench/gpu/NOTES.md "Paged KV"); 0 dense rows; > 0 pages of that many positions
// (kDefaultKvPageLen: decode/step.h).
int64_t resolve_kv_page_len(c10::Device device, int64_t kv_page_len);
// Positions of one pool row: max_length, rounded up to whole pages when paged.
int64_t pool_row_length(int64_t max_length, int64_t page_len);

// The KV rows a budget of `bytes` gives the requests: padded packs keep one (the scratch row).
int64_t budget_rows(int64_t bytes, int64_t row_bytes, bool pad);

// The scheduler takes CPU models, and CUDA models unless BLOCKBATCH_CUDA_BATCHING is 0 (default
// graphs: padded steps replayed from CUDA graphs; 1: eager packed steps; the table:
// python/blockbatch/settings.py; the GPU tests: tests/cuda/test_cuda_batching.py). `who` names the
// caller in the error. Returns whether the packed steps replay CUDA graphs.
bool check_batching_device(c10::Device device, const char* who);

// The KV rows a Scheduler(model, max_batch, max_length, kv_budget_bytes, ..., pad_packs) gives its
// requests (padded packs, and CUDA graphs, take one more: the scratch row), checked without allocating anything:
// c10::ValueError for an argument out of range (max_length above the model's max_sequence_length),
// a budget that holds no row, or a pool larger than the device's memory (device_memory_bytes),
// naming kv_budget_bytes, max_batch, max_length and the sizes in GiB. A server calls it before
// it starts (torch.ops.blockbatch.check_kv_pool).
int64_t scheduler_pool_rows(const Network& model, int64_t max_batch, int64_t max_length, int64_t kv_budget_bytes,
                            bool pad_packs = false, int64_t kv_page_len = -1);

// decode_batch's pool for `requests` (admitted; their prompts `prompts`), up to `workers` at once:
// rows of max_length positions (the longest canvas, at least 2) of row_bytes each. kv_budget_bytes
// 0: room for the `workers` largest requests and, with prefix_cache on a paged pool, for the
// prompt blocks two or more of them share (at most the larger of the running requests' pages and
// 1 GiB). Throws c10::ValueError when a request's rows do not fit, or the budget does not fit the
// device (scheduler_pool_rows).
struct BatchPool {
  int64_t max_length = 2;  // a pool row's positions before rounding to pages
  int64_t row_bytes = 0;
  int64_t rows = 0;  // for the requests (the scratch row of padded packs not counted)
};
BatchPool batch_pool(const Network& model, const std::vector<std::vector<int64_t>>& prompts,
                     const std::vector<Admitted>& requests, int64_t workers, int64_t kv_budget_bytes, bool pad,
                     bool pad_packs, bool prefix_cache);

}  // namespace blockbatch

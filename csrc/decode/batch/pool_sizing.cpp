// KV pool sizing (decode/batch/pool_sizing.h).
#include "decode/batch/pool_sizing.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "decode/batch/pack.h"  // device_memory_bytes
#include "decode/policies/policy.h"
#include "decode/step.h"  // kDefaultKvPageLen

#ifdef BLOCKBATCH_WITH_CUDA
#include "ops/cuda/settings.h"  // cuda_batching
#endif

namespace blockbatch {

int64_t kv_row_bytes(const ModelConfig& c, c10::ScalarType dtype, int64_t length) {
  return c.n_layers * 2 * c.n_kv_heads * length * c.head_dim() * static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t resolve_kv_page_len(c10::Device device, int64_t kv_page_len) {
  TORCH_CHECK_VALUE(kv_page_len >= -1, "kv_page_len must be -1 (automatic), 0 (dense rows) or a page length >= 1, got ",
                    kv_page_len);
  if (kv_page_len >= 0) return kv_page_len;
  return device.is_cpu() ? kDefaultKvPageLen : 0;  // CUDA: dense (docs/bench/gpu/NOTES.md "Paged KV")
}

int64_t pool_row_length(int64_t max_length, int64_t page_len) {
  return page_len > 0 ? ceil_div(max_length, page_len) * page_len : max_length;
}

bool check_batching_device(c10::Device device, const char* who) {
  if (device.is_cpu()) return false;
#ifdef BLOCKBATCH_WITH_CUDA
  if (device.is_cuda()) {
    const int mode = cuda_ops::cuda_batching();
    TORCH_CHECK_VALUE(mode > 0, who,
                      " on a CUDA model is off (BLOCKBATCH_CUDA_BATCHING=0): unset it or set "
                      "BLOCKBATCH_CUDA_BATCHING=1 (eager packed steps) or =graphs (padded steps replayed from CUDA "
                      "graphs), or decode the requests one by one with torch.ops.blockbatch.decode");
    return mode == 2;
  }
#endif
  TORCH_CHECK_VALUE(false, who, " runs CPU models (and CUDA models in a CUDA build), not a model on ", device);
}

int64_t budget_rows(int64_t bytes, int64_t row_bytes, bool pad) { return bytes / row_bytes - (pad ? 1 : 0); }

namespace {

// KV rows of the largest request the family's policies make with their defaults (BlockBatch's
// branches, where the family has them): the pool's rows per request when no budget is given.
int64_t default_request_rows(const ModelConfig& c) {
  int64_t rows = 0;
  for (const PolicyDescriptor* d : policy_table()) {
    if (!d->family_refusal(family_spec(c.family)).empty()) continue;
    DecodeOptions o;
    o.policy = d->id;
    rows = std::max(rows, d->kv_rows(decode_options_for(c, o)));
  }
  return rows;
}

double gib(double bytes) { return bytes / static_cast<double>(int64_t{1} << 30); }

// decode_batch's default pool keeps the prompt blocks its requests share up to this size, or the
// size of the running requests' rows where that is larger.
constexpr int64_t kPrefixCacheRoomBytes = int64_t{1} << 30;

// Pages of the complete prompt blocks that at least two of `prompts` start with (block[i] > 0:
// request i's prompt is cached in blocks of block[i] positions; 0: not cached): what a prefix cache
// must keep for every repeat among them to be read rather than computed.
int64_t shared_prompt_block_pages(const std::vector<std::vector<int64_t>>& prompts, const std::vector<int64_t>& block,
                                  int64_t page_len) {
  // A trie of the prompts' blocks, per block length: (block length, parent node, block tokens) -> node.
  std::map<std::tuple<int64_t, int64_t, std::vector<int64_t>>, int64_t> node;
  std::vector<int64_t> requests;  // per node: the requests whose prompts start with it
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t b = block[i];
    if (b <= 0) continue;
    int64_t parent = -1;
    for (auto it = prompts[i].begin(); prompts[i].end() - it >= b; it += b) {
      const auto [at, added] =
          node.try_emplace({b, parent, std::vector<int64_t>(it, it + b)}, static_cast<int64_t>(requests.size()));
      if (added) requests.push_back(0);
      parent = at->second;
      ++requests[parent];
    }
  }
  int64_t pages = 0;
  for (const auto& [key, id] : node) {
    if (requests[id] >= 2) pages += std::get<0>(key) / page_len;
  }
  return pages;
}

}  // namespace

int64_t scheduler_pool_rows(const Network& model, int64_t max_batch, int64_t max_length, int64_t kv_budget_bytes,
                            bool pad_packs, int64_t kv_page_len) {
  const bool pad = check_batching_device(model.device(), "the batching scheduler") || pad_packs;
  const ModelConfig& c = model.config();
  TORCH_CHECK_VALUE(max_batch >= 1, "max_batch must be >= 1, got ", max_batch);
  TORCH_CHECK_VALUE(max_length >= 2 && max_length <= c.max_sequence_length, "max_length must be in [2, ",
                    c.max_sequence_length,
                    "] (the longest prompt + gen_length accepted, at most the model's "
                    "max_sequence_length), got ",
                    max_length);
  TORCH_CHECK_VALUE(kv_budget_bytes >= 0, "kv_budget_bytes must be >= 0 (0: room for max_batch requests), got ",
                    kv_budget_bytes);
  const int64_t page_len = resolve_kv_page_len(model.device(), kv_page_len);
  const int64_t row_bytes = kv_row_bytes(c, model.dtype(), pool_row_length(max_length, page_len));
  // In double: max_batch x rows per request may not fit an int64; the pool's size is checked first.
  const double rows = kv_budget_bytes > 0
                          ? static_cast<double>(budget_rows(kv_budget_bytes, row_bytes, pad))
                          : static_cast<double>(max_batch) * static_cast<double>(default_request_rows(c));
  TORCH_CHECK_VALUE(rows >= 1, "kv_budget_bytes = ", kv_budget_bytes, " holds no KV row of ", row_bytes, " bytes (",
                    max_length, " positions)", pad ? " besides the scratch row of padded packs" : "",
                    "; raise it to at least ", row_bytes * (pad ? 2 : 1));
  const double bytes = (rows + (pad ? 1 : 0)) * static_cast<double>(row_bytes);
  const int64_t memory = device_memory_bytes(model.device());
  if (memory > 0 && bytes > static_cast<double>(memory)) {
    std::ostringstream why;
    why << std::fixed;
    why.precision(0);
    why << "the KV pool would take " << rows << " rows of " << row_bytes << " bytes (max_length = " << max_length
        << " positions)";
    why.precision(2);
    why << ", " << gib(bytes) << " GiB, but " << model.device() << " has " << gib(static_cast<double>(memory))
        << " GiB: ";
    if (kv_budget_bytes > 0) {
      why << "kv_budget_bytes = " << kv_budget_bytes << " (" << gib(static_cast<double>(kv_budget_bytes))
          << " GiB) asks for it; lower kv_budget_bytes or max_length";
    } else {
      why << "kv_budget_bytes = 0 sizes it for max_batch = " << max_batch << " requests of " << default_request_rows(c)
          << " KV rows each; lower max_batch or max_length, or give a kv_budget_bytes";
    }
    TORCH_CHECK_VALUE(false, why.str());
  }
  return static_cast<int64_t>(rows);
}

BatchPool batch_pool(const Network& model, const std::vector<std::vector<int64_t>>& prompts,
                     const std::vector<Admitted>& requests, int64_t workers, int64_t kv_budget_bytes, bool pad,
                     bool pad_packs, bool prefix_cache) {
  const ModelConfig& c = model.config();
  const int64_t n = static_cast<int64_t>(requests.size());
  const int64_t page_len = resolve_kv_page_len(model.device(), -1);
  BatchPool p;
  int64_t max_rows = 0;
  std::vector<int64_t> rows_of(n, 0), cache_block_of(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    const Admitted& a = requests[i];
    p.max_length = std::max(p.max_length, a.canvas_length);
    rows_of[i] = a.kv_rows;
    max_rows = std::max(max_rows, a.kv_rows);
    const int64_t block = policy(a.options.policy).cached_prompt_block(a.options);
    if (prefix_cache && page_len > 0 && block > 0 && block % page_len == 0) {
      cache_block_of[i] = block;  // the scheduler caches this request's complete prompt blocks
    }
  }
  // Rows of max_length (rounded up to whole pages when the pool is paged: the scheduler's unit).
  p.row_bytes = kv_row_bytes(c, model.dtype(), pool_row_length(p.max_length, page_len));
  p.rows = kv_budget_bytes > 0 ? budget_rows(kv_budget_bytes, p.row_bytes, pad) : 0;
  if (kv_budget_bytes == 0) {  // room for the `workers` largest requests
    std::vector<int64_t> sorted = rows_of;
    std::sort(sorted.rbegin(), sorted.rend());
    for (int64_t i = 0; i < workers && i < n; ++i) p.rows += sorted[i];
    // With the prefix cache, also room to keep the blocks that more than one of these requests
    // starts with: a pool of the running requests alone evicts every cached block at the next
    // admission, and nothing is ever read. At most the larger of what the running requests take
    // and kPrefixCacheRoomBytes (a budget given explicitly holds both).
    if (page_len > 0) {
      const int64_t row_len = pool_row_length(p.max_length, page_len);
      const int64_t page_bytes = kv_row_bytes(c, model.dtype(), page_len);
      const int64_t room = std::max(p.rows * (row_len / page_len), kPrefixCacheRoomBytes / page_bytes);
      const int64_t cache_pages = std::min(shared_prompt_block_pages(prompts, cache_block_of, page_len), room);
      p.rows += ceil_div(cache_pages * page_len, row_len);
    }
  }
  TORCH_CHECK_VALUE(max_rows <= p.rows || max_rows == 0, "kv_budget_bytes = ", kv_budget_bytes, " holds ", p.rows,
                    " KV rows of ", p.row_bytes, " bytes (", p.max_length, " positions) but a request needs ", max_rows,
                    pad ? " (besides the scratch row of padded packs)" : "", "; raise the budget to at least ",
                    (max_rows + (pad ? 1 : 0)) * p.row_bytes, " bytes");
  // The budget's pool against the device's memory, in the caller's terms (the scheduler is
  // given the budget its rows take, not the one asked for).
  if (kv_budget_bytes > 0) scheduler_pool_rows(model, workers, p.max_length, kv_budget_bytes, pad_packs);
  return p;
}

}  // namespace blockbatch

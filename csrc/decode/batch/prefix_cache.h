// The prefix cache of a paged KV pool (decode/batch/kv_pool.h; docs/ALGORITHMS.md 12.6): the K/V
// of complete prompt blocks of block-causal families, published once a request's first forward has
// written them, kept after it ends, and read by any request taken later whose prompt starts with
// the same blocks.
//
// Under block-causal attention the K/V of a block's positions depend only on the tokens of that
// block and the blocks before it (and on the block length, which is the attention mask), so a
// request whose prompt starts with cached blocks reads their pages and computes from the first
// block not cached: its tokens and forwards are those of its decode without the cache (CPU float32:
// the forwards are batch-invariant, so the cached bits are the ones it would compute). Blocks are
// matched exactly: a trie per block length, one node per block, keyed by the block's token ids.
// A node holds the block's pages; nodes in use by a running request are pinned; the least recently
// used unpinned leaf is evicted when the pool needs pages.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

namespace blockbatch {

class PrefixCache {
 public:
  struct Node {
    std::vector<int64_t> tokens;  // the block's token ids
    std::vector<int64_t> pages;   // its pages, in position order
    Node* parent = nullptr;
    std::map<std::vector<int64_t>, std::unique_ptr<Node>> children;
    int64_t users = 0;  // running requests reading it
    uint64_t used = 0;  // last use (a tick)
  };

  // The cached blocks `prompt`'s first `blocks` complete blocks of `block` positions start with,
  // in order (the longest chain), pinned for the caller (unpin when it ends).
  std::vector<Node*> match(int64_t block, const std::vector<int64_t>& prompt, int64_t blocks);
  void unpin(const std::vector<Node*>& nodes);
  // Caches blocks [path.size(), blocks) of `prompt` after `path` (match()'s chain, pinned), block
  // i's pages being pages[(i - path.size()) * per_block ...]. Returns, per page given, whether the
  // cache kept it (false: the block was cached meanwhile by another request: the page stays the
  // caller's), and the blocks' nodes, pinned for the caller (unpin them with the path).
  struct Inserted {
    std::vector<bool> kept;
    std::vector<Node*> nodes;
  };
  Inserted insert(int64_t block, const std::vector<int64_t>& prompt, int64_t blocks, int64_t per_block,
                  const std::vector<Node*>& path, const std::vector<int64_t>& pages);
  // The pages of the least recently used block no request reads and no cached block follows;
  // empty when every block is in use.
  std::vector<int64_t> evict();

  int64_t blocks() const { return static_cast<int64_t>(nodes_.size()); }
  int64_t pages() const { return pages_; }
  int64_t evicted() const { return evicted_; }

 private:
  std::map<int64_t, Node> roots_;  // by block length
  std::set<Node*> nodes_;          // every cached block
  int64_t pages_ = 0, evicted_ = 0;
  uint64_t tick_ = 0;
};

}  // namespace blockbatch

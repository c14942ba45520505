#include "decode/batch/prefix_cache.h"

#include <algorithm>

namespace blockbatch {

namespace {
std::vector<int64_t> block_tokens(const std::vector<int64_t>& prompt, int64_t block, int64_t i) {
  return std::vector<int64_t>(prompt.begin() + i * block, prompt.begin() + (i + 1) * block);
}
}  // namespace

std::vector<PrefixCache::Node*> PrefixCache::match(int64_t block, const std::vector<int64_t>& prompt, int64_t blocks) {
  std::vector<Node*> path;
  Node* at = &roots_[block];
  ++tick_;
  for (int64_t i = 0; i < blocks; ++i) {
    const auto it = at->children.find(block_tokens(prompt, block, i));
    if (it == at->children.end()) break;
    at = it->second.get();
    at->users += 1;
    at->used = tick_;
    path.push_back(at);
  }
  return path;
}

void PrefixCache::unpin(const std::vector<Node*>& nodes) {
  ++tick_;
  for (Node* n : nodes) {
    n->users -= 1;
    n->used = tick_;
  }
}

PrefixCache::Inserted PrefixCache::insert(int64_t block, const std::vector<int64_t>& prompt, int64_t blocks,
                                          int64_t per_block, const std::vector<Node*>& path,
                                          const std::vector<int64_t>& pages) {
  Inserted out{std::vector<bool>(pages.size(), false), {}};
  std::vector<bool>& kept = out.kept;
  Node* at = path.empty() ? &roots_[block] : path.back();
  ++tick_;
  const int64_t from = static_cast<int64_t>(path.size());
  for (int64_t i = from; i < blocks; ++i) {
    std::vector<int64_t> key = block_tokens(prompt, block, i);
    auto it = at->children.find(key);
    if (it == at->children.end()) {  // new: the block's pages move to the cache
      auto node = std::make_unique<Node>();
      node->tokens = key;
      node->parent = at;
      node->used = tick_;
      const size_t first = static_cast<size_t>((i - from) * per_block);
      for (int64_t k = 0; k < per_block; ++k) {
        node->pages.push_back(pages[first + static_cast<size_t>(k)]);
        kept[first + static_cast<size_t>(k)] = true;
      }
      pages_ += per_block;
      nodes_.insert(node.get());
      it = at->children.emplace(std::move(key), std::move(node)).first;
    }
    at = it->second.get();
    at->used = tick_;
    at->users += 1;  // pinned for the caller
    out.nodes.push_back(at);
  }
  return out;
}

std::vector<int64_t> PrefixCache::evict() {
  Node* lru = nullptr;
  for (Node* n : nodes_) {
    if (n->users == 0 && n->children.empty() && (lru == nullptr || n->used < lru->used)) lru = n;
  }
  if (lru == nullptr) return {};
  std::vector<int64_t> pages = std::move(lru->pages);
  pages_ -= static_cast<int64_t>(pages.size());
  evicted_ += 1;
  nodes_.erase(lru);
  const std::vector<int64_t> key = lru->tokens;
  lru->parent->children.erase(key);  // frees the node
  return pages;
}

}  // namespace blockbatch

// The CPU CUDA emulator's scheduler, collectives and runtime API (see cuda_emu.h).
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "kernels/cuda/kernels.cuh"

namespace bbemu {
namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kDefaultShared = 48 * 1024, kMaxShared = 227 * 1024;
constexpr unsigned kMaxClusterBlocks = 8, kMaxBlockThreads = 1024;

struct Barrier {
  unsigned arrived = 0;
  uint64_t generation = 0;
};

struct Copy {
  unsigned char* dst;
  unsigned char bytes[16];
};

struct Fiber {
  ucontext_t context;
  void* stack = nullptr;
  Index index;
  unsigned block = 0, warp = 0, lane = 0;  // block: rank in the cluster; warp: index in the cluster
  bool done = false;
  const Barrier* waiting = nullptr;
  uint64_t waiting_generation = 0;
  uint64_t collectives = 0;
  std::vector<Copy> open;                // issued cp.async copies not yet committed
  std::deque<std::vector<Copy>> groups;  // committed groups not yet retired
};

struct Warp {
  Barrier barrier;
  unsigned size = 0;
  unsigned char slots[2][32][kSlot];
  const char* kinds[2][32];
};

struct FreeAligned {
  void operator()(unsigned char* p) const { std::free(p); }
};

struct Block {
  std::unique_ptr<unsigned char[], FreeAligned> shared;
  size_t shared_bytes = 0;
  Barrier barrier;
  unsigned live = 0;
};

// One cluster of a launch (one block when the launch has no clusters), running.
struct Cluster {
  std::vector<Block> blocks;
  std::vector<Warp> warps;
  std::vector<Fiber> fibers;
  Barrier barrier;
  unsigned live = 0;
  const std::function<void()>* body = nullptr;
  ucontext_t scheduler;
  Fiber* current = nullptr;
  std::string error;
};

Cluster* g_cluster = nullptr;
uint64_t g_seed = 1, g_launches = 0;
std::string g_last_error;
std::map<const void*, size_t> g_shared_limit;  // cudaFuncSetAttribute(MaxDynamicSharedMemorySize)
std::vector<void*> g_stacks;                    // reused between clusters
std::mutex g_mutex;

void* stack_at(size_t i) {
  while (g_stacks.size() <= i) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "bbemu: cannot map a fiber stack\n");
      std::abort();
    }
    mprotect(p, page, PROT_NONE);  // an overflow faults instead of corrupting a neighbour
    g_stacks.push_back(static_cast<char*>(p) + page);
  }
  return g_stacks[i];
}

Fiber& current() {
  if (g_cluster == nullptr || g_cluster->current == nullptr) {
    std::fprintf(stderr, "bbemu: a device function was called outside an emulated kernel\n");
    std::abort();
  }
  return *g_cluster->current;
}

void retire(std::vector<Copy>& copies) {
  for (const Copy& c : copies) std::memcpy(c.dst, c.bytes, 16);
  copies.clear();
}

// Arrive at `b`, which opens when `expected` threads have arrived, and wait for it (every arrival
// yields, so the threads leave a barrier in the scheduler's shuffled order).
void arrive_and_wait(Barrier& b, unsigned expected) {
  Fiber& f = current();
  f.waiting = &b;
  f.waiting_generation = b.generation;
  if (++b.arrived >= expected) {
    b.arrived = 0;
    ++b.generation;
  }
  swapcontext(&f.context, &g_cluster->scheduler);
}

// After a thread exits, barriers that counted it may be complete.
void release_if_complete(Barrier& b, unsigned expected) {
  if (b.arrived > 0 && b.arrived >= expected) {
    b.arrived = 0;
    ++b.generation;
  }
}

void fiber_main() {
  Cluster& c = *g_cluster;
  Fiber& f = *c.current;
  (*c.body)();
  for (auto& g : f.groups) retire(g);
  f.groups.clear();
  retire(f.open);
  f.done = true;
  Block& b = c.blocks[f.block];
  --b.live;
  --c.live;
  release_if_complete(b.barrier, b.live);
  release_if_complete(c.barrier, c.live);
  swapcontext(&f.context, &c.scheduler);
}

unsigned char* shared_base(const Fiber& f) { return g_cluster->blocks[f.block].shared.get(); }

bool in_dynamic_shared(const Fiber& f, const void* p, size_t bytes) {
  const Block& b = g_cluster->blocks[f.block];
  const auto* q = static_cast<const unsigned char*>(p);
  return q >= b.shared.get() && q + bytes <= b.shared.get() + b.shared_bytes;
}

std::string where(const Fiber& f) {
  char s[160];
  std::snprintf(s, sizeof s, "block (%u, %u, %u) thread (%u, %u, %u): ", f.index.block.x, f.index.block.y,
                f.index.block.z, f.index.thread.x, f.index.thread.y, f.index.thread.z);
  return s;
}

// Runs one cluster to completion (or to its first error).
void schedule(Cluster& c, std::mt19937_64& rng) {
  std::vector<size_t> order(c.fibers.size());
  std::iota(order.begin(), order.end(), size_t{0});
  while (true) {
    std::shuffle(order.begin(), order.end(), rng);
    bool ran = false, all_done = true;
    for (size_t i : order) {
      Fiber& f = c.fibers[i];
      if (f.done) continue;
      all_done = false;
      if (f.waiting != nullptr && f.waiting->generation == f.waiting_generation) continue;
      f.waiting = nullptr;
      c.current = &f;
      swapcontext(&c.scheduler, &f.context);
      c.current = nullptr;
      ran = true;
      if (!c.error.empty()) return;
    }
    if (all_done) return;
    if (!ran) {  // nobody can move: report the first waiting thread
      for (const Fiber& f : c.fibers) {
        if (f.done) continue;
        const Block& b = c.blocks[f.block];
        const char* at = f.waiting == &b.barrier ? "__syncthreads" : f.waiting == &c.barrier ? "cluster.sync"
                                                                                             : "a warp collective";
        c.error = "deadlock: " + where(f) + "waits at " + at + " that not all threads reach";
        return;
      }
    }
  }
}

}  // namespace

const Index& index() { return current().index; }
unsigned lane() { return current().lane; }

void sync_block() {
  Fiber& f = current();
  Block& b = g_cluster->blocks[f.block];
  arrive_and_wait(b.barrier, b.live);
}

void sync_cluster() { arrive_and_wait(g_cluster->barrier, g_cluster->live); }

void sync_warp() { warp_exchange("syncwarp", nullptr, 0); }

unsigned cluster_rank() { return current().block; }
unsigned cluster_blocks() { return static_cast<unsigned>(g_cluster->blocks.size()); }

void* cluster_map(const void* p, unsigned rank) {
  Fiber& f = current();
  if (rank >= g_cluster->blocks.size()) {
    fail("map_shared_rank(%u) in a cluster of %zu blocks", rank, g_cluster->blocks.size());
  }
  if (!in_dynamic_shared(f, p, 1)) fail("map_shared_rank of an address outside the block's dynamic shared memory");
  const size_t offset = static_cast<size_t>(static_cast<const unsigned char*>(p) - shared_base(f));
  return g_cluster->blocks[rank].shared.get() + offset;
}

void* dynamic_shared() { return shared_base(current()); }

const unsigned char* warp_exchange(const char* kind, const void* mine, size_t bytes) {
  Fiber& f = current();
  Warp& w = g_cluster->warps[f.warp];
  const int p = static_cast<int>(f.collectives++ & 1);  // double-buffered: see the note below
  if (bytes > 0) std::memcpy(w.slots[p][f.lane], mine, bytes);
  w.kinds[p][f.lane] = kind;
  // No lane can reach collective n + 2 (reusing this buffer) before every lane has arrived at
  // n + 1, that is, has finished reading collective n.
  arrive_and_wait(w.barrier, w.size);
  for (unsigned l = 0; l < w.size; ++l) {
    if (std::strcmp(w.kinds[p][l], kind) != 0) {
      fail("lane %u of warp %u is in %s while lane %u is in %s", f.lane, f.warp, kind, l, w.kinds[p][l]);
    }
  }
  return &w.slots[p][0][0];
}

namespace {
float half_bits_to_float(uint16_t h, bool bf16) {
  if (bf16) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  }
  __half x;
  std::memcpy(&x, &h, 2);
  return __half2float(x);
}
uint16_t half_of(uint32_t word, int k) { return static_cast<uint16_t>(k & 1 ? word >> 16 : word & 0xffffu); }
}  // namespace

void mma16816(float* c, const uint32_t* a, const uint32_t* b, bool bf16) {
  struct Operands {
    uint32_t a[4], b[2];
  } mine;
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  const Fiber& f = current();
  if (g_cluster->warps[f.warp].size != 32) fail("mma.sync in a warp of %u threads", g_cluster->warps[f.warp].size);
  const unsigned char* all = warp_exchange(bf16 ? "mma.m16n8k16.bf16" : "mma.m16n8k16.f16", &mine, sizeof mine);
  auto lane_ops = [&](unsigned l) {
    Operands o;
    std::memcpy(&o, all + l * kSlot, sizeof o);
    return o;
  };
  // PTX fragment layouts (groupID g = lane / 4, t = lane % 4): A row-major 16 x 16, element (r, k)
  // in lane 4 (r % 8) + (k % 8) / 2, register (r >= 8) + 2 (k >= 8), half k % 2; B 16 x 8 column
  // (k, n) in lane 4 n + (k % 8) / 2, register k >= 8, half k % 2; C (r, n) in lane 4 (r % 8) + n / 2,
  // element 2 (r >= 8) + n % 2.
  const unsigned g = f.lane >> 2, t = f.lane & 3;
  for (int e = 0; e < 4; ++e) {
    const unsigned r = g + (e >= 2 ? 8 : 0), n = 2 * t + (e & 1);
    double s = 0;
    for (unsigned k = 0; k < 16; ++k) {
      const Operands oa = lane_ops(4 * (r % 8) + (k % 8) / 2), ob = lane_ops(4 * n + (k % 8) / 2);
      const float x = half_bits_to_float(half_of(oa.a[(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], static_cast<int>(k)), bf16);
      const float y = half_bits_to_float(half_of(ob.b[k >= 8 ? 1 : 0], static_cast<int>(k)), bf16);
      s += static_cast<double>(x) * static_cast<double>(y);
    }
    c[e] = static_cast<float>(static_cast<double>(c[e]) + s);
  }
}

void ldmatrix_x4(uint32_t* r, const void* p, bool trans) {
  const Fiber& f = current();
  if (g_cluster->warps[f.warp].size != 32) fail("ldmatrix in a warp of %u threads", g_cluster->warps[f.warp].size);
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) fail("ldmatrix row address %p is not 16-byte aligned", p);
  if (!in_dynamic_shared(f, p, 16)) fail("ldmatrix row address %p is outside the block's dynamic shared memory", p);
  const unsigned char* all = warp_exchange(trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", &p, sizeof p);
  auto row = [&](unsigned l) {
    const uint16_t* q;
    std::memcpy(&q, all + l * kSlot, sizeof q);
    return q;
  };
  // Lane 8 i + j addresses row j of matrix i. Plain: r[i] of lane 4 g + t = row g, columns 2t and
  // 2t + 1 (low half first). Transposed: rows 2t and 2t + 1 of column g.
  const unsigned g = f.lane >> 2, t = f.lane & 3;
  for (unsigned i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!trans) {
      lo = row(8 * i + g)[2 * t];
      hi = row(8 * i + g)[2 * t + 1];
    } else {
      lo = row(8 * i + 2 * t)[g];
      hi = row(8 * i + 2 * t + 1)[g];
    }
    r[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
}

void cp_async16(void* dst, const void* src, bool valid) {
  Fiber& f = current();
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0) fail("cp.async destination %p is not 16-byte aligned", dst);
  if (!in_dynamic_shared(f, dst, 16)) fail("cp.async destination %p is outside the block's dynamic shared memory", dst);
  if (reinterpret_cast<uintptr_t>(src) % 16 != 0) fail("cp.async source %p is not 16-byte aligned", src);
  Copy c;
  c.dst = static_cast<unsigned char*>(dst);
  if (valid) {
    std::memcpy(c.bytes, src, 16);
  } else {
    std::memset(c.bytes, 0, 16);
  }
  f.open.push_back(c);
}

void cp_async_commit() {
  Fiber& f = current();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}

void cp_async_wait(int n) {
  Fiber& f = current();
  while (f.groups.size() > static_cast<size_t>(n)) {
    retire(f.groups.front());
    f.groups.pop_front();
  }
}

void fail(const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (g_cluster == nullptr || g_cluster->current == nullptr) {
    std::fprintf(stderr, "bbemu: %s\n", msg);
    std::abort();
  }
  Fiber& f = *g_cluster->current;
  if (g_cluster->error.empty()) g_cluster->error = where(f) + msg;
  f.done = true;  // never resumed: the launch stops at its first error
  swapcontext(&f.context, &g_cluster->scheduler);
  std::abort();  // unreachable
}

cudaError_t run(const LaunchConfig& config, const std::function<void()>& body) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const dim3 grid = config.grid, block = config.block, cl = config.cluster;
  const unsigned threads = block.x * block.y * block.z, cluster_blocks = cl.x * cl.y * cl.z;
  auto invalid = [](const std::string& why) {
    g_last_error = "invalid launch: " + why;
    return cudaErrorInvalidValue;
  };
  if (g_cluster != nullptr) return invalid("a kernel launched from inside an emulated kernel");
  if (threads == 0 || threads > kMaxBlockThreads) return invalid("block of " + std::to_string(threads) + " threads");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) return invalid("grid shape");
  if (cluster_blocks == 0 || cluster_blocks > kMaxClusterBlocks || grid.x % cl.x || grid.y % cl.y || grid.z % cl.z) {
    return invalid("cluster (" + std::to_string(cl.x) + ", " + std::to_string(cl.y) + ", " + std::to_string(cl.z) +
                   ") for grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " +
                   std::to_string(grid.z) + ")");
  }
  const auto limit = g_shared_limit.find(config.kernel);
  const size_t max_shared = limit == g_shared_limit.end() ? kDefaultShared : limit->second;
  if (config.shared > max_shared) {
    return invalid(std::to_string(config.shared) + " bytes of dynamic shared memory (limit " +
                   std::to_string(max_shared) + "; cudaFuncSetAttribute raises it)");
  }
  g_last_error.clear();
  std::mt19937_64 rng(g_seed * 0x9e3779b97f4a7c15ull + ++g_launches);

  std::vector<dim3> origins;  // first block of each cluster, run in a shuffled order
  for (unsigned z = 0; z < grid.z; z += cl.z)
    for (unsigned y = 0; y < grid.y; y += cl.y)
      for (unsigned x = 0; x < grid.x; x += cl.x) origins.emplace_back(x, y, z);
  std::shuffle(origins.begin(), origins.end(), rng);

  const unsigned warps_per_block = (threads + 31) / 32;
  for (const dim3& o : origins) {
    Cluster c;
    c.body = &body;
    c.blocks.resize(cluster_blocks);
    c.warps.resize(static_cast<size_t>(cluster_blocks) * warps_per_block);
    c.fibers.resize(static_cast<size_t>(cluster_blocks) * threads);
    c.live = cluster_blocks * threads;
    for (unsigned r = 0; r < cluster_blocks; ++r) {
      Block& b = c.blocks[r];
      b.shared_bytes = config.shared;
      const size_t bytes = (config.shared + 127) / 128 * 128 + 128;
      b.shared.reset(static_cast<unsigned char*>(std::aligned_alloc(128, bytes)));
      std::memset(b.shared.get(), 0xff, bytes);  // NaN in every float type: unwritten reads show
      b.live = threads;
      const dim3 bi(o.x + r % cl.x, o.y + (r / cl.x) % cl.y, o.z + r / (cl.x * cl.y));
      for (unsigned w = 0; w < warps_per_block; ++w) {
        c.warps[r * warps_per_block + w].size = std::min(32u, threads - 32 * w);
      }
      for (unsigned i = 0; i < threads; ++i) {
        Fiber& f = c.fibers[static_cast<size_t>(r) * threads + i];
        f.index.thread = make_uint3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
        f.index.block = make_uint3(bi.x, bi.y, bi.z);
        f.index.block_dim = block;
        f.index.grid_dim = grid;
        f.block = r;
        f.warp = r * warps_per_block + i / 32;
        f.lane = i % 32;
        f.stack = stack_at(static_cast<size_t>(r) * threads + i);
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack;
        f.context.uc_stack.ss_size = kStackBytes;
        f.context.uc_link = nullptr;
        makecontext(&f.context, fiber_main, 0);
      }
    }
    g_cluster = &c;
    schedule(c, rng);
    g_cluster = nullptr;
    if (!c.error.empty()) {
      g_last_error = c.error;
      return cudaErrorLaunchFailure;
    }
  }
  return cudaSuccess;
}

}  // namespace bbemu

// The runtime API the kernels' host code calls.
extern "C" {
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaSuccess; }  // launches report their errors directly
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || static_cast<size_t>(value) > bbemu::kMaxShared) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(bbemu::g_mutex);
  bbemu::g_shared_limit[func] = static_cast<size_t>(value);
  return cudaSuccess;
}

// For the tests (ctypes): the emulator's seed (scheduling order) and the last launch's error.
void bbemu_set_seed(uint64_t seed) { bbemu::g_seed = seed; }
const char* bbemu_last_error() { return bbemu::g_last_error.c_str(); }
}

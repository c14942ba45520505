// The part of <cooperative_groups.h> the kernels use (thread-block clusters), for the CPU
// emulator (cuda_emu.h); found before the toolkit's header by the emulator's include path.
#pragma once

#include "../cuda_emu.h"

namespace cooperative_groups {

class cluster_group {
 public:
  unsigned block_rank() const { return ::bbemu::cluster_rank(); }
  unsigned num_blocks() const { return ::bbemu::cluster_blocks(); }
  void sync() const { ::bbemu::sync_cluster(); }
  template <typename T>
  T* map_shared_rank(T* p, unsigned rank) const {
    return static_cast<T*>(::bbemu::cluster_map(p, rank));
  }
};

inline cluster_group this_cluster() { return {}; }

}  // namespace cooperative_groups

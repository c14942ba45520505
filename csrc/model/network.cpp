#include "model/network.h"

#include <c10/util/Exception.h>

namespace blockbatch {

KvMode parse_kv_mode(const std::string& mode) {
  if (mode == "full") return KvMode::kFull;
  if (mode == "dual") return KvMode::kDual;
  if (mode == "prefix") return KvMode::kPrefix;
  TORCH_CHECK(false, "mode must be 'full', 'dual' or 'prefix', got '", mode, "'");
}

}  // namespace blockbatch

// Refused and the per-thread record of the last refusal (decode/refused.h).
#include "decode/refused.h"

namespace blockbatch {

namespace {
thread_local RefusalRecord last;
}  // namespace

Refused::Refused(ErrorKind kind, std::string param, const std::string& message)
    : c10::ValueError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message), kind_(kind),
      param_(std::move(param)) {
  last = RefusalRecord{error_kind_name(kind), param_, message};
}

RefusalRecord take_last_refusal() { return std::exchange(last, RefusalRecord{}); }

}  // namespace blockbatch

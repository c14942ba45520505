// A request refused: a c10::ValueError (Python: ValueError) that also says why by kind (the
// ERROR_KINDS table of python/blockbatch/contract.py: invalid_option, unsupported, invalid_prompt,
// context_length, kv_budget) and which argument to change (an option's name, "prompt_ids", ...).
//
// Exceptions cross into Python as their class and message only, so the last refusal made on a
// thread is also kept for that thread: torch.ops.blockbatch.last_refusal() hands Python the kind
// and the argument of the ValueError it just caught (blockbatch.errors.RequestError), and no
// caller reads them back out of the message's text.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <string>
#include <utility>

#include "decode/options_table.h"

namespace blockbatch {

class Refused : public c10::ValueError {
 public:
  Refused(ErrorKind kind, std::string param, const std::string& message);
  ErrorKind kind() const { return kind_; }
  const std::string& param() const { return param_; }

 private:
  ErrorKind kind_;
  std::string param_;
};

// Throws Refused(kind, param, c10::str(parts...)).
template <typename... Parts>
[[noreturn]] void refuse(ErrorKind kind, std::string param, const Parts&... parts) {
  throw Refused(kind, std::move(param), c10::str(parts...));
}

// A refusal as a policy's rules return it: the argument to change and why ("" message: none).
struct Refusal {
  std::string param;
  std::string message;
  explicit operator bool() const { return !message.empty(); }
};

// The last refusal made on this thread (kind name, param, message), then forgotten; empty strings
// when there was none since the last call.
struct RefusalRecord {
  std::string kind, param, message;
};
RefusalRecord take_last_refusal();

}  // namespace blockbatch

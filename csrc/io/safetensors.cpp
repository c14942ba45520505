#include "io/safetensors.h"

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <stdexcept>

#include "io/json.h"

namespace blockbatch::io {

namespace {
struct DtypeInfo {
  int64_t bytes;
  c10::ScalarType type;
  bool weight;  // allowed as a model weight
};
const std::map<std::string, DtypeInfo>& dtypes() {
  static const std::map<std::string, DtypeInfo> table = {
      {"F64", {8, at::kDouble, false}},   {"F32", {4, at::kFloat, true}},     {"F16", {2, at::kHalf, true}},
      {"BF16", {2, at::kBFloat16, true}}, {"I64", {8, at::kLong, false}},     {"I32", {4, at::kInt, false}},
      {"I16", {2, at::kShort, false}},    {"I8", {1, at::kChar, false}},      {"U8", {1, at::kByte, false}},
      {"BOOL", {1, at::kBool, false}},    {"F8_E4M3", {1, at::kByte, false}}, {"F8_E5M2", {1, at::kByte, false}},
      {"U16", {2, at::kShort, false}},    {"U32", {4, at::kInt, false}},      {"U64", {8, at::kLong, false}},
  };
  return table;
}
constexpr uint64_t kMaxHeader = 100ull << 20;
}  // namespace

namespace {
// Closes the descriptor on every exit path.
struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

int open_regular_file(const std::string& path, const char* what, uint64_t* size) {
  // O_NONBLOCK: a FIFO named like a weight file must not block the open forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    TORCH_CHECK(err != ENOENT, path, ": ", what, " not found");
    TORCH_CHECK(err != ELOOP, path, ": ", what, " is a symbolic link loop (too many levels of symbolic links)");
    TORCH_CHECK(false, path, ": cannot open ", what, " (", std::strerror(err), ")");
  }
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    TORCH_CHECK(false, path, ": cannot stat ", what, " (", std::strerror(err), ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    TORCH_CHECK(!S_ISDIR(st.st_mode), path, ": ", what, " is a directory, not a file");
    TORCH_CHECK(false, path, ": ", what, " is not a regular file (a FIFO, socket or device)");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

namespace {
// a * b, or false when it does not fit in 63 bits (a shape whose byte count would wrap around
// could otherwise pass the span check and map a view past the end of the file).
bool mul_fits(uint64_t a, uint64_t b, uint64_t* out) {
  constexpr uint64_t kLimit = uint64_t{1} << 63;
  if (a != 0 && b > kLimit / a) return false;
  *out = a * b;
  return *out <= kLimit;
}
}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  uint64_t file_size = 0;
  FdGuard fd{open_regular_file(path, "safetensors file", &file_size)};
  TORCH_CHECK(file_size >= 8, path, ": file is ", file_size, " bytes, too short for a safetensors header");
  uint64_t n = 0;
  unsigned char prefix[8];
  TORCH_CHECK(pread(fd.fd, prefix, 8, 0) == 8, path, ": cannot read the header length");
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];  // little endian
  TORCH_CHECK(n <= kMaxHeader && 8 + n <= file_size, path, ": header length ", n, " does not fit in the ", file_size,
              "-byte file (truncated or not safetensors)");
  std::string text(n, '\0');
  TORCH_CHECK(pread(fd.fd, text.data(), n, 8) == static_cast<ssize_t>(n), path, ": cannot read the header");
  const uint64_t data_size = file_size - 8 - n;
  Json header;
  try {
    header = Json::parse(text);
  } catch (const std::runtime_error& e) {
    TORCH_CHECK(false, path, ": header is not valid JSON (", e.what(), ")");
  }
  TORCH_CHECK(header.is_object(), path, ": header must be a JSON object");
  for (const auto& [name, entry] : header.as_object()) {
    if (name == "__metadata__") {
      TORCH_CHECK(entry.is_object(), path, ": '__metadata__' must be an object");
      continue;
    }
    TORCH_CHECK(entry.is_object() && entry.as_object().size() == 3 && entry.contains("dtype") &&
                    entry.contains("shape") && entry.contains("data_offsets"),
                path, ": tensor '", name, "': entry must have exactly dtype, shape, data_offsets");
    TensorEntry t;
    t.name = name;
    TORCH_CHECK(entry.at("dtype").is_string() && dtypes().count(entry.at("dtype").as_string()), path, ": tensor '",
                name, "': unknown dtype");
    t.dtype = entry.at("dtype").as_string();
    TORCH_CHECK(entry.at("shape").is_array(), path, ": tensor '", name, "': shape must be an array");
    TORCH_CHECK(entry.at("shape").as_array().size() <= 64, path, ": tensor '", name, "': shape has more than 64 dims");
    uint64_t numel = 1;
    for (const auto& d : entry.at("shape").as_array()) {
      TORCH_CHECK(d.is_integer() && d.as_int() >= 0, path, ": tensor '", name,
                  "': shape must hold non-negative integers");
      t.shape.push_back(d.as_int());
      TORCH_CHECK(mul_fits(numel, static_cast<uint64_t>(d.as_int()), &numel), path, ": tensor '", name, "': shape ",
                  c10::IntArrayRef(t.shape), " has more elements than any file can hold");
    }
    const auto& offs = entry.at("data_offsets");
    TORCH_CHECK(offs.is_array() && offs.as_array().size() == 2 && offs.as_array()[0].is_integer() &&
                    offs.as_array()[1].is_integer() && offs.as_array()[0].as_int() >= 0 &&
                    offs.as_array()[0].as_int() <= offs.as_array()[1].as_int(),
                path, ": tensor '", name, "': data_offsets must be [begin <= end]");
    t.begin = offs.as_array()[0].as_int();
    t.end = offs.as_array()[1].as_int();
    uint64_t nbytes = 0;
    TORCH_CHECK(mul_fits(numel, dtypes().at(t.dtype).bytes, &nbytes), path, ": tensor '", name, "': ", numel,
                " elements of ", t.dtype, " are more bytes than any file can hold");
    TORCH_CHECK(t.end - t.begin == nbytes, path, ": tensor '", name, "': data_offsets span ", t.end - t.begin,
                " bytes but ", t.dtype, " of ", numel, " elements needs ", nbytes);
    TORCH_CHECK(t.end <= data_size, path, ": tensor '", name, "': data_offsets end ", t.end,
                " is past the data section (", data_size, " bytes): file truncated?");
    f->index_[name] = f->entries_.size();
    f->entries_.push_back(std::move(t));
  }
  std::vector<const TensorEntry*> sorted;
  for (const auto& t : f->entries_) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](auto* a, auto* b) { return std::tie(a->begin, a->end) < std::tie(b->begin, b->end); });
  uint64_t expected = 0;
  for (const auto* t : sorted) {
    TORCH_CHECK(t->begin == expected, path, ": tensor '", t->name, "': data_offsets begin ", t->begin,
                t->begin < expected ? " overlaps the previous tensor" : " leaves a gap before it");
    expected = t->end;
  }
  TORCH_CHECK(expected == data_size, path, ": tensors cover ", expected, " bytes but the data section holds ",
              data_size, ": header lies");
  f->size_ = file_size;
  f->data_offset_ = 8 + n;
  void* map = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  TORCH_CHECK(map != MAP_FAILED, path, ": mmap failed (", std::strerror(errno), ")");
  f->map_ = map;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, size_);
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorEntry* t = find(name);
  TORCH_CHECK(t, path_, ": tensor '", name, "' is not in this file");
  const DtypeInfo& info = dtypes().at(t->dtype);
  TORCH_CHECK(info.weight, path_, ": tensor '", name, "' has dtype ", t->dtype, "; weights must be F32, BF16 or F16");
  auto keep = shared_from_this();
  char* data = static_cast<char*>(map_) + data_offset_ + t->begin;
  // Zero-copy view of the read-only mapping; the deleter keeps the file mapped while in use.
  return at::from_blob(data, t->shape, [keep](void*) {}, at::TensorOptions().dtype(info.type));
}

}  // namespace blockbatch::io

#include "io/safetensors.h"

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
      {"F64", {8, at::kDouble, false}}, {"F32", {4, at::kFloat, true}},     {"F16", {2, at::kHalf, true}},
      {"BF16", {2, at::kBFloat16, true}}, {"I64", {8, at::kLong, false}},   {"I32", {4, at::kInt, false}},
      {"I16", {2, at::kShort, false}},  {"I8", {1, at::kChar, false}},      {"U8", {1, at::kByte, false}},
      {"BOOL", {1, at::kBool, false}},  {"F8_E4M3", {1, at::kByte, false}}, {"F8_E5M2", {1, at::kByte, false}},
      {"U16", {2, at::kShort, false}},  {"U32", {4, at::kInt, false}},      {"U64", {8, at::kLong, false}},
  };
  return table;
}
constexpr uint64_t kMaxHeader = 100ull << 20;
}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY);
  TORCH_CHECK(fd >= 0, path, ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    TORCH_CHECK(false, path, ": cannot stat");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    TORCH_CHECK(false, path, ": file is ", file_size, " bytes, too short for a safetensors header");
  }
  uint64_t n = 0;
  unsigned char prefix[8];
  if (pread(fd, prefix, 8, 0) != 8) {
    ::close(fd);
    TORCH_CHECK(false, path, ": cannot read the header length");
  }
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];  // little endian
  if (n > kMaxHeader || 8 + n > file_size) {
    ::close(fd);
    TORCH_CHECK(false, path, ": header length ", n, " does not fit in the ", file_size,
                "-byte file (truncated or not safetensors)");
  }
  std::string text(n, '\0');
  if (pread(fd, text.data(), n, 8) != static_cast<ssize_t>(n)) {
    ::close(fd);
    TORCH_CHECK(false, path, ": cannot read the header");
  }
  const uint64_t data_size = file_size - 8 - n;
  try {
    Json header = Json::parse(text);
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
      uint64_t numel = 1;
      for (const auto& d : entry.at("shape").as_array()) {
        TORCH_CHECK(d.is_integer() && d.as_int() >= 0, path, ": tensor '", name,
                    "': shape must hold non-negative integers");
        t.shape.push_back(d.as_int());
        numel *= static_cast<uint64_t>(d.as_int());
      }
      const auto& offs = entry.at("data_offsets");
      TORCH_CHECK(offs.is_array() && offs.as_array().size() == 2 && offs.as_array()[0].is_integer() &&
                      offs.as_array()[1].is_integer() && offs.as_array()[0].as_int() >= 0 &&
                      offs.as_array()[0].as_int() <= offs.as_array()[1].as_int(),
                  path, ": tensor '", name, "': data_offsets must be [begin <= end]");
      t.begin = offs.as_array()[0].as_int();
      t.end = offs.as_array()[1].as_int();
      const uint64_t nbytes = numel * dtypes().at(t.dtype).bytes;
      TORCH_CHECK(t.end - t.begin == nbytes, path, ": tensor '", name, "': data_offsets span ", t.end - t.begin,
                  " bytes but ", t.dtype, " of ", numel, " elements needs ", nbytes);
      TORCH_CHECK(t.end <= data_size, path, ": tensor '", name, "': data_offsets end ", t.end,
                  " is past the data section (", data_size, " bytes): file truncated?");
      f->index_[name] = f->entries_.size();
      f->entries_.push_back(std::move(t));
    }
  } catch (const std::runtime_error& e) {
    ::close(fd);
    if (dynamic_cast<const c10::Error*>(&e)) throw;
    TORCH_CHECK(false, path, ": header is not valid JSON (", e.what(), ")");
  } catch (...) {
    ::close(fd);
    throw;
  }
  std::vector<const TensorEntry*> sorted;
  for (const auto& t : f->entries_) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return std::tie(a->begin, a->end) < std::tie(b->begin, b->end); });
  uint64_t expected = 0;
  for (const auto* t : sorted) {
    if (t->begin != expected) {
      ::close(fd);
      TORCH_CHECK(false, path, ": tensor '", t->name, "': data_offsets begin ", t->begin,
                  t->begin < expected ? " overlaps the previous tensor" : " leaves a gap before it");
    }
    expected = t->end;
  }
  if (expected != data_size) {
    ::close(fd);
    TORCH_CHECK(false, path, ": tensors cover ", expected, " bytes but the data section holds ", data_size,
                ": header lies");
  }
  f->size_ = file_size;
  f->data_offset_ = 8 + n;
  void* map = mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
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

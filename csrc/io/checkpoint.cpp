// Hugging Face checkpoint folders in C++: config.json + (sharded) safetensors.
#include <c10/util/Exception.h>

#include <set>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace blockbatch::io {

namespace {
constexpr uint64_t kMaxJsonBytes = 100ull << 20;  // config.json, model.safetensors.index.json

// True when anything is at `path`, a dangling or looping symbolic link included (opening it then
// says what is wrong instead of "missing").
bool exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}
std::string read_file(const std::string& path, const char* what) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, what, &size);
  if (size > kMaxJsonBytes) {
    ::close(fd);
    TORCH_CHECK(false, path, ": ", what, " is ", size, " bytes, more than the ", kMaxJsonBytes, " allowed");
  }
  std::string text(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t got = pread(fd, text.data() + done, size - done, static_cast<off_t>(done));
    if (got <= 0) {
      ::close(fd);
      TORCH_CHECK(false, path, ": cannot read ", what);
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  return text;
}
Json parse_or_throw(const std::string& text, const std::string& where) {
  try {
    return Json::parse(text);
  } catch (const std::runtime_error& e) {
    TORCH_CHECK(false, where, ": not valid JSON (", e.what(), ")");
  }
}
}  // namespace

ModelConfig parse_model_config(const std::string& text, const std::string& where) {
  Json j = parse_or_throw(text, where);
  TORCH_CHECK(j.is_object(), where, ": expected a JSON object at top level");
  TORCH_CHECK(j.contains("model_type"), where, ": key 'model_type' is missing");
  TORCH_CHECK(!(j.at("model_type").is_string() && j.at("model_type").as_string() == "Dream"), where,
              ": a Dream checkpoint: the C++ checkpoint reader (the bb_* binaries) reads the LLaDA family only; "
              "load it from Python (blockbatch.load_checkpoint)");
  TORCH_CHECK(j.at("model_type").is_string() && j.at("model_type").as_string() == "llada", where,
              ": key 'model_type' must be \"llada\"");
  auto need = [&](const char* key) -> const Json& {
    TORCH_CHECK(j.contains(key) && !j.at(key).is_null(), where, ": required key '", key, "' is missing");
    return j.at(key);
  };
  auto integer = [&](const char* key) {
    const Json& v = need(key);
    TORCH_CHECK(v.is_integer(), where, ": key '", key, "' must be an integer");
    return v.as_int();
  };
  auto number = [&](const char* key) {
    const Json& v = need(key);
    TORCH_CHECK(v.is_number(), where, ": key '", key, "' must be a number");
    return v.as_double();
  };
  ModelConfig c;
  c.d_model = integer("d_model");
  c.n_layers = integer("n_layers");
  c.n_heads = integer("n_heads");
  c.n_kv_heads = j.contains("n_kv_heads") && !j.at("n_kv_heads").is_null() ? integer("n_kv_heads") : c.n_heads;
  c.mlp_hidden_size = integer("mlp_hidden_size");
  c.vocab_size = integer("vocab_size");
  c.embedding_size =
      j.contains("embedding_size") && !j.at("embedding_size").is_null() ? integer("embedding_size") : c.vocab_size;
  c.mask_token_id = integer("mask_token_id");
  const Json& eos = need("eos_token_id");
  if (eos.is_array()) {
    TORCH_CHECK(!eos.as_array().empty() && eos.as_array()[0].is_integer(), where,
                ": key 'eos_token_id' must be an integer or a non-empty list of integers");
    c.eos_token_id = eos.as_array()[0].as_int();
  } else {
    c.eos_token_id = integer("eos_token_id");
  }
  c.max_sequence_length = integer("max_sequence_length");
  const Json& tying = need("weight_tying");
  TORCH_CHECK(tying.is_bool(), where, ": key 'weight_tying' must be true or false");
  c.weight_tying = tying.as_bool();
  c.rope_theta = number("rope_theta");
  c.rms_norm_eps = number("rms_norm_eps");
  try {
    c.validate();
  } catch (const c10::Error& e) {
    std::string msg = e.msg();
    if (msg.rfind("config: ", 0) == 0) msg = msg.substr(8);
    TORCH_CHECK_VALUE(false, where, ": ", msg);
  }
  return c;
}

LoadedCheckpoint load_checkpoint(const std::string& folder) {
  LoadedCheckpoint out;
  const std::string config_path = folder + "/config.json";
  TORCH_CHECK(exists(config_path), config_path, ": config.json not found");
  out.config = parse_model_config(read_file(config_path, "config.json"), config_path);

  std::unordered_map<std::string, std::string> file_of;  // tensor -> shard path
  const std::string index_path = folder + "/model.safetensors.index.json";
  const std::string single = folder + "/model.safetensors";
  std::unordered_map<std::string, std::shared_ptr<SafetensorsFile>> files;
  if (exists(index_path)) {
    Json index = parse_or_throw(read_file(index_path, "model.safetensors.index.json"), index_path);
    TORCH_CHECK(index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(), index_path,
                ": key 'weight_map' is missing");
    for (const auto& [name, shard] : index.at("weight_map").as_object()) {
      TORCH_CHECK(shard.is_string() && !shard.as_string().empty() && shard.as_string() != "." &&
                      shard.as_string() != ".." && shard.as_string().find('/') == std::string::npos &&
                      shard.as_string().find('\0') == std::string::npos,
                  index_path, ": tensor '", name, "' must map to a file name in the folder");
      const std::string p = folder + "/" + shard.as_string();
      TORCH_CHECK(exists(p), index_path, ": tensor '", name, "' lives in missing shard ", shard.as_string());
      file_of[name] = p;
      if (!files.count(p)) files[p] = SafetensorsFile::open(p);
      TORCH_CHECK(files[p]->find(name), p, ": tensor '", name, "' is listed in the index but absent from this shard");
    }
  } else {
    TORCH_CHECK(exists(single), folder, ": no model.safetensors and no model.safetensors.index.json");
    files[single] = SafetensorsFile::open(single);
    for (const auto& e : files[single]->entries()) file_of[e.name] = single;
  }
  // The config against the weight files before anything sized by it is built: a 500-byte
  // config.json must not make us list 10^9 tensor names.
  TORCH_CHECK_VALUE(out.config.n_layers <= static_cast<int64_t>(file_of.size()), config_path, ": key 'n_layers' = ",
                    out.config.n_layers, " needs ", out.config.tensor_count(), " tensors but the weight files hold ",
                    file_of.size());
  std::set<std::string> expected_names;
  for (const auto& [name, shape] : expected_weight_shapes(out.config)) {
    expected_names.insert(name);
    auto it = file_of.find(name);
    TORCH_CHECK(it != file_of.end(), folder, ": tensor '", name, "' is missing");
    const TensorEntry* e = files[it->second]->find(name);
    TORCH_CHECK(e->shape == shape, it->second, ": tensor '", name, "' has shape ", c10::IntArrayRef(e->shape),
                ", expected ", c10::IntArrayRef(shape));
    out.weights[name] = files[it->second]->tensor(name);
  }
  for (const auto& [path, f] : files) {
    for (const auto& e : f->entries()) {
      TORCH_CHECK(expected_names.count(e.name), path, ": unexpected tensor '", e.name,
                  "' (not part of a LLaDA model with this config)");
    }
  }
  return out;
}

}  // namespace blockbatch::io

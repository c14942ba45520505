// Hugging Face checkpoint folders in C++: config.json + (sharded) safetensors.
#include <c10/util/Exception.h>

#include <cctype>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>
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
  struct stat st{};
  return lstat(path.c_str(), &st) == 0;
}
// True for a regular file or a symbolic link to one (os.path.isfile).
bool is_regular_file(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
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
// Dream writes Qwen2's key names; the checks of ModelConfig::validate speak of the LLaDA-named
// fields. Each LLaDA field name, with the key a Dream config.json holds it under.
constexpr std::pair<const char*, const char*> kDreamKeys[] = {
    {"d_model", "hidden_size"},
    {"n_layers", "num_hidden_layers"},
    {"n_heads", "num_attention_heads"},
    {"n_kv_heads", "num_key_value_heads"},
    {"mlp_hidden_size", "intermediate_size"},
    {"embedding_size", "vocab_size"},
    {"max_sequence_length", "max_position_embeddings"},
    {"weight_tying", "tie_word_embeddings"},
};

// The key the user wrote for a LLaDA field name: the same name for LLaDA, Qwen2's for Dream.
const char* key_name(Family family, const char* field) {
  if (family == Family::kDream) {
    for (const auto& [llada, dream] : kDreamKeys) {
      if (std::string(field) == llada) return dream;
    }
  }
  return field;
}

// A validate() message with every LLaDA field name (a whole word) replaced by the Dream key.
std::string with_dream_keys(const std::string& msg) {
  auto word_char = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  std::string out;
  size_t i = 0;
  while (i < msg.size()) {
    if (!word_char(msg[i])) {
      out += msg[i++];
      continue;
    }
    size_t end = i;
    while (end < msg.size() && word_char(msg[end])) ++end;
    const std::string word = msg.substr(i, end - i);
    out += key_name(Family::kDream, word.c_str());
    i = end;
  }
  return out;
}

constexpr const char* kIdKeys[] = {"mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"};
}  // namespace

ModelConfig parse_model_config(const std::string& text, const std::string& where,
                               const std::string& generation_config_path) {
  Json j = parse_or_throw(text, where);
  TORCH_CHECK(j.is_object(), where, ": expected a JSON object at top level");
  TORCH_CHECK(j.contains("model_type"), where, ": key 'model_type' is missing");
  const Json& model_type = j.at("model_type");
  TORCH_CHECK(model_type.is_string() && (model_type.as_string() == "llada" || model_type.as_string() == "Dream"), where,
              ": key 'model_type' must be \"llada\" or \"Dream\"");
  const Family family = model_type.as_string() == "Dream" ? Family::kDream : Family::kLLaDA;
  const bool dream = family == Family::kDream;

  // Dream keeps its special ids in generation_config.json too; config.json wins (as
  // ModelConfig.from_json_file does). Values read from it are still reported under `where`.
  Json generation;
  if (dream && !generation_config_path.empty() && is_regular_file(generation_config_path)) {
    generation = parse_or_throw(read_file(generation_config_path, "generation_config.json"), generation_config_path);
  }
  auto present_in = [](const Json& o, const char* key) {
    return o.is_object() && o.contains(key) && !o.at(key).is_null();
  };
  auto is_id_key = [](const char* key) {
    for (const char* k : kIdKeys) {
      if (std::string(k) == key) return true;
    }
    return false;
  };
  // The value of `key`, nullptr when absent or null.
  auto find = [&](const char* key) -> const Json* {
    if (present_in(j, key)) return &j.at(key);
    if (is_id_key(key) && present_in(generation, key)) return &generation.at(key);
    return nullptr;
  };
  auto need = [&](const char* key) -> const Json& {
    const Json* v = find(key);
    TORCH_CHECK(v, where, ": required key '", key, "' is missing",
                dream && is_id_key(key) ? " (from config.json and generation_config.json)" : "");
    return *v;
  };
  auto integer = [&](const char* key) {
    const Json& v = need(key);
    TORCH_CHECK(v.is_integer(), where, ": key '", key, "' must be an integer");
    return v.as_int();
  };
  auto optional_integer = [&](const char* key, int64_t fallback) { return find(key) ? integer(key) : fallback; };
  auto number = [&](const char* key) {
    const Json& v = need(key);
    TORCH_CHECK(v.is_number(), where, ": key '", key, "' must be a number");
    return v.as_double();
  };
  auto boolean = [&](const char* key) {
    const Json& v = need(key);
    TORCH_CHECK(v.is_bool(), where, ": key '", key, "' must be true or false");
    return v.as_bool();
  };
  // A special id: an integer, or (Hugging Face allows it) a non-empty list whose first entry is the id.
  auto id = [&](const char* key) {
    const Json& v = need(key);
    if (!v.is_array()) return integer(key);
    bool ok = !v.as_array().empty();
    for (const Json& e : v.as_array()) ok = ok && e.is_integer();
    TORCH_CHECK(ok, where, ": key '", key, "' must be an integer or a non-empty list of integers");
    return v.as_array()[0].as_int();
  };
  auto outside = [&](const char* key, int64_t value, int64_t vocab) {
    TORCH_CHECK_VALUE(value >= 0 && value < vocab, where, ": key '", key, "' = ", value,
                      " is outside the vocabulary [0, ", vocab, ")");
  };

  ModelConfig c;
  c.family = family;
  c.attention_bias = dream;  // Dream's q/k/v projections always carry biases
  // Field by field: the LLaDA key, or the Qwen2 key a Dream config.json holds it under.
  auto k = [&](const char* field) { return key_name(family, field); };
  c.d_model = integer(k("d_model"));
  c.n_layers = integer(k("n_layers"));
  c.n_heads = integer(k("n_heads"));
  c.n_kv_heads = optional_integer(k("n_kv_heads"), c.n_heads);
  c.mlp_hidden_size = integer(k("mlp_hidden_size"));
  c.vocab_size = integer("vocab_size");
  c.embedding_size = dream ? c.vocab_size : optional_integer("embedding_size", c.vocab_size);
  c.mask_token_id = integer("mask_token_id");
  c.eos_token_id = id("eos_token_id");
  c.max_sequence_length = integer(k("max_sequence_length"));
  // Dream (as Qwen2) leaves the embeddings untied unless told; LLaDA must say.
  c.weight_tying = false;
  if (!dream || find("tie_word_embeddings")) c.weight_tying = boolean(k("weight_tying"));
  c.rope_theta = number("rope_theta");
  c.rms_norm_eps = number("rms_norm_eps");
  std::optional<int64_t> pad, bos;
  if (find("pad_token_id")) pad = dream ? id("pad_token_id") : integer("pad_token_id");  // as config.py
  if (dream && find("bos_token_id")) bos = id("bos_token_id");

  if (dream) {  // ModelConfig._validate_dream: its messages, naming the Qwen2 keys
    TORCH_CHECK_VALUE(c.n_heads > 0, where, ": key 'num_attention_heads' = ", c.n_heads, " must be positive");
    TORCH_CHECK_VALUE(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0, where,
                      ": key 'num_key_value_heads' = ", c.n_kv_heads, " must divide num_attention_heads = ", c.n_heads,
                      " (grouped-query attention)");
    TORCH_CHECK_VALUE(c.d_model % c.n_heads == 0, where, ": key 'hidden_size' = ", c.d_model,
                      " is not a multiple of num_attention_heads = ", c.n_heads);
    outside("mask_token_id", c.mask_token_id, c.vocab_size);
  }
  try {
    c.validate();
  } catch (const c10::Error& e) {
    std::string msg = e.msg();
    if (msg.rfind("config: ", 0) == 0) msg = msg.substr(8);
    TORCH_CHECK_VALUE(false, where, ": ", dream ? with_dream_keys(msg) : msg);
  }
  if (pad) outside("pad_token_id", *pad, c.vocab_size);
  if (bos) outside("bos_token_id", *bos, c.vocab_size);
  return c;
}

LoadedCheckpoint load_checkpoint(const std::string& folder) {
  LoadedCheckpoint out;
  const std::string config_path = folder + "/config.json";
  TORCH_CHECK(exists(config_path), config_path, ": config.json not found");
  out.config =
      parse_model_config(read_file(config_path, "config.json"), config_path, folder + "/generation_config.json");
  const bool dream = out.config.family == Family::kDream;

  std::unordered_map<std::string, std::string> file_of;  // tensor -> shard path
  const std::string index_path = folder + "/model.safetensors.index.json";
  const std::string single = folder + "/model.safetensors";
  std::unordered_map<std::string, std::shared_ptr<SafetensorsFile>> files;
  std::string listing = single;  // the file that lists the tensors: the index or the single file
  if (exists(index_path)) {
    listing = index_path;
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
  TORCH_CHECK_VALUE(out.config.n_layers <= static_cast<int64_t>(file_of.size()), config_path, ": key '",
                    key_name(out.config.family, "n_layers"), "' = ", out.config.n_layers, " needs ",
                    out.config.tensor_count(), " tensors but the weight files hold ", file_of.size());
  std::set<std::string> expected_names;
  for (const auto& [name, shape] : expected_weight_shapes(out.config)) {
    expected_names.insert(name);
    auto it = file_of.find(name);
    TORCH_CHECK(it != file_of.end(), listing, ": tensor '", name, "' is missing",
                dream && name.size() > 10 && name.compare(name.size() - 10, 10, "_proj.bias") == 0
                    ? " (Dream's q/k/v projections carry biases)"
                    : "");
    const TensorEntry* e = files[it->second]->find(name);
    TORCH_CHECK(e->shape == shape, it->second, ": tensor '", name, "' has shape ", c10::IntArrayRef(e->shape),
                ", expected ", c10::IntArrayRef(shape));
    out.weights[name] = files[it->second]->tensor(name);
  }
  for (const auto& [path, f] : files) {
    for (const auto& e : f->entries()) {
      TORCH_CHECK(expected_names.count(e.name), path, ": unexpected tensor '", e.name, "' (not part of a ",
                  dream ? "Dream" : "LLaDA", " model with this config)");
    }
  }
  return out;
}

}  // namespace blockbatch::io

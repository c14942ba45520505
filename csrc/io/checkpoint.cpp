// Hugging Face checkpoint folders in C++: config.json + (sharded) safetensors.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json.h"
#include "io/safetensors.h"
#include "model/families.h"
#include "model/transformer.h"

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
// A JSON value as a message shows it: strings quoted and cut short (a fuzzed file can hold megabytes).
std::string shown(const Json& v) {
  if (v.is_string()) {
    const std::string& s = v.as_string();
    return "'" + (s.size() <= 40 ? s : s.substr(0, 37) + "...") + "'";
  }
  if (v.is_bool()) return v.as_bool() ? "true" : "false";
  if (v.is_integer()) return std::to_string(v.as_int());
  if (v.is_number()) return c10::str(v.as_double());
  if (v.is_null()) return "null";
  return v.is_array() ? "a list" : "an object";
}

constexpr const char* kIdKeys[] = {"mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"};

// config.json read key by key (blockbatch.config.KeyReader's C++ twin): every error names the file
// (`where`) and the key. A key that is absent or null is missing; Dream's special ids fall back to
// its generation_config.json (`generation`, null elsewhere).
struct KeyReader {
  const Json& j;
  const Json& generation;
  const std::string& where;
  bool dream;  // the ids may come from generation_config.json (the row's ids_in_generation_config)

  static bool present_in(const Json& o, const char* key) {
    return o.is_object() && o.contains(key) && !o.at(key).is_null();
  }
  static bool is_id_key(const char* key) {
    for (const char* k : kIdKeys) {
      if (std::string(k) == key) return true;
    }
    return false;
  }
  // The value of `key`, nullptr when absent or null.
  const Json* find(const char* key) const {
    if (present_in(j, key)) return &j.at(key);
    if (is_id_key(key) && present_in(generation, key)) return &generation.at(key);
    return nullptr;
  }
  const Json& need(const char* key) const {
    const Json* v = find(key);
    TORCH_CHECK(v, where, ": required key '", key, "' is missing",
                dream && is_id_key(key) ? " (from config.json and generation_config.json)" : "");
    return *v;
  }
  int64_t integer(const char* key) const {
    const Json& v = need(key);
    // A whole number the parser could not hold in 64 bits (json.cpp keeps it as a double only).
    TORCH_CHECK_VALUE(v.is_integer() || !v.is_number() || std::trunc(v.as_double()) != v.as_double() ||
                          std::fabs(v.as_double()) < 9.2e18,
                      where, ": key '", key, "' = ", shown(v), " does not fit in 64 bits");
    TORCH_CHECK(v.is_integer(), where, ": key '", key, "' must be an integer");
    return v.as_int();
  }
  int64_t optional_integer(const char* key, int64_t fallback) const { return find(key) ? integer(key) : fallback; }
  double number(const char* key) const {
    const Json& v = need(key);
    TORCH_CHECK(v.is_number(), where, ": key '", key, "' must be a number");
    return v.as_double();
  }
  double optional_number(const char* key, double fallback) const { return find(key) ? number(key) : fallback; }
  bool boolean(const char* key) const {
    const Json& v = need(key);
    TORCH_CHECK(v.is_bool(), where, ": key '", key, "' must be true or false");
    return v.as_bool();
  }
  bool optional_boolean(const char* key, bool fallback) const { return find(key) ? boolean(key) : fallback; }
  // A special id: an integer, or (Hugging Face allows it) a non-empty list whose first entry is the id.
  int64_t id(const char* key) const {
    const Json& v = need(key);
    if (!v.is_array()) return integer(key);
    bool ok = !v.as_array().empty();
    for (const Json& e : v.as_array()) ok = ok && e.is_integer();
    TORCH_CHECK(ok, where, ": key '", key, "' must be an integer or a non-empty list of integers");
    return v.as_array()[0].as_int();
  }
  void outside(const char* key, int64_t value, int64_t vocab, const char* note = "") const {
    TORCH_CHECK_VALUE(value >= 0 && value < vocab, where, ": key '", key, "' = ", value,
                      " is outside the vocabulary [0, ", vocab, ")", note);
  }
};

// Python's a // b (rounds toward minus infinity; b > 0).
int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0 ? 1 : 0); }

// A config.json whose optional keys take the defaults of the authors' config class (the row's
// `defaults`: LLaDA2, model_type "llada2_moe"): families/llada2.py read_config and check_config, key for
// key, for the parts the row's body has (explicit head size, partial rotary, MoE, optional biases).
ModelConfig read_with_defaults(const KeyReader& keys, const FamilySpec& spec, std::optional<int64_t>* pad) {
  const std::string& where = keys.where;
  const ConfigDefaults& d = *spec.defaults;
  const BodyOptions& o = spec.body;
  auto k = [&](const char* field) { return config_key(spec.id, field); };
  for (const auto& [key, allowed] : {std::pair{"score_function", "sigmoid"}, std::pair{"hidden_act", "silu"}}) {
    const Json* v = keys.find(key);
    TORCH_CHECK_VALUE(!v || (v->is_string() && v->as_string() == allowed), where, ": key '", key, "' is ",
                      v ? shown(*v) : "", "; ", spec.display_name, " checkpoints use '", allowed, "'");
  }
  if (const Json* v = keys.find("norm_topk_prob"); v && o.moe) {
    TORCH_CHECK_VALUE(v->is_bool() && v->as_bool(), where,
                      ": key 'norm_topk_prob' must be true (the experts' weights are normalised, as published)");
  }
  ModelConfig c;
  c.family = spec.id;
  c.d_model = keys.integer(k("d_model"));
  c.n_heads = keys.integer(k("n_heads"));
  // Before anything divides by it.
  TORCH_CHECK_VALUE(c.n_heads > 0, where, ": key '", k("n_heads"), "' must be a positive integer, got ", c.n_heads);
  // head_dim: explicit (0 is a value, refused by validate() as the reference refuses it), or derived.
  const bool head_dim_given = o.explicit_head_size && keys.find(k("head_size")) != nullptr;
  const int64_t head_dim = head_dim_given ? keys.integer(k("head_size")) : floor_div(c.d_model, c.n_heads);
  TORCH_CHECK_VALUE(head_dim_given || head_dim > 0, where, ": key '", k("n_heads"), "' = ", c.n_heads, " is more than ",
                    k("d_model"), " = ", c.d_model, ": the head size ", k("d_model"), " // ", k("n_heads"),
                    " would be ", head_dim, " (set head_dim, or fewer heads)");
  // Unlike the other keys, a null partial_rotary_factor is an error, not the default.
  double factor = d.partial_rotary_factor;
  if (o.partial_rotary && keys.j.contains("partial_rotary_factor")) {
    const Json& v = keys.j.at("partial_rotary_factor");
    const bool ok = v.is_number() && std::isfinite(v.as_double()) && v.as_double() > 0 && v.as_double() <= 1;
    TORCH_CHECK_VALUE(ok, where, ": key 'partial_rotary_factor' must be a number in (0, 1], got ", shown(v));
    factor = v.as_double();
  }
  c.vocab_size = keys.integer("vocab_size");
  // num_experts absent: the config class's default; null: every layer dense (no MoE key is read then).
  const bool moe = o.moe && !(keys.j.contains("num_experts") && keys.j.at("num_experts").is_null());
  c.num_experts = moe ? keys.optional_integer("num_experts", d.num_experts) : 0;
  // 0 experts is not "dense" (that is null): the reference would route over none.
  TORCH_CHECK_VALUE(!moe || c.num_experts > 0, where, ": key 'num_experts' = ", c.num_experts,
                    " must be in [1, 65536] (or null: every layer dense)");
  c.moe_hidden_size = moe ? keys.optional_integer(k("moe_hidden_size"), 0) : 0;
  TORCH_CHECK(!moe || keys.find(k("moe_hidden_size")), where, ": required key '", k("moe_hidden_size"),
              "' is missing (num_experts is set)");
  c.first_dense_layers = moe ? keys.optional_integer(k("first_dense_layers"), 0) : 0;
  if (keys.find(k("mlp_hidden_size"))) {
    c.mlp_hidden_size = keys.integer(k("mlp_hidden_size"));
  } else {
    TORCH_CHECK(moe && c.first_dense_layers == 0, where, ": required key '", k("mlp_hidden_size"),
                "' is missing (dense MLP layers)");
    c.mlp_hidden_size = c.moe_hidden_size;  // no dense layer reads it
  }
  // The row's ids where config.json names none (-1: required).
  const bool mask_given = spec.default_mask_id < 0 || keys.find("mask_token_id") != nullptr;
  const bool eos_given = spec.default_eos_id < 0 || keys.find("eos_token_id") != nullptr;
  c.mask_token_id = mask_given ? keys.id("mask_token_id") : spec.default_mask_id;
  c.eos_token_id = eos_given ? keys.id("eos_token_id") : spec.default_eos_id;
  c.n_layers = keys.integer(k("n_layers"));
  c.n_kv_heads = keys.optional_integer(k("n_kv_heads"), c.n_heads);
  c.embedding_size = c.vocab_size;
  c.rope_theta = keys.optional_number("rope_theta", d.rope_theta);
  c.rms_norm_eps = keys.optional_number("rms_norm_eps", d.rms_norm_eps);
  c.weight_tying = keys.optional_boolean(k("weight_tying"), false);
  c.max_sequence_length = keys.optional_integer(k("max_sequence_length"), d.max_sequence_length);
  if (keys.find("pad_token_id")) *pad = keys.id("pad_token_id");
  // The optional parts: config.json chooses (Option::kConfig, with the class's default), else the row.
  auto part = [&](Option option, const char* field, bool fallback) {
    if (option == Option::kNever) {  // a key naming a part the family lacks may only say so (SDAR's attention_bias)
      const Json* v = keys.find(k(field));
      TORCH_CHECK_VALUE(!v || (v->is_bool() && !v->as_bool()), where, ": key '", k(field),
                        "' must be false: ", spec.display_name, " checkpoints have no such part");
    }
    return option == Option::kConfig ? keys.optional_boolean(k(field), fallback) : option == Option::kAlways;
  };
  c.attention_bias = part(o.qkv_bias, "attention_bias", d.qkv_bias);
  c.head_size = o.explicit_head_size ? head_dim : 0;
  // Python's int(head_dim * factor) (a derived 0 is refused by validate(), naming partial_rotary_factor); a
  // head_dim out of range is refused by validate() before rope_dims is read.
  c.rope_dims = o.partial_rotary && head_dim >= 0 && head_dim <= kMaxDim
                    ? static_cast<int64_t>(static_cast<double>(head_dim) * factor)
                    : 0;
  c.qk_norm = part(o.qk_norm, "qk_norm", d.qk_norm);
  c.attn_out_bias = part(o.attn_out_bias, "attn_out_bias", d.attn_out_bias);
  c.experts_per_token = moe ? keys.optional_integer(k("experts_per_token"), d.experts_per_token) : 0;
  c.expert_groups = moe ? keys.optional_integer(k("expert_groups"), d.expert_groups) : 1;
  c.expert_groups_kept = moe ? keys.optional_integer(k("expert_groups_kept"), d.expert_groups_kept) : 1;
  c.shared_experts = moe ? keys.optional_integer(k("shared_experts"), d.shared_experts) : 0;
  c.routed_scaling = moe ? keys.optional_number(k("routed_scaling"), d.routed_scaling) : 1.0;

  // check_config: worded with the family's keys, before the shared validator.
  TORCH_CHECK_VALUE(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0, where, ": key '", k("n_kv_heads"),
                    "' = ", c.n_kv_heads, " must divide ", k("n_heads"), " = ", c.n_heads);
  keys.outside("mask_token_id", c.mask_token_id, c.vocab_size, mask_given ? "" : " (the authors' default)");
  keys.outside("eos_token_id", c.eos_token_id, c.vocab_size, eos_given ? "" : " (the authors' default)");
  return c;
}
}  // namespace

ModelConfig parse_model_config(const std::string& text, const std::string& where,
                               const std::string& generation_config_path) {
  Json j = parse_or_throw(text, where);
  TORCH_CHECK(j.is_object(), where, ": expected a JSON object at top level");
  TORCH_CHECK(j.contains("model_type"), where, ": key 'model_type' is missing");
  const Json& model_type = j.at("model_type");
  const std::string type = model_type.is_string() ? model_type.as_string() : "";
  const FamilySpec* found = family_by_model_type(type);
  TORCH_CHECK(found, where, ": key 'model_type' must be ", model_types_text());
  const FamilySpec& spec = *found;
  const Family family = spec.id;
  const bool dream = spec.ids_in_generation_config;
  // A config.json in Qwen2's key names (Dream): its keys as Qwen2 reads them (optional tie_word_embeddings,
  // special ids as lists) and its messages.
  const bool qwen = !spec.keys.empty();

  // Dream keeps its special ids in generation_config.json too; config.json wins (as
  // ModelConfig.from_json_file does). Values read from it are still reported under `where`.
  Json generation;
  if (dream && !generation_config_path.empty() && is_regular_file(generation_config_path)) {
    generation = parse_or_throw(read_file(generation_config_path, "generation_config.json"), generation_config_path);
  }
  const KeyReader keys{j, generation, where, dream};

  ModelConfig c;
  std::optional<int64_t> pad, bos;
  if (spec.defaults != nullptr) {
    c = read_with_defaults(keys, spec, &pad);
  } else {
    c.family = family;
    c.attention_bias = spec.body.qkv_bias == Option::kAlways;  // Dream's q/k/v projections always carry biases
    // Field by field: the LLaDA key, or the Qwen2 key a Dream config.json holds it under.
    auto k = [&](const char* field) { return config_key(family, field); };
    c.d_model = keys.integer(k("d_model"));
    c.n_layers = keys.integer(k("n_layers"));
    c.n_heads = keys.integer(k("n_heads"));
    c.n_kv_heads = keys.optional_integer(k("n_kv_heads"), c.n_heads);
    c.mlp_hidden_size = keys.integer(k("mlp_hidden_size"));
    c.vocab_size = keys.integer("vocab_size");
    c.embedding_size = qwen ? c.vocab_size : keys.optional_integer("embedding_size", c.vocab_size);
    c.mask_token_id = keys.integer("mask_token_id");
    c.eos_token_id = keys.id("eos_token_id");
    c.max_sequence_length = keys.integer(k("max_sequence_length"));
    // Dream (as Qwen2) leaves the embeddings untied unless told; LLaDA must say.
    c.weight_tying = false;
    if (!qwen || keys.find(k("weight_tying"))) c.weight_tying = keys.boolean(k("weight_tying"));
    c.rope_theta = keys.number("rope_theta");
    c.rms_norm_eps = keys.number("rms_norm_eps");
    if (keys.find("pad_token_id")) pad = qwen ? keys.id("pad_token_id") : keys.integer("pad_token_id");  // as config.py
    if (qwen && keys.find("bos_token_id")) bos = keys.id("bos_token_id");
  }

  if (qwen && spec.defaults == nullptr) {  // ModelConfig._validate_dream: its messages, naming the Qwen2 keys
    TORCH_CHECK_VALUE(c.n_heads > 0, where, ": key 'num_attention_heads' = ", c.n_heads, " must be positive");
    TORCH_CHECK_VALUE(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0, where,
                      ": key 'num_key_value_heads' = ", c.n_kv_heads, " must divide num_attention_heads = ", c.n_heads,
                      " (grouped-query attention)");
    TORCH_CHECK_VALUE(c.d_model % c.n_heads == 0, where, ": key 'hidden_size' = ", c.d_model,
                      " is not a multiple of num_attention_heads = ", c.n_heads);
    keys.outside("mask_token_id", c.mask_token_id, c.vocab_size);
  }
  try {
    c.validate();
  } catch (const c10::Error& e) {
    std::string msg = e.msg();
    if (msg.rfind("config: ", 0) == 0) msg = msg.substr(8);
    TORCH_CHECK_VALUE(false, where, ": ", msg);  // validate() names the keys the family's config.json holds
  }
  if (pad) keys.outside("pad_token_id", *pad, c.vocab_size);
  if (bos) keys.outside("bos_token_id", *bos, c.vocab_size);
  return c;
}

ModelConfig read_model_config(const std::string& folder) {
  const std::string config_path = folder + "/config.json";
  TORCH_CHECK(exists(config_path), config_path, ": config.json not found");
  return parse_model_config(read_file(config_path, "config.json"), config_path, folder + "/generation_config.json");
}

LoadedCheckpoint load_checkpoint(const std::string& folder) {
  LoadedCheckpoint out;
  const std::string config_path = folder + "/config.json";
  out.config = read_model_config(folder);
  const Family family = out.config.family;
  const FamilySpec& spec = family_spec(family);

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
  const int64_t held = static_cast<int64_t>(file_of.size());
  TORCH_CHECK_VALUE(out.config.n_layers <= held, config_path, ": key '", config_key(family, "n_layers"),
                    "' = ", out.config.n_layers, " needs ", out.config.tensor_count(),
                    " tensors but the weight files hold ", held);
  // A MoE list also grows with num_experts (three tensors an expert in every MoE layer): it is
  // listed only while it is at most twice what the files hold, so that a few missing tensors are
  // still named one by one.
  TORCH_CHECK_VALUE(!spec.body.moe || out.config.tensor_count() <= 2 * held, config_path, ": keys '",
                    config_key(family, "n_layers"), "' = ", out.config.n_layers,
                    " and 'num_experts' = ", out.config.num_experts, " need ", out.config.tensor_count(),
                    " tensors but the weight files hold ", held);
  // Weights are checked finite unless BLOCKBATCH_CHECK_FINITE=0 (python/blockbatch/settings.py).
  const char* env = std::getenv("BLOCKBATCH_CHECK_FINITE");
  TORCH_CHECK_VALUE(env == nullptr || *env == '\0' || std::strcmp(env, "0") == 0 || std::strcmp(env, "1") == 0,
                    "BLOCKBATCH_CHECK_FINITE must be '1' or '0', got '", env ? env : "", "'");
  const bool check_finite = env == nullptr || std::strcmp(env, "0") != 0;
  std::set<std::string> expected_names;
  for (const auto& [name, shape] : weight_shapes(out.config)) {
    expected_names.insert(name);
    auto it = file_of.find(name);
    if (it == file_of.end()) {
      // Sharded: the index decides what exists, so say it is the index that leaves the tensor out.
      TORCH_CHECK(listing == index_path, listing, ": tensor '", name, "' is missing", missing_tensor_hint(spec, name));
      TORCH_CHECK(false, index_path, ": the index (model.safetensors.index.json) does not list tensor '", name, "'",
                  missing_tensor_hint(spec, name));
    }
    const TensorEntry* e = files[it->second]->find(name);
    TORCH_CHECK(e->shape == shape, it->second, ": tensor '", name, "' has shape ", c10::IntArrayRef(e->shape),
                ", expected ", c10::IntArrayRef(shape));
    out.weights[name] = files[it->second]->tensor(name);
    if (check_finite) {
      // One pass, no temporary (0.15-0.25 s per GB, one thread): NaN makes both ends NaN, Inf shows at an end.
      const at::Tensor& t = out.weights[name];
      if (t.numel() > 0) {
        const auto [lo, hi] = at::aminmax(t);
        const double low = lo.item<double>(), high = hi.item<double>();
        TORCH_CHECK_VALUE(std::isfinite(low) && std::isfinite(high), it->second, ": tensor '", name,
                          "' holds a non-finite value (", std::isnan(low) || std::isnan(high) ? "NaN" : "Inf",
                          "); a model with NaN / Inf weights decodes garbage (BLOCKBATCH_CHECK_FINITE=0 skips this "
                          "check)");
      }
    }
  }
  for (const auto& [path, f] : files) {
    for (const auto& e : f->entries()) {
      TORCH_CHECK(expected_names.count(e.name), path, ": unexpected tensor '", e.name, "' (not part of a ",
                  spec.display_name, " model with this config)");
    }
  }
  return out;
}

std::unique_ptr<Network> build_model(const LoadedCheckpoint& checkpoint, c10::ScalarType dtype) {
  return std::make_unique<Transformer>(checkpoint.config, checkpoint.weights, dtype);
}

}  // namespace blockbatch::io

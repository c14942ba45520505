// Strict safetensors reader: the header is validated completely (dtypes, shapes, offsets that
// tile the data section exactly, file size) before any tensor data is touched; data is mmapped.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/config.h"
#include "model/network.h"

namespace blockbatch::io {

struct TensorEntry {
  std::string name;
  std::string dtype;  // safetensors tag: F32, BF16, ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  // Throws c10::Error naming the file (and tensor) when the file is malformed.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorEntry>& entries() const { return entries_; }
  const TensorEntry* find(const std::string& name) const;
  // A CPU tensor viewing the mapped bytes (keeps the mapping alive). Weight dtypes only.
  at::Tensor tensor(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  size_t data_offset_ = 0;
  std::vector<TensorEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// Open `path` read-only after checking it is a regular file (not a directory, FIFO or device;
// a FIFO never blocks the open); `what` names the file's role in errors. Returns the descriptor
// and the file size; throws c10::Error naming the file (missing, symbolic link loop, ...).
int open_regular_file(const std::string& path, const char* what, uint64_t* size);

// Parse config.json text into a validated ModelConfig (errors name `where` and the key the file
// holds). The family follows model_type: "llada" (LLaDA keys), "Dream" (Qwen2 keys: hidden_size,
// num_hidden_layers, ...; q/k/v biases) or "llada2_moe" (Qwen2 keys plus LLaDA2's head_dim,
// partial_rotary_factor, use_qk_norm, the MoE keys; missing optional keys take the defaults of
// families/llada2.py read_config). For Dream, special ids config.json lacks (mask, eos, pad, bos)
// are taken from generation_config_path when that file exists, as the Python loader does.
ModelConfig parse_model_config(const std::string& text, const std::string& where,
                               const std::string& generation_config_path = "");

// The ModelConfig of the checkpoint folder `folder` (its config.json, + generation_config.json for
// Dream), without opening the weights.
ModelConfig read_model_config(const std::string& folder);

struct LoadedCheckpoint {
  ModelConfig config;
  std::unordered_map<std::string, at::Tensor> weights;  // HF names, CPU, mmapped
};

// Read a Hugging Face checkpoint folder (LLaDA, Dream or LLaDA2): config.json (+ generation_config.json
// for Dream) plus model.safetensors or the shards of model.safetensors.index.json. Tensor names
// (the family's Hugging Face names) and shapes are checked against the config.
LoadedCheckpoint load_checkpoint(const std::string& folder);

// The native model of the checkpoint (the one body, model/transformer.h, assembled by its family's
// row), its weights converted to `dtype`.
std::unique_ptr<Network> build_model(const LoadedCheckpoint& checkpoint, c10::ScalarType dtype);

}  // namespace blockbatch::io

// bb_forward: load a Hugging Face checkpoint of any family (model/families.cpp) with the strict C++ reader and time
// the native packed forward. One result line per configuration.
//
//   bb_forward --model DIR [--dtype float32|bfloat16] [--mode full|dual|prefix]
//              [--lengths 4,8,16,32,64,128] [--canvas 512] [--iters 5] [--threads N]
#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"
#include "model/families.h"

namespace {

struct Options {
  std::string model;
  std::string dtype = "float32";
  std::string mode = "dual";
  std::vector<int64_t> lengths = {4, 8, 16, 32, 64, 128};
  int64_t canvas = 512;
  int iters = 5;
  int threads = 0;
};

void print_usage() {
  const std::string names = blockbatch::family_names_text();
  std::cout << "bb_forward: time the native BlockBatch forward on a Hugging Face " << names << " checkpoint.\n\n"
            << "Usage: bb_forward --model DIR [options]\n\n"
               "  --model DIR        checkpoint folder (config.json + model.safetensors or sharded index); the family\n"
               "                     ("
            << names
            << ") is config.json's model_type\n"
               "  --dtype T          float32 (default) or bfloat16: weights are converted on load\n"
               "  --mode M           dual (default): each row's window attends to its own KV row of --canvas slots;\n"
               "                     prefix: window + nothing cached before it; full: whole canvas per row\n"
               "  --lengths a,b,...  query lengths of the packed rows (default 4,8,16,32,64,128 = 252 tokens)\n"
               "  --canvas L         KV row length / canvas size (default 512)\n"
               "  --iters N          timed repetitions after one warm-up (default 5); the median is printed\n"
               "  --threads N        intra-op threads (default: torch's choice)\n"
               "  --help             this text\n\n"
               "Query tokens are (i * 7919) mod vocab for packed token i; positions end at the canvas end\n"
               "(mode full: start at 0); the KV rows start zeroed. The logits are the model's outputs, unshifted\n"
               "(Dream reads position p from output p - 1; not applied here). Prints the config read\n"
               "(model family=... d_model=... ...), the logits statistics and one line:\n"
               "  result mode=... rows=... tokens=... canvas=... ms_median=... tokens_per_s=...\n";
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "error: " << a << " needs a value (see --help)\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      print_usage();
      std::exit(0);
    } else if (a == "--model") {
      o.model = next();
    } else if (a == "--dtype") {
      o.dtype = next();
    } else if (a == "--mode") {
      o.mode = next();
    } else if (a == "--canvas") {
      o.canvas = std::stoll(next());
    } else if (a == "--iters") {
      o.iters = std::stoi(next());
    } else if (a == "--threads") {
      o.threads = std::stoi(next());
    } else if (a == "--lengths") {
      o.lengths.clear();
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) o.lengths.push_back(std::stoll(item));
    } else {
      std::cerr << "error: unknown argument '" << a << "' (see --help)\n";
      std::exit(2);
    }
  }
  if (o.model.empty()) {
    std::cerr << "error: --model DIR is required (see --help)\n";
    std::exit(2);
  }
  if (o.iters < 1 || o.canvas < 1 || o.lengths.empty()) {
    std::cerr << "error: --iters, --canvas must be >= 1 and --lengths non-empty\n";
    std::exit(2);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (o.threads > 0) at::set_num_threads(o.threads);
  return blockbatch::bench::run_main([&]() -> int {
    const auto model = blockbatch::bench::load_model(o.model, o.dtype);
    const auto& c = model->config();
    blockbatch::bench::print_config(c);
    const int64_t L = std::min(o.canvas, c.max_sequence_length);
    blockbatch::ForwardBatch b;
    b.mode = blockbatch::parse_kv_mode(o.mode);
    std::vector<int64_t> cu = {0};
    std::vector<at::Tensor> pos;
    for (int64_t n : o.lengths) {
      TORCH_CHECK(n > 0 && n <= L, "--lengths entries must be in [1, canvas]");
      cu.push_back(cu.back() + n);
      const int64_t start = b.mode == blockbatch::KvMode::kFull ? 0 : L - n;
      pos.push_back(at::arange(start, start + n, at::kLong));
    }
    const int64_t rows = static_cast<int64_t>(o.lengths.size());
    b.positions = at::cat(pos);
    // Deterministic tokens so that other implementations can reproduce the printed statistics.
    b.tokens = at::arange(cu.back(), at::kLong).mul(7919).remainder(c.vocab_size);
    b.cu_seqlens = at::tensor(cu, at::kLong);
    if (b.mode != blockbatch::KvMode::kFull) b.kv = model->new_kv(rows, L);
    if (b.mode == blockbatch::KvMode::kPrefix) {
      std::vector<int64_t> prefix;
      for (int64_t n : o.lengths) prefix.push_back(L - n);
      b.prefix_lens = at::tensor(prefix, at::kLong);
    }
    at::Tensor logits = model->forward(b);  // warm-up
    std::vector<double> ms;
    for (int i = 0; i < o.iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      logits = model->forward(b);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    at::Tensor all = logits.to(at::kFloat);
    std::printf("logits shape=[%lld, %lld] mean=%.6f std=%.6f argmax[0]=%lld\n", static_cast<long long>(logits.size(0)),
                static_cast<long long>(logits.size(1)), all.mean().item<double>(), all.std().item<double>(),
                static_cast<long long>(all[0].argmax().item<int64_t>()));
    std::printf(
        "result mode=%s dtype=%s rows=%lld tokens=%lld canvas=%lld threads=%d ms_median=%.3f tokens_per_s=%.1f\n",
        o.mode.c_str(), o.dtype.c_str(), static_cast<long long>(rows), static_cast<long long>(cu.back()),
        static_cast<long long>(L), at::get_num_threads(), median, 1000.0 * cu.back() / median);
    return 0;
  });
}

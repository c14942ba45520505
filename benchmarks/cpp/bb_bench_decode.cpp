// bb_bench_decode: decode a JSONL of prompts with the native loop, outside Python.
//
//   bb_bench_decode --model DIR --prompts FILE.jsonl [--policy blockbatch] [--gen-length 128]
//                   [--block-length 32] [--threshold 0.9] [--block-sizes 4,8,16,32,64,128]
//                   [--repeats 1] [--verify] [--threads N]
//
// Each JSONL line is an object with "prompt_ids" (list of token ids) and, for --verify,
// "expected_ids" (the generated ids the engine must produce, e.g. written by the Python API).
// One result line per configuration; with --verify a Disposition line and exit status 3 on a
// mismatch.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "decode/decode.h"
#include "common.h"
#include "io/json.h"

namespace {

struct Options {
  std::string model, prompts, policy = "blockbatch", dtype = "float32";
  blockbatch::DecodeOptions decode;
  int repeats = 1;
  int threads = 0;
  bool verify = false;
};

void print_usage() {
  std::cout <<
      "bb_bench_decode: decode prompts from a JSONL file with the native BlockBatch loop and time it.\n\n"
      "Usage: bb_bench_decode --model DIR --prompts FILE.jsonl [options]\n\n"
      "  --model DIR          Hugging Face LLaDA checkpoint folder (read by the strict C++ reader)\n"
      "  --prompts FILE       JSONL, one object per line: {\"prompt_ids\": [...], \"expected_ids\": [...]}\n"
      "  --policy P           vanilla | prefix | dual | blockbatch (default blockbatch)\n"
      "  --gen-length N       tokens to generate (default 128)\n"
      "  --block-length B     block size of the single-branch policies (default 32)\n"
      "  --threshold T        commit threshold in (0, 1] (default 0.9)\n"
      "  --steps S            use LLaDA's fixed schedule with S total steps instead of the threshold\n"
      "  --block-sizes LIST   BlockBatch branches, comma-separated (default 4,8,16,32,64,128)\n"
      "  --no-eos-exit        BlockBatch: decode the whole canvas (default: stop at the first EOS block)\n"
      "  --dtype T            float32 (default) or bfloat16\n"
      "  --repeats R          decode every prompt R times; the median time is reported (default 1)\n"
      "  --verify             compare generated ids with \"expected_ids\"; exit 3 on any mismatch\n"
      "  --threads N          intra-op threads (default: torch's choice)\n"
      "  --help               this text\n\n"
      "Output: one line\n"
      "  result policy=... prompts=N nfe_mean=... ms_per_sample=... tokens_per_s=...\n"
      "and with --verify: Disposition: Passed | Failed (k of N prompts differ)\n";
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  o.decode.policy = blockbatch::Policy::kBlockBatch;
  o.decode.stop_on_eos = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "error: " << a << " needs a value (see --help)\n";
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--help" || a == "-h") {
        print_usage();
        std::exit(0);
      } else if (a == "--model") {
        o.model = next();
      } else if (a == "--prompts") {
        o.prompts = next();
      } else if (a == "--policy") {
        o.policy = next();
        o.decode.policy = blockbatch::parse_policy(o.policy);
        o.decode.stop_on_eos = o.decode.policy == blockbatch::Policy::kBlockBatch;
      } else if (a == "--gen-length") {
        o.decode.gen_length = std::stoll(next());
      } else if (a == "--block-length") {
        o.decode.block_length = std::stoll(next());
      } else if (a == "--threshold") {
        o.decode.threshold = std::stod(next());
      } else if (a == "--steps") {
        o.decode.steps = std::stoll(next());
        o.decode.commit = blockbatch::CommitRule::kFixed;
      } else if (a == "--block-sizes") {
        o.decode.block_sizes = parse_list(next());
      } else if (a == "--no-eos-exit") {
        o.decode.stop_on_eos = false;
      } else if (a == "--dtype") {
        o.dtype = next();
      } else if (a == "--repeats") {
        o.repeats = std::stoi(next());
      } else if (a == "--threads") {
        o.threads = std::stoi(next());
      } else if (a == "--verify") {
        o.verify = true;
      } else {
        std::cerr << "error: unknown argument '" << a << "' (see --help)\n";
        std::exit(2);
      }
    } catch (const std::invalid_argument&) {
      std::cerr << "error: " << a << " needs a number (see --help)\n";
      std::exit(2);
    } catch (const c10::Error& e) {
      std::cerr << "error: " << e.msg() << "\n";
      std::exit(2);
    }
  }
  if (o.model.empty() || o.prompts.empty()) {
    std::cerr << "error: --model DIR and --prompts FILE are required (see --help)\n";
    std::exit(2);
  }
  if (o.repeats < 1) {
    std::cerr << "error: --repeats must be >= 1\n";
    std::exit(2);
  }
  std::sort(o.decode.block_sizes.begin(), o.decode.block_sizes.end());
  return o;
}

struct Sample {
  std::vector<int64_t> prompt, expected;
};

std::vector<Sample> read_prompts(const std::string& path, bool need_expected) {
  std::ifstream in(path);
  TORCH_CHECK(in.good(), path, ": cannot open");
  std::vector<Sample> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    blockbatch::io::Json j;
    try {
      j = blockbatch::io::Json::parse(line);
    } catch (const std::runtime_error& e) {
      TORCH_CHECK(false, path, ":", n, ": not valid JSON (", e.what(), ")");
    }
    TORCH_CHECK(j.is_object() && j.contains("prompt_ids") && j.at("prompt_ids").is_array(), path, ":", n,
                ": needs a \"prompt_ids\" list");
    Sample s;
    for (const auto& v : j.at("prompt_ids").as_array()) {
      TORCH_CHECK(v.is_integer(), path, ":", n, ": prompt_ids must hold integers");
      s.prompt.push_back(v.as_int());
    }
    if (need_expected) {
      TORCH_CHECK(j.contains("expected_ids") && j.at("expected_ids").is_array(), path, ":", n,
                  ": --verify needs an \"expected_ids\" list");
      for (const auto& v : j.at("expected_ids").as_array()) s.expected.push_back(v.as_int());
    }
    out.push_back(std::move(s));
  }
  TORCH_CHECK(!out.empty(), path, ": no prompts");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (o.threads > 0) at::set_num_threads(o.threads);
  return blockbatch::bench::run_main([&]() -> int {
    blockbatch::Model model = blockbatch::bench::load_model(o.model, o.dtype);
    const auto samples = read_prompts(o.prompts, o.verify);
    double nfe_sum = 0, generated = 0;
    std::vector<double> ms;
    int mismatches = 0;
    for (const auto& s : samples) {
      std::vector<double> per;
      blockbatch::DecodeResult r;
      for (int k = 0; k < o.repeats; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        r = blockbatch::decode(model, s.prompt, o.decode);
        per.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(per.begin(), per.end());
      ms.push_back(per[per.size() / 2]);
      nfe_sum += r.stats.nfe;
      generated += static_cast<double>(o.decode.gen_length);
      if (o.verify) {
        std::vector<int64_t> got(r.tokens.begin() + s.prompt.size(), r.tokens.end());
        if (got != s.expected) ++mismatches;
      }
    }
    double total_ms = 0;
    for (double m : ms) total_ms += m;
    std::sort(ms.begin(), ms.end());
    std::printf("result policy=%s dtype=%s prompts=%zu gen_length=%lld nfe_mean=%.2f ms_per_sample_median=%.3f "
                "tokens_per_s=%.1f threads=%d\n",
                o.policy.c_str(), o.dtype.c_str(), samples.size(), static_cast<long long>(o.decode.gen_length),
                nfe_sum / samples.size(), ms[ms.size() / 2], 1000.0 * generated / total_ms, at::get_num_threads());
    if (o.verify) {
      if (mismatches == 0) {
        std::printf("Disposition: Passed\n");
      } else {
        std::printf("Disposition: Failed (%d of %zu prompts differ)\n", mismatches, samples.size());
        return 3;
      }
    }
    return 0;
  });
}

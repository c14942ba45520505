// bb_bench_decode: decode a JSONL of prompts with the native loop, outside Python.
//
//   bb_bench_decode --model DIR --prompts FILE.jsonl [--policy blockbatch] [--gen-length 128]
//                   [--block-sizes 4,8,16,32,64,128] [any decode option] [--repeats 1] [--verify]
//
// Every decode option is a flag (`--gen-length 128`, `--no-merge`), parsed by set_option from the
// options table (python/blockbatch/contract.py), so this binary, the Python CLI and the op take
// the same options with the same defaults; under the flags, a family's own defaults (LLaDA2:
// policy 'block' at threshold 0.95), as blockbatch generate applies them. Each JSONL line is an
// object with "prompt_ids" (list of token ids) and, for --verify, "expected_ids" (the generated
// ids the engine must produce, e.g. written by the Python API). One result line per
// configuration; with --verify a Disposition line and exit status 3 on a mismatch.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>
#include <sys/stat.h>

#include "common.h"
#include "decode/decode.h"
#include "decode/policies/policy.h"
#include "io/json.h"
#include "model/families.h"

namespace {

struct Options {
  std::string model, prompts, dtype = "float32";
  blockbatch::DecodeOptions decode;
  std::set<std::string> given;  // the decode options set by a flag (a family's defaults go under the rest)
  int repeats = 1;
  int threads = 0;
  bool verify = false;
};

void print_usage() {
  std::cout << "bb_bench_decode: decode prompts from a JSONL file with the native BlockBatch loop and time it.\n\n"
               "Usage: bb_bench_decode --model DIR --prompts FILE.jsonl [options]\n\n"
            << "  --model DIR          Hugging Face " << blockbatch::family_names_text()
            << " checkpoint folder (read by the strict C++\n"
               "                       reader; the family is config.json's model_type)\n"
               "  --prompts FILE       JSONL, one object per line: {\"prompt_ids\": [...], \"expected_ids\": [...]}\n"
               "  --dtype T            float32 (default) or bfloat16\n"
               "  --repeats R          decode every prompt R times; the median time is reported (default 1)\n"
               "  --verify             compare generated ids with \"expected_ids\"; exit 3 on any mismatch\n"
               "  --threads N          intra-op threads (default: torch's choice)\n"
               "  --help               this text\n\n"
               "Decode options (the same as blockbatch generate's and the op's; the policy defaults to blockbatch\n"
               "here, and on LLaDA2 checkpoints, as in blockbatch generate, to block with threshold 0.95 (on SDAR\n"
               "checkpoints to block with threshold 0.85 and blocks of 4) where the flags do not set them; booleans\n"
               "also as --NAME / --no-NAME; 'none' where a value may be None):\n"
            << blockbatch::options_help()
            << "\nOutput: the config read (model family=... d_model=... ...), then one line\n"
               "  result policy=... prompts=N nfe_mean=... ms_per_sample=... tokens_per_s=...\n"
               "and with --verify: Disposition: Passed | Failed (k of N prompts differ)\n";
}

Options parse(int argc, char** argv) {
  Options o;
  o.decode.policy = blockbatch::parse_policy("blockbatch");  // the bench's default (see --help)
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
      } else if (a == "--dtype") {
        o.dtype = next();
      } else if (a == "--repeats") {
        o.repeats = std::stoi(next());
      } else if (a == "--threads") {
        o.threads = std::stoi(next());
      } else if (a == "--verify") {
        o.verify = true;
      } else if (a.rfind("--", 0) == 0) {
        // A decode option: --gen-length N; a boolean also as --merge / --no-merge.
        std::string name = a.substr(2);
        std::replace(name.begin(), name.end(), '-', '_');
        const char* type = blockbatch::option_type(name);
        const bool negated = !type && name.rfind("no_", 0) == 0 && blockbatch::option_type(name.substr(3)) &&
                             std::string(blockbatch::option_type(name.substr(3))) == "bool";
        if (negated) {
          blockbatch::set_option(o.decode, name.substr(3), "false");
          o.given.insert(name.substr(3));
        } else if (type && std::string(type) == "bool" && (i + 1 >= argc || argv[i + 1][0] == '-')) {
          blockbatch::set_option(o.decode, name, "true");  // --merge: a boolean flag without a value
          o.given.insert(name);
        } else if (type) {
          blockbatch::set_option(o.decode, name, next());
          o.given.insert(name);
        } else {
          std::cerr << "error: unknown argument '" << a << "' (see --help)\n";
          std::exit(2);
        }
      } else {
        std::cerr << "error: unknown argument '" << a << "' (see --help)\n";
        std::exit(2);
      }
    } catch (const std::invalid_argument&) {
      std::cerr << "error: " << a << " needs a number (see --help)\n";
      std::exit(2);
    } catch (const std::out_of_range&) {
      std::cerr << "error: " << a << " is out of range (see --help)\n";
      std::exit(2);
    } catch (const c10::Error& e) {
      std::cerr << "error: " << a << ": " << e.msg() << "\n";
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
  return o;
}

bool is_file(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The options a family's requests get where the flags set none: families/<family>.py
// DEFAULT_OPTIONS (the family table's row, model/families.h), which blockbatch generate and the Engine
// put under the caller's options.
void apply_family_defaults(Options& o, blockbatch::Family family) {
  for (const auto& [name, value] : blockbatch::family_spec(family).default_options) {
    if (!o.given.count(name)) blockbatch::set_option(o.decode, name, value);
  }
}

// Why the options cannot decode (family: the checkpoint's, nullptr when unknown), or "" when they
// can: checked before the weights are loaded, so a usage error costs no load.
std::string option_error(const Options& o, const blockbatch::FamilySpec* family) {
  // Some policies read steps with a threshold too (policy 'block': steps per block).
  if (!blockbatch::policy(o.decode.policy).steps_with_confidence && o.decode.steps &&
      o.decode.commit() != blockbatch::CommitRule::kFixed) {
    return "--steps is used only by the fixed schedule, but the options commit by confidence and would ignore it: "
           "pass --threshold none with --steps";
  }
  try {
    o.decode.check();
    blockbatch::check_supported(family, o.decode);
  } catch (const c10::Error& e) {
    return e.msg();
  }
  return "";
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
    // The family's defaults sit under the flags: config.json is read before the options are
    // checked (without it the load below says what is missing, as blockbatch generate does).
    const blockbatch::FamilySpec* family = nullptr;
    if (is_file(o.model + "/config.json")) {
      const blockbatch::ModelConfig config = blockbatch::io::read_model_config(o.model);
      apply_family_defaults(o, config.family);
      family = &blockbatch::family_spec(config.family);
    }
    if (const std::string why = option_error(o, family); !why.empty()) {
      std::cerr << "error: " << why << "\n";
      return 2;
    }
    if (o.decode.block_sizes) std::sort(o.decode.block_sizes->begin(), o.decode.block_sizes->end());
    const auto model = blockbatch::bench::load_model(o.model, o.dtype);
    blockbatch::bench::print_config(model->config());
    const auto samples = read_prompts(o.prompts, o.verify);
    double nfe_sum = 0, generated = 0;
    std::vector<double> ms;
    int mismatches = 0;
    for (const auto& s : samples) {
      std::vector<double> per;
      blockbatch::DecodeResult r;
      for (int k = 0; k < o.repeats; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        r = blockbatch::decode(*model, s.prompt, o.decode);
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
                blockbatch::policy_name(o.decode.policy), o.dtype.c_str(), samples.size(),
                static_cast<long long>(o.decode.gen_length), nfe_sum / samples.size(), ms[ms.size() / 2],
                1000.0 * generated / total_ms, at::get_num_threads());
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

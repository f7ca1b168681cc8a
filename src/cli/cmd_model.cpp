// Subcommands that read or write model files without running them: synth, inspect, tokenize,
// detokenize, devices.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"
#include "commands_impl.h"
#include "tandem/error.h"
#include "tandem/model/gguf.h"
#include "tandem/model/llama_config.h"
#include "tandem/model/synthetic.h"
#include "tandem/model/tokenizer.h"
#include "tandem/registry.h"
#include "tandem/scheduler.h"

namespace tandem::cli {

namespace {

std::string value_string(const gguf::Value& v) {
  using gguf::ValueType;
  switch (v.type) {
    case ValueType::String:
      return v.str.size() > 80 ? v.str.substr(0, 77) + "..." : v.str;
    case ValueType::F32:
    case ValueType::F64:
      return std::to_string(v.f);
    case ValueType::Bool:
      return v.u ? "true" : "false";
    case ValueType::Array: {
      size_t n = v.array_type == ValueType::String ? v.strings.size() : v.numbers.size();
      return "[" + std::string(gguf::value_type_name(v.array_type)) + " x " + std::to_string(n) +
             "]";
    }
    case ValueType::I8:
    case ValueType::I16:
    case ValueType::I32:
    case ValueType::I64:
      return std::to_string(v.i);
    default:
      return std::to_string(v.u);
  }
}

}  // namespace

DType parse_dtype(const std::string& text, const std::string& flag) {
  auto d = dtype_from_name(text);
  if (!d) {
    throw_error(ErrorCode::InvalidArgument, flag,
                "unknown type '" + text + "' (expected f32, f16, bf16, q8_0, q4_0 or q6_k)");
  }
  return *d;
}

void add_synth(CLI::App& app, std::function<int()>& run) {
  auto* cmd =
      app.add_subcommand("synth", "Write a synthetic LLaMA GGUF model (seeded random weights)");
  struct Opts {
    std::string preset = "tiny", type = "f32", out;
    uint64_t seed = 0;
    int threads = 0;
    int64_t n_layer = 0;
    float moe_skew = 0.0f;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--preset", o->preset,
                  "tiny, small, llama-3.2-1b, llama-3.1-8b; with experts tiny-moe, tiny-qwen3moe, "
                  "mixtral-8x7b or qwen3-30b-a3b")
      ->capture_default_str();
  cmd->add_option("--type", o->type,
                  "Matrix type: f32, f16, q8_0, q4_0, or llama.cpp's K-quant mixes q4_k_m, q5_k_m "
                  "and q6_k")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Weight seed")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Generator threads (0: all)");
  cmd->add_option("--n-layer", o->n_layer,
                  "Layers, instead of the preset's (e.g. 64 for an 8B shape twice as deep)");
  cmd->add_option("--moe-skew", o->moe_skew,
                  "Skews the expert routers (>= 0): router row e scaled by exp(-F * e / "
                  "(n_expert - 1)), so the low-numbered experts win far more often");
  cmd->add_option("-o,--out", o->out, "Output GGUF path")->required();
  cmd->callback([&run, o]() {
    run = [o]() {
      SyntheticSpec spec =
          o->type == "q4_k_m"
              ? synthetic_preset(o->preset, DType::Q4_K, o->seed, SyntheticMix::KQuantMedium)
          : o->type == "q5_k_m"
              ? synthetic_preset(o->preset, DType::Q5_K, o->seed, SyntheticMix::KQuantMedium)
              : synthetic_preset(o->preset, parse_dtype(o->type, "--type"), o->seed);
      spec.threads = o->threads;
      TANDEM_CHECK_ARG(
          o->n_layer >= 0 && o->n_layer <= 1024, "--n-layer",
          "must be in [1, 1024], or 0 for the preset's (got " + std::to_string(o->n_layer) + ")");
      if (o->n_layer > 0) spec.n_layer = o->n_layer;
      TANDEM_CHECK_ARG(o->moe_skew == 0.0f || spec.n_expert > 0, "--moe-skew",
                       "preset '" + o->preset + "' has no experts");
      spec.moe_skew = o->moe_skew;
      Progress progress("synth " + o->preset, 1000);
      write_synthetic_model(spec, o->out, [&](uint64_t done, uint64_t total) {
        progress.update(total ? done * 1000 / total : 0);
      });
      progress.finish();
      std::printf("wrote %s (%s, %s)\n", o->out.c_str(), o->preset.c_str(), o->type.c_str());
      return 0;
    };
  });
}

void add_inspect(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("inspect", "Show a GGUF file's metadata and tensors");
  struct Opts {
    std::string model;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("model", o->model, "GGUF file")->required();
  cmd->add_flag("--json", o->json, "JSON output");
  cmd->callback([&run, o]() {
    run = [o]() {
      gguf::File f = gguf::File::open(o->model);
      // general.file_type by llama.cpp's name, as llama.cpp's loader prints it.
      std::string file_type;
      if (f.has("general.file_type")) {
        const uint32_t id = uint32_t(f.get_uint("general.file_type"));
        const std::string_view name = llama_file_type_name(id);
        file_type =
            (name.empty() ? "unknown" : std::string(name)) + " (" + std::to_string(id) + ")";
      }
      // The mixture of experts, when the architecture's keys declare one.
      std::string experts;
      if (f.has("general.architecture")) {
        const std::string arch = f.get_string("general.architecture");
        if (f.has(arch + ".expert_count") && f.get_uint(arch + ".expert_count") > 0) {
          experts = std::to_string(f.get_uint(arch + ".expert_count")) + " experts";
          if (f.has(arch + ".expert_used_count")) {
            experts +=
                ", " + std::to_string(f.get_uint(arch + ".expert_used_count")) + " used per token";
          }
        }
      }
      std::map<std::string, std::pair<size_t, uint64_t>> per_dtype;
      for (const auto& t : f.tensors()) {
        auto& e = per_dtype[std::string(dtype_name(t.dtype))];
        e.first++;
        e.second += t.bytes;
      }
      if (o->json) {
        nlohmann::json j;
        j["file"] = o->model;
        j["version"] = f.version();
        if (!file_type.empty()) j["file_type"] = file_type;
        if (!experts.empty()) j["experts"] = experts;
        for (const auto& [k, v] : f.metadata()) j["metadata"][k] = value_string(v);
        for (const auto& t : f.tensors()) {
          std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
          j["tensors"].push_back({{"name", t.name},
                                  {"dtype", dtype_name(t.dtype)},
                                  {"shape", ne},
                                  {"bytes", t.bytes},
                                  {"offset", t.offset}});
        }
        for (const auto& [d, e] : per_dtype) j["bytes_per_dtype"][d] = e.second;
        std::cout << j.dump(2) << "\n";
        return 0;
      }
      std::printf("%s: GGUF v%u, %zu metadata keys, %zu tensors\n", o->model.c_str(), f.version(),
                  f.metadata().size(), f.tensors().size());
      if (!file_type.empty()) std::printf("file type: %s\n", file_type.c_str());
      if (!experts.empty()) std::printf("mixture of experts: %s\n", experts.c_str());
      std::printf("\n");
      std::vector<std::vector<std::string>> rows;
      for (const auto& [k, v] : f.metadata()) rows.push_back({k, value_string(v)});
      std::cout << markdown_table({"key", "value"}, rows) << "\n";
      rows.clear();
      for (const auto& t : f.tensors()) {
        TensorDesc d = make_tensor_desc(t.name, t.dtype, t.ne, t.n_dims);
        rows.push_back(
            {t.name, std::string(dtype_name(t.dtype)), shape_string(d), format_bytes(t.bytes)});
      }
      std::cout << markdown_table({"tensor", "dtype", "shape", "size"}, rows) << "\n";
      rows.clear();
      uint64_t total = 0;
      for (const auto& [d, e] : per_dtype) {
        rows.push_back({d, std::to_string(e.first), format_bytes(e.second)});
        total += e.second;
      }
      rows.push_back({"total", std::to_string(f.tensors().size()), format_bytes(total)});
      std::cout << markdown_table({"dtype", "tensors", "size"}, rows);
      return 0;
    };
  });
}

void add_devices(CLI::App& app, std::function<int()>& run) {
  auto* cmd =
      app.add_subcommand("devices",
                         "List every backend with its memory, features and capabilities, and why a "
                         "backend this build knows of is absent");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "JSON output");
  cmd->callback([&run, json]() {
    run = [json]() {
      std::vector<std::shared_ptr<Backend>> backends;
      for (const auto& id : available_backend_ids()) backends.push_back(create_backend(id));
      if (*json) {
        nlohmann::json j = nlohmann::json::array();
        for (const auto& b : backends) {
          nlohmann::json e = nlohmann::json::parse(describe_capabilities_json(*b));
          e["memory_total_bytes"] = b->memory().total_bytes;
          e["memory_free_bytes"] = b->memory().free_bytes;
          e["available"] = true;
          j.push_back(e);
        }
        for (const auto& absent : absent_backends()) {
          j.push_back({{"backend", absent.name}, {"available", false}, {"reason", absent.reason}});
        }
        std::cout << j.dump(2) << "\n";
        return 0;
      }
      for (const auto& b : backends) {
        MemoryInfo m = b->memory();
        std::string features;
        for (const auto& f : b->features()) features += (features.empty() ? "" : " ") + f;
        std::printf("%s (%s): memory %s total, %s free; features: %s\n", b->backend_id().c_str(),
                    std::string(backend_kind_name(b->kind())).c_str(),
                    format_bytes(m.total_bytes).c_str(), format_bytes(m.free_bytes).c_str(),
                    features.empty() ? "-" : features.c_str());
        std::cout << describe_capabilities(*b) << "\n";
      }
      for (const auto& absent : absent_backends()) {
        std::printf("%s: absent: %s\n", absent.name.c_str(), absent.reason.c_str());
      }
      return 0;
    };
  });
}

void add_tokenize(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
  struct Opts {
    std::string model, text;
    bool no_bos = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("-m,--model", o->model, "GGUF file")->required();
  cmd->add_option("text", o->text, "Text to tokenize")->required();
  cmd->add_flag("--no-bos", o->no_bos, "Do not add the BOS token");
  cmd->add_flag("--json", o->json, "Print a JSON array");
  cmd->callback([&run, o]() {
    run = [o]() {
      Tokenizer tok = Tokenizer::from_gguf(gguf::File::open(o->model));
      EncodeOptions eo;
      eo.add_bos = !o->no_bos;
      std::vector<int32_t> ids = tok.encode(o->text, eo);
      if (o->json) {
        std::cout << nlohmann::json(ids).dump() << "\n";
      } else {
        for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
        std::printf("\n");
      }
      return 0;
    };
  });
}

void add_detokenize(CLI::App& app, std::function<int()>& run) {
  auto* cmd = app.add_subcommand("detokenize", "Print the text of token ids");
  struct Opts {
    std::string model;
    std::vector<std::string> ids;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("-m,--model", o->model, "GGUF file")->required();
  cmd->add_option("ids", o->ids, "Token ids (\"1 2 3\" or 1,2,3)")->required();
  cmd->callback([&run, o]() {
    run = [o]() {
      Tokenizer tok = Tokenizer::from_gguf(gguf::File::open(o->model));
      std::string joined;
      for (const auto& s : o->ids) joined += s + " ";
      std::vector<int32_t> ids = parse_ids(joined, "ids");
      for (int32_t id : ids) {
        if (id >= tok.n_tokens()) {
          throw_error(ErrorCode::InvalidArgument, "ids",
                      "token id " + std::to_string(id) + " outside the vocabulary (" +
                          std::to_string(tok.n_tokens()) + " tokens)");
        }
      }
      std::printf("%s\n", tok.decode(ids).c_str());
      return 0;
    };
  });
}

}  // namespace tandem::cli

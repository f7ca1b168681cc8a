// The `tandem` Python module over the runtime: Model(path, ...) with generate, tokenize,
// logits as NumPy arrays, and the placement and telemetry as dicts.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cctype>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tandem/error.h"
#include "tandem/runtime.h"

namespace py = pybind11;

namespace {

// 6442450944, "6GiB", "6G", "512MiB", "1.5G": binary multiples, as the command line reads them.
uint64_t memory_bytes(const std::variant<uint64_t, std::string>& size) {
  if (const auto* bytes = std::get_if<uint64_t>(&size)) return *bytes;
  const std::string& text = std::get<std::string>(size);
  size_t used = 0;
  double value = -1.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (char& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  const std::vector<std::pair<std::string, double>> units{
      {"", 1.0},      {"b", 1.0},      {"k", 0x1p10},  {"kib", 0x1p10}, {"kb", 0x1p10},
      {"m", 0x1p20},  {"mib", 0x1p20}, {"mb", 0x1p20}, {"g", 0x1p30},   {"gib", 0x1p30},
      {"gb", 0x1p30}, {"t", 0x1p40},   {"tib", 0x1p40}};
  for (const auto& [name, scale] : units) {
    if (used > 0 && value >= 0.0 && unit == name) return uint64_t(value * scale);
  }
  tandem::throw_error(tandem::ErrorCode::InvalidArgument, "gpu_mem",
                      "expected bytes or a size such as 6GiB (got '" + text + "')");
}

// Text from the tokenizer as str; bytes that are not UTF-8 (a token cut mid-character) become
// U+FFFD rather than an exception.
py::str utf8(std::string_view text) {
  return py::reinterpret_steal<py::str>(
      PyUnicode_DecodeUTF8(text.data(), py::ssize_t(text.size()), "replace"));
}

py::object parse_json(const std::string& text) {
  return py::module_::import("json").attr("loads")(text);
}

py::array_t<float> to_array(std::span<const float> logits, int64_t rows, int64_t n_vocab) {
  py::array_t<float> out =
      rows == 1 ? py::array_t<float>(n_vocab) : py::array_t<float>({rows, n_vocab});
  std::copy(logits.begin(), logits.end(), out.mutable_data());
  return out;
}

class Model {
 public:
  Model(const std::string& path, const std::string& strategy,
        std::optional<std::variant<uint64_t, std::string>> gpu_mem, int64_t n_ctx, int threads,
        std::optional<int> n_gpu_layers, const std::vector<std::string>& pins, bool strict,
        const std::string& cost_profile, bool no_calibrate)
      : session_([&] {
          tandem::SessionOptions o;
          o.model_path = path;
          o.strategy = strategy;
          if (gpu_mem) o.gpu_memory = memory_bytes(*gpu_mem);
          o.n_ctx = n_ctx;
          o.threads = threads;
          o.n_gpu_layers = n_gpu_layers;
          for (const std::string& pin : pins) {
            const size_t eq = pin.rfind('=');
            TANDEM_CHECK_ARG(eq != std::string::npos && eq > 0 && eq + 1 < pin.size(), "pins",
                             "a pin is REGEX=BACKEND (got '" + pin + "')");
            o.pins.push_back({pin.substr(0, eq), pin.substr(eq + 1)});
          }
          o.strict = strict;
          o.cost_profile = cost_profile;
          o.no_calibrate = no_calibrate;
          return o;
        }()) {}

  std::vector<int32_t> tokenize(const std::string& text, bool add_bos) const {
    return session_.tokenize(text, add_bos);
  }
  py::str detokenize(const std::vector<int32_t>& tokens) const {
    return utf8(session_.detokenize(tokens));
  }

  py::str generate(const std::string& prompt, int n_predict, float temperature, int top_k,
                   float top_p, float min_p, float repeat_penalty, uint64_t seed,
                   const py::object& callback) {
    tandem::GenerateOptions g;
    g.n_predict = n_predict;
    g.sampling.temperature = temperature;
    g.sampling.top_k = top_k;
    g.sampling.top_p = top_p;
    g.sampling.min_p = min_p;
    g.sampling.repeat_penalty = repeat_penalty;
    g.sampling.seed = seed;
    std::string text;
    session_.generate(session_.tokenize(prompt), g, [&](int32_t token, std::string_view piece) {
      text += piece;
      if (callback.is_none()) return true;
      const py::object go_on = callback(token, utf8(piece));
      return go_on.is_none() || go_on.cast<bool>();  // only False stops
    });
    return utf8(text);
  }

  // With tokens: from a fresh context, their logits (the last row, or every row with all);
  // without: the logits of the most recent step.
  py::array_t<float> logits(const std::optional<std::vector<int32_t>>& tokens, bool all) {
    const int64_t n_vocab = session_.config().n_vocab;
    if (!tokens) {
      TANDEM_CHECK_ARG(!session_.logits().empty(), "logits", "no token evaluated yet");
      const auto last = session_.logits().last(size_t(n_vocab));
      return to_array(last, 1, n_vocab);
    }
    session_.reset();
    std::span<const float> out;
    {
      py::gil_scoped_release release;
      out = session_.eval(*tokens, all);
    }
    return to_array(out, all ? int64_t(tokens->size()) : 1, n_vocab);
  }

  // Evaluates tokens after the context; the logits of the last one.
  py::array_t<float> eval(const std::vector<int32_t>& tokens) {
    std::span<const float> out;
    {
      py::gil_scoped_release release;
      out = session_.eval(tokens);
    }
    return to_array(out, 1, session_.config().n_vocab);
  }

  void reset() { session_.reset(); }
  py::object placement() { return parse_json(session_.placement_json()); }
  py::object telemetry() const { return parse_json(session_.telemetry_json()); }
  int64_t n_vocab() const { return session_.config().n_vocab; }
  int64_t n_ctx() const { return session_.n_ctx(); }
  int64_t n_past() const { return session_.n_past(); }

 private:
  tandem::Session session_;
};

}  // namespace

PYBIND11_MODULE(tandem, m) {
  m.doc() = "Tandem: LLM inference across a CPU and NVIDIA GPUs";
  // tandem.Error (a RuntimeError) with the runtime's "[where] what (values)" message.
  py::register_exception<tandem::Error>(m, "Error", PyExc_RuntimeError);

  py::class_<Model>(m, "Model")
      .def(py::init<const std::string&, const std::string&,
                    std::optional<std::variant<uint64_t, std::string>>, int64_t, int,
                    std::optional<int>, const std::vector<std::string>&, bool, const std::string&,
                    bool>(),
           py::arg("path"), py::kw_only(), py::arg("strategy") = "auto",
           py::arg("gpu_mem") = py::none(), py::arg("n_ctx") = 0, py::arg("threads") = 0,
           py::arg("n_gpu_layers") = py::none(), py::arg("pins") = std::vector<std::string>{},
           py::arg("strict") = false, py::arg("cost_profile") = "", py::arg("no_calibrate") = false,
           "Loads a GGUF model. strategy: gpu, cpu, auto or only:BACKEND; gpu_mem: bytes or "
           "'6GiB' per GPU; pins: ['REGEX=BACKEND', ...]")
      .def("tokenize", &Model::tokenize, py::arg("text"), py::arg("add_bos") = true)
      .def("detokenize", &Model::detokenize, py::arg("tokens"))
      .def("generate", &Model::generate, py::arg("prompt"), py::kw_only(),
           py::arg("n_predict") = 64, py::arg("temperature") = 0.8f, py::arg("top_k") = 40,
           py::arg("top_p") = 0.95f, py::arg("min_p") = 0.05f, py::arg("repeat_penalty") = 1.0f,
           py::arg("seed") = 0, py::arg("callback") = py::none(),
           "From a fresh context: the prompt, then up to n_predict tokens; returns their text. "
           "callback(token, text) is called per token; returning False stops.")
      .def("logits", &Model::logits, py::arg("tokens") = py::none(), py::arg("all") = false,
           "float32 NumPy logits: of tokens from a fresh context (all=True: every position, "
           "shape (n, n_vocab)), or of the most recent step")
      .def("eval", &Model::eval, py::arg("tokens"),
           "Evaluates tokens after the context; the logits of the last one")
      .def("reset", &Model::reset)
      .def("placement", &Model::placement, "Where the ops run and what each backend holds")
      .def("telemetry", &Model::telemetry, "What the steps measured, per backend")
      .def_property_readonly("n_vocab", &Model::n_vocab)
      .def_property_readonly("n_ctx", &Model::n_ctx)
      .def_property_readonly("n_past", &Model::n_past);
}

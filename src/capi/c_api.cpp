// The C API over a runtime Session: every entry point catches what the runtime throws and turns
// it into a status and a per-thread message.
#include "tandem.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "tandem/error.h"
#include "tandem/runtime.h"

struct tandem_model {
  tandem::Session session;
  std::string placement_json;
  std::string telemetry_json;
};

namespace {

thread_local std::string last_error;

tandem_status fail(tandem_status status, std::string message) {
  last_error = std::move(message);
  return status;
}

tandem_status status_of(tandem::ErrorCode code) {
  switch (code) {
    case tandem::ErrorCode::InvalidArgument:
      return TANDEM_ERROR_INVALID_ARGUMENT;
    case tandem::ErrorCode::Unsupported:
      return TANDEM_ERROR_UNSUPPORTED;
    case tandem::ErrorCode::OutOfMemory:
      return TANDEM_ERROR_OUT_OF_MEMORY;
    case tandem::ErrorCode::DeviceLost:
      return TANDEM_ERROR_DEVICE_LOST;
    case tandem::ErrorCode::Io:
      return TANDEM_ERROR_IO;
    case tandem::ErrorCode::Format:
      return TANDEM_ERROR_FORMAT;
    case tandem::ErrorCode::Internal:
      return TANDEM_ERROR_INTERNAL;
  }
  return TANDEM_ERROR_INTERNAL;
}

// Runs body, turning every exception into a status and the message tandem_last_error gives.
template <typename Body>
tandem_status guarded(const char* where, Body&& body) {
  try {
    return body();
  } catch (const tandem::Error& e) {
    return fail(status_of(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return fail(TANDEM_ERROR_OUT_OF_MEMORY, std::string("[") + where + "] out of host memory");
  } catch (const std::exception& e) {
    return fail(TANDEM_ERROR_INTERNAL, std::string("[") + where + "] " + e.what());
  } catch (...) {
    return fail(TANDEM_ERROR_INTERNAL, std::string("[") + where + "] unknown exception");
  }
}

tandem_status null_argument(const char* where, const char* name) {
  return fail(TANDEM_ERROR_INVALID_ARGUMENT,
              std::string("[") + where + "] " + name + " must not be NULL");
}

}  // namespace

extern "C" {

const char* tandem_last_error(void) {
  return last_error.c_str();
}

const char* tandem_status_name(tandem_status status) {
  switch (status) {
    case TANDEM_OK:
      return "ok";
    case TANDEM_ERROR_INVALID_ARGUMENT:
      return "invalid_argument";
    case TANDEM_ERROR_UNSUPPORTED:
      return "unsupported";
    case TANDEM_ERROR_OUT_OF_MEMORY:
      return "out_of_memory";
    case TANDEM_ERROR_DEVICE_LOST:
      return "device_lost";
    case TANDEM_ERROR_IO:
      return "io";
    case TANDEM_ERROR_FORMAT:
      return "format";
    case TANDEM_ERROR_BUFFER_TOO_SMALL:
      return "buffer_too_small";
    case TANDEM_ERROR_INTERNAL:
      return "internal";
  }
  return "unknown";
}

const char* tandem_version(void) {
  return TANDEM_VERSION;
}

void tandem_load_options_init(tandem_load_options* options) {
  if (!options) return;
  *options = tandem_load_options{};
  options->n_gpu_layers = -1;
}

tandem_status tandem_model_load(const char* path, const tandem_load_options* options,
                                tandem_model** out) {
  if (!out) return null_argument("tandem_model_load", "out");
  *out = nullptr;
  if (!path) return null_argument("tandem_model_load", "path");
  tandem_load_options defaults;
  tandem_load_options_init(&defaults);
  const tandem_load_options& o = options ? *options : defaults;
  return guarded("tandem_model_load", [&] {
    tandem::SessionOptions so;
    so.model_path = path;
    if (o.strategy) so.strategy = o.strategy;
    if (o.gpu_memory > 0) so.gpu_memory = o.gpu_memory;
    if (o.n_gpu_layers >= 0) so.n_gpu_layers = o.n_gpu_layers;
    TANDEM_CHECK_ARG(o.threads >= 0, "tandem_model_load", "threads must be >= 0");
    so.threads = o.threads;
    so.n_ctx = o.n_ctx;
    so.strict = o.strict != 0;
    if (o.cost_profile) so.cost_profile = o.cost_profile;
    so.no_calibrate = o.no_calibrate != 0;
    TANDEM_CHECK_ARG(o.n_pins == 0 || o.pins, "tandem_model_load", "pins is NULL");
    for (size_t i = 0; i < o.n_pins; ++i) {
      const std::string pin = o.pins[i] ? o.pins[i] : "";
      const size_t eq = pin.rfind('=');
      TANDEM_CHECK_ARG(eq != std::string::npos && eq > 0 && eq + 1 < pin.size(),
                       "tandem_model_load", "a pin is REGEX=BACKEND (got '" + pin + "')");
      so.pins.push_back({pin.substr(0, eq), pin.substr(eq + 1)});
    }
    *out = new tandem_model{tandem::Session(so), {}, {}};
    return TANDEM_OK;
  });
}

void tandem_model_free(tandem_model* model) {
  delete model;
}

int32_t tandem_n_vocab(const tandem_model* model) {
  return model ? int32_t(model->session.config().n_vocab) : 0;
}

int64_t tandem_n_ctx(const tandem_model* model) {
  return model ? model->session.n_ctx() : 0;
}

int64_t tandem_n_past(const tandem_model* model) {
  return model ? model->session.n_past() : 0;
}

tandem_status tandem_tokenize(const tandem_model* model, const char* text, int32_t add_bos,
                              int32_t* tokens, size_t capacity, size_t* n_tokens) {
  if (!model) return null_argument("tandem_tokenize", "model");
  if (!text) return null_argument("tandem_tokenize", "text");
  if (!n_tokens) return null_argument("tandem_tokenize", "n_tokens");
  return guarded("tandem_tokenize", [&] {
    const std::vector<int32_t> ids = model->session.tokenize(text, add_bos != 0);
    *n_tokens = ids.size();
    if (ids.size() > capacity || (!tokens && !ids.empty())) {
      return fail(TANDEM_ERROR_BUFFER_TOO_SMALL, "[tandem_tokenize] " + std::to_string(ids.size()) +
                                                     " tokens, room for " +
                                                     std::to_string(tokens ? capacity : 0));
    }
    std::copy(ids.begin(), ids.end(), tokens);
    return TANDEM_OK;
  });
}

tandem_status tandem_detokenize(const tandem_model* model, const int32_t* tokens, size_t n_tokens,
                                char* text, size_t capacity, size_t* length) {
  if (!model) return null_argument("tandem_detokenize", "model");
  if (!tokens && n_tokens > 0) return null_argument("tandem_detokenize", "tokens");
  if (!length) return null_argument("tandem_detokenize", "length");
  return guarded("tandem_detokenize", [&] {
    const std::string s = model->session.detokenize({tokens, n_tokens});
    *length = s.size();
    if (!text || s.size() + 1 > capacity) {
      return fail(TANDEM_ERROR_BUFFER_TOO_SMALL,
                  "[tandem_detokenize] " + std::to_string(s.size() + 1) +
                      " bytes with the NUL, room for " + std::to_string(text ? capacity : 0));
    }
    std::memcpy(text, s.c_str(), s.size() + 1);
    return TANDEM_OK;
  });
}

tandem_status tandem_eval(tandem_model* model, const int32_t* tokens, size_t n_tokens) {
  if (!model) return null_argument("tandem_eval", "model");
  if (!tokens && n_tokens > 0) return null_argument("tandem_eval", "tokens");
  return guarded("tandem_eval", [&] {
    model->session.eval({tokens, n_tokens});
    return TANDEM_OK;
  });
}

tandem_status tandem_logits(const tandem_model* model, const float** logits, size_t* n_vocab) {
  if (!model) return null_argument("tandem_logits", "model");
  if (!logits || !n_vocab) return null_argument("tandem_logits", "logits and n_vocab");
  const auto last = model->session.logits();
  const size_t n = size_t(model->session.config().n_vocab);
  if (last.size() < n) {
    return fail(TANDEM_ERROR_INVALID_ARGUMENT, "[tandem_logits] no token evaluated yet");
  }
  *logits = last.data() + (last.size() - n);
  *n_vocab = n;
  return TANDEM_OK;
}

void tandem_reset(tandem_model* model) {
  if (model) model->session.reset();
}

void tandem_generate_options_init(tandem_generate_options* options) {
  if (!options) return;
  const tandem::GenerateOptions g;
  *options = tandem_generate_options{};
  options->n_predict = g.n_predict;
  options->temperature = g.sampling.temperature;
  options->top_k = g.sampling.top_k;
  options->top_p = g.sampling.top_p;
  options->min_p = g.sampling.min_p;
  options->repeat_penalty = g.sampling.repeat_penalty;
  options->seed = g.sampling.seed;
  options->add_bos = 1;
}

tandem_status tandem_generate(tandem_model* model, const char* prompt,
                              const tandem_generate_options* options,
                              tandem_token_callback on_token, void* user_data,
                              int32_t* n_generated) {
  if (n_generated) *n_generated = 0;
  if (!model) return null_argument("tandem_generate", "model");
  if (!prompt) return null_argument("tandem_generate", "prompt");
  tandem_generate_options defaults;
  tandem_generate_options_init(&defaults);
  const tandem_generate_options& o = options ? *options : defaults;
  return guarded("tandem_generate", [&] {
    tandem::GenerateOptions g;
    g.n_predict = o.n_predict;
    g.sampling.temperature = o.temperature;
    g.sampling.top_k = o.top_k;
    g.sampling.top_p = o.top_p;
    g.sampling.min_p = o.min_p;
    g.sampling.repeat_penalty = o.repeat_penalty;
    g.sampling.seed = o.seed;
    const std::vector<int32_t> ids = model->session.tokenize(prompt, o.add_bos != 0);
    tandem::TokenCallback callback;
    std::string text;  // NUL-terminated for the callback
    if (on_token) {
      callback = [&](int32_t token, std::string_view piece) {
        text.assign(piece);
        return on_token(token, text.c_str(), user_data) == 0;
      };
    }
    const tandem::GenerateResult r = model->session.generate(ids, g, callback);
    if (n_generated) *n_generated = int32_t(r.tokens.size());
    return TANDEM_OK;
  });
}

tandem_status tandem_placement_json(tandem_model* model, const char** json) {
  if (!model) return null_argument("tandem_placement_json", "model");
  if (!json) return null_argument("tandem_placement_json", "json");
  return guarded("tandem_placement_json", [&] {
    model->placement_json = model->session.placement_json();
    *json = model->placement_json.c_str();
    return TANDEM_OK;
  });
}

tandem_status tandem_telemetry_json(tandem_model* model, const char** json) {
  if (!model) return null_argument("tandem_telemetry_json", "model");
  if (!json) return null_argument("tandem_telemetry_json", "json");
  return guarded("tandem_telemetry_json", [&] {
    model->telemetry_json = model->session.telemetry_json();
    *json = model->telemetry_json.c_str();
    return TANDEM_OK;
  });
}

}  // extern "C"

// Text in and out of a session: tokenizing, and generating with a sampler, token by token.
#include <chrono>

#include "tandem/error.h"
#include "tandem/runtime.h"

namespace tandem {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::vector<int32_t> Session::tokenize(std::string_view text, bool add_bos) const {
  EncodeOptions options;
  options.add_bos = add_bos;
  return tokenizer_->encode(text, options);
}

std::string Session::detokenize(std::span<const int32_t> tokens) const {
  for (int32_t t : tokens) {
    TANDEM_CHECK_ARG(t >= 0 && t < config_.n_vocab, "detokenize",
                     "token id " + std::to_string(t) + " outside the vocabulary [0, " +
                         std::to_string(config_.n_vocab) + ")");
  }
  return tokenizer_->decode(tokens);
}

GenerateResult Session::generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                                 const TokenCallback& on_token) {
  TANDEM_CHECK_ARG(options.n_predict >= -1, "generate",
                   "n_predict must be >= 0, or -1 to generate until the end of sequence or "
                   "context (got " +
                       std::to_string(options.n_predict) + ")");
  TANDEM_CHECK_ARG(!prompt.empty(), "generate", "the prompt has no tokens");
  Sampler sampler(options.sampling);
  reset();
  GenerateResult result;
  result.n_prompt = int64_t(prompt.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::span<const float> last = eval(prompt);
  result.prompt_s = seconds_since(t0);
  for (int32_t t : prompt) sampler.accept(t);
  TokenStream stream(*tokenizer_);
  const auto t1 = std::chrono::steady_clock::now();
  const bool until_end = options.n_predict == -1;
  while (until_end || int64_t(result.tokens.size()) < options.n_predict) {
    const int32_t next = sampler.sample(last);
    sampler.accept(next);
    if (tokenizer_->is_end_of_generation(next)) break;
    result.tokens.push_back(next);
    ++tokens_generated_;
    if (on_token && !on_token(next, stream.push(next))) {
      result.stopped = true;
      break;
    }
    if (int64_t(result.tokens.size()) == options.n_predict || past_[0] >= n_ctx_) break;
    last = decode(next);
  }
  result.generate_s = seconds_since(t1);
  const std::string tail = stream.flush();
  if (on_token && !tail.empty()) on_token(kNoToken, tail);
  return result;
}

}  // namespace tandem

// The server's pieces without a socket: chat templates are recognized and rendered, stop strings
// are cut even across tokens, and request bodies are checked field by field.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat_template.h"
#include "request.h"
#include "slots.h"
#include "tandem/model/synthetic.h"

namespace tandem::server {
namespace {

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Why?"}};

TEST(ChatTemplate, RecognizesFamiliesByTheirMarkers) {
  EXPECT_EQ(detect_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}"),
            ChatTemplate::ChatML);
  EXPECT_EQ(detect_chat_template("<|start_header_id|>' + role + '<|end_header_id|>"),
            ChatTemplate::Llama3);
  EXPECT_EQ(detect_chat_template("{{ bos_token + '[INST] ' + content + ' [/INST]' }}"),
            ChatTemplate::Llama2);
  EXPECT_EQ(detect_chat_template("<start_of_turn>user\n"), ChatTemplate::Gemma);
  EXPECT_EQ(detect_chat_template("<|user|>\n{{ c }}<|end|>\n<|assistant|>"), ChatTemplate::Phi3);
  EXPECT_EQ(detect_chat_template("<|user|>\n{{ c }}<|endoftext|>"), ChatTemplate::Zephyr);
  EXPECT_EQ(detect_chat_template(""), ChatTemplate::Plain);
  EXPECT_EQ(detect_chat_template("{{ messages }}"), ChatTemplate::Plain);
}

TEST(ChatTemplate, ReadFromTheGgufsTokenizerChatTemplate) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tandem_chat_template_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  SyntheticSpec spec = synthetic_preset("tiny");
  spec.threads = 1;
  gguf::Writer with = make_synthetic_writer(spec);
  with.set_string("tokenizer.chat_template",
                  "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n'}}{% endfor %}");
  with.write((dir / "chatml.gguf").string());
  make_synthetic_writer(spec).write((dir / "none.gguf").string());
  EXPECT_EQ(chat_template_of(gguf::File::open((dir / "chatml.gguf").string())),
            ChatTemplate::ChatML);
  EXPECT_EQ(chat_template_of(gguf::File::open((dir / "none.gguf").string())), ChatTemplate::Plain);
  std::filesystem::remove_all(dir);
}

TEST(ChatTemplate, RendersChatMLAndLlama3AsTheirModelsExpect) {
  EXPECT_EQ(apply_chat_template(ChatTemplate::ChatML, kChat),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(ChatTemplate::Llama3, {{"user", " Hi \n"}}),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(apply_chat_template(ChatTemplate::Llama2, kChat),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello.</s><s>[INST] Why? [/INST]");
  EXPECT_EQ(apply_chat_template(ChatTemplate::Gemma, {{"system", "S"}, {"user", "U"}}),
            "<start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplate, PlainFallbackPrefixesRoles) {
  EXPECT_EQ(apply_chat_template(ChatTemplate::Plain, kChat),
            "system: Be brief.\nuser: Hi\nassistant: Hello.\nuser: Why?\nassistant:");
}

TEST(StopMatcher, CutsAStopStringSplitOverPieces) {
  StopMatcher m({"END", "##"});
  std::string out = m.push("abc E");
  EXPECT_EQ(out, "abc ");  // "E" may begin "END": held back
  out += m.push("N");
  EXPECT_EQ(out, "abc ");
  out += m.push("Dxyz");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(out, "abc ");
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopMatcher, ReleasesHeldTextThatWasNotAStop) {
  StopMatcher m({"END"});
  std::string out = m.push("a EN");
  out += m.push("x");
  EXPECT_EQ(out, "a ENx");
  out += m.push("E");
  out += m.flush();
  EXPECT_EQ(out, "a ENxE");
  EXPECT_FALSE(m.matched());
  StopMatcher none;
  EXPECT_EQ(none.push("text"), "text");
}

TEST(Request, ReadsTheFieldsItKnowsAndIgnoresOthers) {
  const CompletionRequest r = parse_completion_request(
      R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,"stop":["x"],
          "stream":true,"seed":7,"user":"someone","suffix":null})",
      false);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "hi");
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream);
  const CompletionRequest ids = parse_completion_request(R"({"prompt":[1,2,3]})", false);
  EXPECT_EQ(ids.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  const CompletionRequest chat = parse_completion_request(
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},
          {"type":"text","text":"b"}]}],"max_completion_tokens":3})",
      true);
  ASSERT_EQ(chat.messages.size(), 1u);
  EXPECT_EQ(chat.messages[0].content, "ab");
  EXPECT_EQ(chat.max_tokens, 3);
  EXPECT_EQ(chat.top_logprobs, -1);  // not asked
  EXPECT_EQ(chat.n, 1);
}

TEST(Request, ReadsLogprobsAndChoices) {
  const CompletionRequest completion =
      parse_completion_request(R"({"prompt":"a","logprobs":0,"n":8})", false);
  EXPECT_EQ(completion.top_logprobs, 0);  // the chosen tokens' logprobs only
  EXPECT_EQ(completion.n, 8);
  const CompletionRequest chat = parse_completion_request(
      R"({"messages":[{"role":"user","content":"a"}],"logprobs":true,"top_logprobs":20})", true);
  EXPECT_EQ(chat.top_logprobs, 20);
  const CompletionRequest off = parse_completion_request(
      R"({"messages":[{"role":"user","content":"a"}],"logprobs":false})", true);
  EXPECT_EQ(off.top_logprobs, -1);
}

TEST(Request, NamesTheFieldAtFault) {
  auto param_of = [](const char* body, bool chat) {
    try {
      parse_completion_request(body, chat);
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status(), 400);
      return e.param();
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(param_of(R"({"prompt":"a","max_tokens":"5"})", false), "max_tokens");
  EXPECT_EQ(param_of(R"({"prompt":"a","temperature":3})", false), "temperature");
  EXPECT_EQ(param_of(R"({"prompt":"a","stop":[1]})", false), "stop");
  EXPECT_EQ(param_of(R"({"prompt":{}})", false), "prompt");
  EXPECT_EQ(param_of(R"({"messages":[{"role":"robot","content":"x"}]})", true), "messages[0].role");
  EXPECT_EQ(param_of(R"({"prompt":"a","max_tokens":99999999999})", false), "max_tokens");
  EXPECT_EQ(param_of("[1]", false), "");
  EXPECT_EQ(param_of(R"({"prompt":"a","n":9})", false), "n");
  // Positive, but 0 as the sampler's float (found by request_fuzz's range checks).
  EXPECT_EQ(param_of(R"({"prompt":"a","top_p":1e-50})", false), "top_p");
  EXPECT_EQ(param_of(R"({"prompt":"a","repeat_penalty":1e-50})", false), "repeat_penalty");
  EXPECT_EQ(param_of(R"({"prompt":"a","logprobs":6})", false), "logprobs");
  EXPECT_EQ(param_of(R"({"prompt":"a","logprobs":true})", false), "logprobs");
  EXPECT_EQ(param_of(R"({"messages":[{"role":"user","content":"a"}],"logprobs":3})", true),
            "logprobs");
  EXPECT_EQ(param_of(R"({"messages":[{"role":"user","content":"a"}],"top_logprobs":3})", true),
            "top_logprobs");
}

// The fuzzer's corpus (tests/fuzz/corpus/request; byte 0 picks chat, the rest is the body):
// every body parses or is refused with a 4xx RequestError, and parsed chat messages render.
TEST(Request, FuzzCorpusParsesOrFailsCleanly) {
  size_t files = 0, parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(TANDEM_REQUEST_FUZZ_DIR)) {
    std::ifstream f(entry.path(), std::ios::binary);
    std::stringstream text;
    text << f.rdbuf();
    const std::string input = text.str();
    if (input.empty()) continue;
    SCOPED_TRACE(entry.path().filename().string());
    ++files;
    const bool chat = input[0] & 1;
    try {
      const CompletionRequest r = parse_completion_request(std::string_view(input).substr(1), chat);
      ++parsed;
      EXPECT_TRUE(r.n >= 1 && r.n <= kMaxChoices);
      EXPECT_GT(r.sampling.top_p, 0.0f);
      EXPECT_GT(r.sampling.repeat_penalty, 0.0f);
      if (chat) {
        EXPECT_FALSE(apply_chat_template(ChatTemplate::Llama3, r.messages).empty());
      }
    } catch (const RequestError& e) {
      EXPECT_GE(e.status(), 400);
      EXPECT_LT(e.status(), 500);
    }
  }
  EXPECT_GT(files, 0u);
  EXPECT_GT(parsed, 0u) << "the corpus should hold valid requests too";
}

TEST(Request, ErrorBodyHasOpenAIsShape) {
  const auto j = nlohmann::json::parse(error_body(400, "bad", "prompt", "x"));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "prompt");
  EXPECT_EQ(j["error"]["code"], "x");
  EXPECT_TRUE(nlohmann::json::parse(error_body(404, "no"))["error"]["param"].is_null());
}

}  // namespace
}  // namespace tandem::server

// Chat messages to a prompt: the model's own template when the GGUF's tokenizer.chat_template is
// one of the known families (recognized by its marker tokens, as llama.cpp does), else a plain
// role-prefixed text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tandem/model/gguf.h"

namespace tandem::server {

enum class ChatTemplate { Plain, ChatML, Llama2, Llama3, Gemma, Phi3, Zephyr };

std::string_view chat_template_name(ChatTemplate t);

struct ChatMessage {
  std::string role;  // system, user, assistant (others are passed through by name)
  std::string content;
};

// The family of a Jinja template text; Plain when empty or unknown.
ChatTemplate detect_chat_template(std::string_view jinja);
// The family of the file's tokenizer.chat_template.
ChatTemplate chat_template_of(const gguf::File& file);

// The prompt text for `messages`, ending where the assistant's reply starts. Carries special
// tokens as text ("<|im_start|>"): encode it with parse_special.
std::string apply_chat_template(ChatTemplate t, const std::vector<ChatMessage>& messages);

}  // namespace tandem::server

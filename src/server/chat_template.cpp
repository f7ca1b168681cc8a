#include "chat_template.h"

namespace tandem::server {

namespace {

bool has(std::string_view text, std::string_view marker) {
  return text.find(marker) != std::string_view::npos;
}

// Leading and trailing whitespace removed, as Llama 3's template does with | trim.
std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

std::string llama2(const std::vector<ChatMessage>& messages) {
  std::string out, system;
  bool first_turn = true;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      system = m.content;
    } else if (m.role == "assistant") {
      out += m.content + "</s>";
    } else {
      // The BOS of the first turn comes from the tokenizer; later turns carry their own.
      out += first_turn ? "[INST] " : "<s>[INST] ";
      if (!system.empty()) out += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
      system.clear();
      out += m.content + " [/INST]";
      first_turn = false;
    }
  }
  return out;
}

std::string gemma(const std::vector<ChatMessage>& messages) {
  // Gemma has no system role: the system text opens the next user turn.
  std::string out, system;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      system += m.content + "\n\n";
      continue;
    }
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out += "<start_of_turn>" + role + "\n" + (role == "user" ? system : "") + trim(m.content) +
           "<end_of_turn>\n";
    if (role == "user") system.clear();
  }
  return out + "<start_of_turn>model\n";
}

}  // namespace

std::string_view chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::Plain:
      return "plain";
    case ChatTemplate::ChatML:
      return "chatml";
    case ChatTemplate::Llama2:
      return "llama2";
    case ChatTemplate::Llama3:
      return "llama3";
    case ChatTemplate::Gemma:
      return "gemma";
    case ChatTemplate::Phi3:
      return "phi3";
    case ChatTemplate::Zephyr:
      return "zephyr";
  }
  return "plain";
}

ChatTemplate detect_chat_template(std::string_view jinja) {
  if (has(jinja, "<|im_start|>")) return ChatTemplate::ChatML;
  if (has(jinja, "<|start_header_id|>") && has(jinja, "<|end_header_id|>"))
    return ChatTemplate::Llama3;
  if (has(jinja, "[INST]")) return ChatTemplate::Llama2;
  if (has(jinja, "<start_of_turn>")) return ChatTemplate::Gemma;
  if (has(jinja, "<|assistant|>") && has(jinja, "<|end|>")) return ChatTemplate::Phi3;
  if (has(jinja, "<|user|>") && has(jinja, "<|endoftext|>")) return ChatTemplate::Zephyr;
  return ChatTemplate::Plain;
}

ChatTemplate chat_template_of(const gguf::File& file) {
  const gguf::Value* v = file.find("tokenizer.chat_template");
  if (!v || v->type != gguf::ValueType::String) return ChatTemplate::Plain;
  return detect_chat_template(v->str);
}

std::string apply_chat_template(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  std::string out;
  switch (t) {
    case ChatTemplate::ChatML:
      for (const ChatMessage& m : messages)
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      return out + "<|im_start|>assistant\n";
    case ChatTemplate::Llama3:
      for (const ChatMessage& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) +
               "<|eot_id|>";
      }
      return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatTemplate::Llama2:
      return llama2(messages);
    case ChatTemplate::Gemma:
      return gemma(messages);
    case ChatTemplate::Phi3:
      for (const ChatMessage& m : messages) out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
      return out + "<|assistant|>\n";
    case ChatTemplate::Zephyr:
      for (const ChatMessage& m : messages)
        out += "<|" + m.role + "|>\n" + m.content + "<|endoftext|>\n";
      return out + "<|assistant|>\n";
    case ChatTemplate::Plain:
      break;
  }
  for (const ChatMessage& m : messages) out += m.role + ": " + m.content + "\n";
  return out + "assistant:";
}

}  // namespace tandem::server

#include "tandem/error.h"

namespace tandem {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return "InvalidArgument";
    case ErrorCode::Unsupported:
      return "Unsupported";
    case ErrorCode::OutOfMemory:
      return "OutOfMemory";
    case ErrorCode::DeviceLost:
      return "DeviceLost";
    case ErrorCode::Io:
      return "Io";
    case ErrorCode::Format:
      return "Format";
    case ErrorCode::Internal:
      return "Internal";
  }
  return "Unknown";
}

Error::Error(ErrorCode code, std::string where, std::string message)
    : std::runtime_error("[" + where + "] " + message),
      code_(code),
      where_(std::move(where)),
      message_(std::move(message)) {}

void throw_error(ErrorCode code, std::string where, std::string message) {
  throw Error(code, std::move(where), std::move(message));
}

}  // namespace tandem

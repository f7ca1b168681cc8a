// One error type for all of Tandem: a code and a message "[where] what (values)".
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace tandem {

enum class ErrorCode {
  InvalidArgument,
  Unsupported,
  OutOfMemory,
  DeviceLost,
  Io,
  Format,
  Internal
};

std::string_view error_code_name(ErrorCode code);

// Thrown by every layer. what() reads "[where] message"; code() lets callers recover
// (the scheduler reacts to OutOfMemory and DeviceLost).
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string where, std::string message);

  ErrorCode code() const { return code_; }
  const std::string& where() const { return where_; }
  const std::string& message() const { return message_; }
  // The backend whose failure this reports, where the caller of the backend knows it (the
  // executor tags out-of-memory and device errors); empty otherwise.
  const std::string& backend() const { return backend_; }
  void set_backend(std::string backend_id) { backend_ = std::move(backend_id); }

 private:
  ErrorCode code_;
  std::string where_;
  std::string message_;
  std::string backend_;
};

[[noreturn]] void throw_error(ErrorCode code, std::string where, std::string message);

// Checks a condition that bad input can break; throws InvalidArgument with context.
#define TANDEM_CHECK_ARG(cond, where, message)                                                \
  do {                                                                                        \
    if (!(cond)) ::tandem::throw_error(::tandem::ErrorCode::InvalidArgument, where, message); \
  } while (0)

}  // namespace tandem

// Errors. Two kinds (docs/design.md, "Errors"):
//  - ConfigError: something a user caused (a flag, a config, a file, a shape). The message names the flag or
//    file, the value and the rule; the CLI prints it as one line and exits with code 2.
//  - AMPIPE_CHECK: an internal invariant. Stays on in Release; aborts with file:line and the values.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ampipe {

class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& what) : std::runtime_error(what) {}
};

// A failure of the distributed runtime (timeout, desynchronised collectives, a dead peer).
class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& what) : std::runtime_error(what) {}
};

// This rank stopped because another rank left the job (it failed, or it exited while this rank still waited for
// it): the message names that rank. The exit agreement (comm::Runtime::finish) decides which rank's line is printed
// and the exit code every rank returns.
class PeerStopped : public CommError {
 public:
  explicit PeerStopped(const std::string& what) : CommError(what) {}
};

// Training reached numbers that are not finite (a NaN or infinite loss or gradient norm): every rank detects it on
// the same all-reduced values, so every rank stops at the same iteration.
class NumericError : public std::runtime_error {
 public:
  explicit NumericError(const std::string& what) : std::runtime_error(what) {}
};

namespace core {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace core

}  // namespace ampipe

#define AMPIPE_CHECK(cond, ...)                                                                    \
  do {                                                                                             \
    if (!(cond)) [[unlikely]]                                                                      \
      ::ampipe::core::check_failed(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__));         \
  } while (0)

#pragma once
// What the test process writes on stderr, captured: troupe's loggers write there (engine/log.hpp),
// so a test reads what a node logged, or waits until it has logged something.

#include <cstdio>
#include <string>
#include <unistd.h>

namespace troupe::testing {

/// What the process writes on stderr (the loggers' lines) while it lives, for a test to read.
class stderr_capture {
public:
  stderr_capture() : file_(std::tmpfile()) {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    ::dup2(::fileno(file_), STDERR_FILENO);
  }
  stderr_capture(const stderr_capture&) = delete;
  stderr_capture& operator=(const stderr_capture&) = delete;
  ~stderr_capture() {
    restore();
    std::fclose(file_);
  }
  /// Everything written so far (stderr stays captured).
  std::string text() const {
    std::fflush(stderr);
    std::string all;
    char chunk[4096];
    std::size_t n = 0;
    std::FILE* in = std::fopen(("/proc/self/fd/" + std::to_string(::fileno(file_))).c_str(), "r");
    if (in == nullptr)
      return all;
    while ((n = std::fread(chunk, 1, sizeof chunk, in)) > 0)
      all.append(chunk, n);
    std::fclose(in);
    return all;
  }
  void restore() {
    if (saved_ < 0)
      return;
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }

private:
  std::FILE* file_;
  int saved_ = -1;
};

} // namespace troupe::testing

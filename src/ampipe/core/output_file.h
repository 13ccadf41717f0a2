// Opening a file the user named for writing (--trace, --json, ...) without ever blocking: open(2) of a FIFO that no
// process reads blocks until one does, and with SA_RESTART handlers (train's SIGTERM / SIGINT) not even a signal
// ends that wait. open_output opens with O_NONBLOCK (a FIFO without a reader is refused at once, ENXIO), then writes
// blocking as usual; a pipe with a reader (`--trace >(gzip > t.gz)`) works.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

namespace ampipe::core {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using OutputFile = std::unique_ptr<std::FILE, FileCloser>;

// Creates or truncates `path` for writing. Throws ConfigError "<what> <path>: cannot be written: <why>" (a FIFO
// without a reader: "it is a FIFO that no process reads").
OutputFile open_output(const std::string& path, const std::string& what, bool binary = false);

// Writes `bytes` and closes; throws ConfigError "<what> <path>: write failed: <why>".
void write_output(OutputFile f, const std::string& bytes, const std::string& path, const std::string& what);

}  // namespace ampipe::core

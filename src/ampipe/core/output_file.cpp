#include "ampipe/core/output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ampipe/core/error.h"

namespace ampipe::core {

OutputFile open_output(const std::string& path, const std::string& what, bool binary) {
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    throw ConfigError(fmt::format("{} {}: cannot be written: {}", what, path,
                                  err == ENXIO ? std::string("it is a FIFO that no process reads (opening it would "
                                                             "wait for a reader)")
                                               : std::string(std::strerror(err))));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);  // the writes block as usual
  std::FILE* f = ::fdopen(fd, binary ? "wb" : "w");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    throw ConfigError(fmt::format("{} {}: cannot be written: {}", what, path, std::strerror(err)));
  }
  return OutputFile(f);
}

void write_output(OutputFile f, const std::string& bytes, const std::string& path, const std::string& what) {
  const bool wrote = std::fwrite(bytes.data(), 1, bytes.size(), f.get()) == bytes.size();
  const int err = errno;
  const bool closed = std::fclose(f.release()) == 0;
  if (!wrote || !closed)
    throw ConfigError(fmt::format("{} {}: write failed: {}", what, path, std::strerror(wrote ? errno : err)));
}

}  // namespace ampipe::core

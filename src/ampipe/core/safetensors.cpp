#include "ampipe/core/safetensors.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ampipe::core {

namespace {
// Removes `<path>.tmp.<pid>` files that an earlier, killed write of this path left behind (only names this function
// itself makes, and only when that process is gone), so interrupted saves do not pile up optimizer-sized files.
void remove_stale_temps(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string pid_text = name.substr(prefix.size());
    if (pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9) continue;
    const pid_t pid = pid_t(std::stol(pid_text));
    if (pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno == EPERM) continue;  // that writer is still alive
    std::error_code rm;
    fs::remove(e.path(), rm);
  }
}
}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  remove_stale_temps(path);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw ConfigError(fmt::format("{}: cannot write file: {}", path, std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw ConfigError(fmt::format("{}: write failed: {}", path, std::strerror(err)));
    }
    done += size_t(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw ConfigError(fmt::format("{}: fsync failed: {}", path, std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw ConfigError(fmt::format("{}: rename failed: {}", path, std::strerror(err)));
  }
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const size_t bytes = t.nbytes();
    header[name] = {{"dtype", t.dtype() == DType::f32 ? "F32" : "BF16"},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // align the data to 8 bytes, as the reference writer does
  std::string out;
  out.reserve(8 + h.size() + offset);
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
  out += h;
  for (const auto& [name, t] : tensors) {
    const Tensor c = t.is_contiguous() ? t : t.clone();
    out.append(static_cast<const char*>(c.raw()), c.nbytes());
  }
  write_file_atomic(path, out);
}

TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string buf = ss.str();
  if (buf.size() < 8) throw ConfigError(fmt::format("{}: not a safetensors file: shorter than 8 bytes", path));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(buf[size_t(i)])) << (8 * i);
  if (n > buf.size() - 8)
    throw ConfigError(fmt::format("{}: truncated safetensors file: header length {} exceeds file size {}", path, n,
                                  buf.size()));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(buf.substr(8, n));
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("{}: bad safetensors header: {}", path, e.what()));
  }
  const size_t data_begin = 8 + n, data_size = buf.size() - data_begin;
  TensorMap out;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (metadata) *metadata = v.get<std::map<std::string, std::string>>();
      continue;
    }
    try {
      const std::string dt = v.at("dtype").get<std::string>();
      if (dt != "F32" && dt != "BF16")
        throw ConfigError(fmt::format("{}: tensor '{}' has dtype {}; only F32 and BF16 are supported", path, name,
                                      dt));
      const Shape shape = v.at("shape").get<Shape>();
      const auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
      Tensor t = Tensor::empty(shape, dt == "F32" ? DType::f32 : DType::bf16);
      if (off.size() != 2 || off[0] > off[1] || off[1] > data_size || off[1] - off[0] != t.nbytes())
        throw ConfigError(fmt::format("{}: tensor '{}' {}: data offsets do not match its shape or the file size",
                                      path, name, shape_str(shape)));
      std::memcpy(t.raw(), buf.data() + data_begin + off[0], t.nbytes());
      out.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("{}: bad entry for tensor '{}': {}", path, name, e.what()));
    }
  }
  return out;
}

}  // namespace ampipe::core

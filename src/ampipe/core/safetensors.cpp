#include "ampipe/core/safetensors.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "ampipe/core/json.h"
#include "ampipe/core/checksum.h"

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

SafetensorsInfo save_safetensors(const std::string& path, const TensorMap& tensors,
                                 const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::map<std::string, std::string> meta = metadata;
  std::vector<Tensor> data;  // contiguous, in name order
  data.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    data.push_back(t.is_contiguous() ? t : t.clone());
    const Tensor& c = data.back();
    meta[kChecksumKeyPrefix + name] = checksum_string(xxh64(c.raw(), c.nbytes()));
  }
  if (!meta.empty()) header["__metadata__"] = meta;
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
  for (const Tensor& c : data) out.append(static_cast<const char*>(c.raw()), c.nbytes());
  write_file_atomic(path, out);
  return {uint64_t(out.size()), checksum_string(xxh64(h.data(), h.size())), checksum_string(xxh64(out.data(), out.size()))};
}

TensorMap load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  return load_safetensors(path, SafetensorsLoadOptions{}, metadata, nullptr);
}

namespace {

// A regular file open for reading (ConfigError "PATH: cannot open: ..." or "PATH: not a regular file"), closed when
// it goes.
class ReadFile {
 public:
  explicit ReadFile(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY)) {
    if (fd_ < 0) throw ConfigError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw ConfigError(fmt::format("{}: not a regular file", path));
    }
    size_ = uint64_t(st.st_size);
  }
  ~ReadFile() { ::close(fd_); }
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  uint64_t size() const { return size_; }  // when opened
  // Reads `bytes` into dst (an interrupted read is retried) and returns how many it read: fewer when the file ended
  // first or a read failed, and then *err is that read's errno (0 when the file ended).
  size_t read(char* dst, size_t bytes, int* err) {
    size_t done = 0;
    *err = 0;
    while (done < bytes) {
      const ssize_t r = ::read(fd_, dst + done, bytes - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        if (r < 0) *err = errno;
        break;
      }
      done += size_t(r);
    }
    return done;
  }

 private:
  int fd_;
  uint64_t size_ = 0;
};

// The whole file, read once into memory (its size taken first: a file that is not regular is refused).
std::string read_whole_file(const std::string& path) {
  ReadFile f(path);
  std::string buf(size_t(f.size()), '\0');
  int err = 0;
  const size_t done = f.read(buf.data(), buf.size(), &err);
  if (done < buf.size())
    throw ConfigError(fmt::format("{}: read failed after {} of {} bytes{}{}", path, done, buf.size(),
                                  err ? ": " : " (the file shrank)", err ? std::strerror(err) : ""));
  return buf;
}

}  // namespace

nlohmann::json read_safetensors_header(const std::string& path) {
  std::string h;
  {
    ReadFile f(path);
    unsigned char len[8];
    const uint64_t size = f.size();
    int err = 0;
    if (size < 8 || f.read(reinterpret_cast<char*>(len), 8, &err) != 8)
      throw ConfigError(fmt::format("{}: not a safetensors file: shorter than 8 bytes", path));
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
    if (n > size - 8)
      throw ConfigError(fmt::format("{}: truncated safetensors file: header length {} exceeds file size {}", path, n,
                                    size));
    h.assign(size_t(n), '\0');
    if (f.read(h.data(), h.size(), &err) != h.size())
      throw ConfigError(fmt::format("{}: the header cannot be read (the file shrank)", path));
  }  // closed before the header is parsed
  nlohmann::json header;
  try {
    header = parse_json(h);
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("{}: bad safetensors header: {}", path, e.what()));
  }
  if (!header.is_object()) throw ConfigError(fmt::format("{}: bad safetensors header: not a JSON object", path));
  return header;
}

namespace {

struct Section {
  uint64_t begin, end;
  std::string name;
};

}  // namespace

TensorMap load_safetensors(const std::string& path, const SafetensorsLoadOptions& opts,
                           std::map<std::string, std::string>* metadata, SafetensorsInfo* info) {
  const std::string buf = read_whole_file(path);
  if (buf.size() < 8) throw ConfigError(fmt::format("{}: not a safetensors file: shorter than 8 bytes", path));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(buf[size_t(i)])) << (8 * i);
  if (n > buf.size() - 8)
    throw ConfigError(fmt::format("{}: truncated safetensors file: header length {} exceeds file size {}", path, n,
                                  buf.size()));
  nlohmann::json header;
  try {
    header = parse_json(std::string_view(buf.data() + 8, size_t(n)));
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("{}: bad safetensors header: {}", path, e.what()));
  }
  if (!header.is_object())
    throw ConfigError(fmt::format("{}: bad safetensors header: not a JSON object", path));
  if (info)
    *info = {uint64_t(buf.size()), checksum_string(xxh64(buf.data() + 8, size_t(n))),
             checksum_string(xxh64(buf.data(), buf.size()))};
  std::map<std::string, std::string> meta, checksums;
  if (header.contains("__metadata__")) {
    try {
      for (const auto& [k, v] : header["__metadata__"].get<std::map<std::string, std::string>>()) {
        if (k.rfind(kChecksumKeyPrefix, 0) == 0)
          checksums[k.substr(std::char_traits<char>::length(kChecksumKeyPrefix))] = v;
        else
          meta[k] = v;
      }
    } catch (const nlohmann::json::exception&) {
      throw ConfigError(fmt::format("{}: bad safetensors header: __metadata__ is not an object of strings", path));
    }
  }
  const size_t data_begin = 8 + n;
  const uint64_t data_size = buf.size() - data_begin;
  TensorMap out;
  std::vector<Section> sections;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    Shape shape;
    std::vector<uint64_t> off;
    DType dtype = DType::f32;
    try {
      const std::string dt = v.at("dtype").get<std::string>();
      if (dt != "F32" && dt != "BF16")
        throw ConfigError(fmt::format("{}: tensor '{}' has dtype {}; only F32 and BF16 are supported", path, name,
                                      dt));
      dtype = dt == "F32" ? DType::f32 : DType::bf16;
      shape = v.at("shape").get<Shape>();
      off = v.at("data_offsets").get<std::vector<uint64_t>>();
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("{}: bad entry for tensor '{}': {}", path, name, e.what()));
    }
    // The byte size of the shape, without overflow: every dimension >= 0 and the product no larger than the file.
    uint64_t bytes = dtype_size(dtype);
    for (int64_t d : shape) {
      if (d < 0)
        throw ConfigError(fmt::format("{}: tensor '{}' has shape {}: a dimension is negative", path, name,
                                      shape_str(shape)));
      if (d != 0 && bytes > data_size / uint64_t(d))
        throw ConfigError(fmt::format("{}: tensor '{}' has shape {}: more data than the file holds ({} bytes)", path,
                                      name, shape_str(shape), data_size));
      bytes *= uint64_t(d);
    }
    if (off.size() != 2 || off[0] > off[1] || off[1] > data_size || off[1] - off[0] != bytes)
      throw ConfigError(fmt::format("{}: tensor '{}' {}: data offsets {} do not match its shape ({} bytes) or lie "
                                    "outside the data ({} bytes)",
                                    path, name, shape_str(shape), nlohmann::json(off).dump(), bytes, data_size));
    const char* src = buf.data() + data_begin + off[0];
    if (auto it = checksums.find(name); it != checksums.end()) {
      const std::string got = checksum_string(xxh64(src, size_t(bytes)));
      if (got != it->second)
        throw ConfigError(fmt::format("{}: tensor '{}': the data does not match its checksum (recorded {}, the data "
                                      "has {}): the file is corrupt",
                                      path, name, it->second, got));
      checksums.erase(it);
    } else if (opts.require_checksums) {
      throw ConfigError(fmt::format("{}: tensor '{}' has no recorded checksum, so its data cannot be verified (not "
                                    "written by ampipe, or the header was edited)",
                                    path, name));
    }
    if (bytes > 0) sections.push_back({off[0], off[1], name});
    Tensor t = Tensor::empty(shape, dtype);
    std::memcpy(t.raw(), src, size_t(bytes));
    out.emplace(name, std::move(t));
  }
  if (!checksums.empty())
    throw ConfigError(fmt::format("{}: the header records a checksum of tensor '{}', which the file does not hold "
                                  "(a tensor was removed)",
                                  path, checksums.begin()->first));
  std::sort(sections.begin(), sections.end(),
            [](const Section& a, const Section& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  for (size_t i = 1; i < sections.size(); ++i)
    if (sections[i].begin < sections[i - 1].end)
      throw ConfigError(fmt::format("{}: the data of tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", path,
                                    sections[i - 1].name, sections[i - 1].begin, sections[i - 1].end,
                                    sections[i].name, sections[i].begin, sections[i].end));
  if (metadata) *metadata = std::move(meta);
  return out;
}

}  // namespace ampipe::core

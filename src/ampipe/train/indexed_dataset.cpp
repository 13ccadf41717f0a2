#include "ampipe/train/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "ampipe/core/checksum.h"
#include "ampipe/core/error.h"

namespace ampipe::train {

static_assert(std::endian::native == std::endian::little, "the indexed dataset is little-endian, as is this host");

bool valid_token_dtype(uint8_t code) { return code >= 1 && code <= 8; }

int64_t token_dtype_bytes(TokenDType d) {
  switch (d) {
    case TokenDType::uint8:
    case TokenDType::int8:
      return 1;
    case TokenDType::int16:
    case TokenDType::uint16:
      return 2;
    case TokenDType::int32:
    case TokenDType::float32:
      return 4;
    case TokenDType::int64:
    case TokenDType::float64:
      return 8;
  }
  return 0;
}

const char* token_dtype_name(TokenDType d) {
  switch (d) {
    case TokenDType::uint8:
      return "uint8";
    case TokenDType::int8:
      return "int8";
    case TokenDType::int16:
      return "int16";
    case TokenDType::int32:
      return "int32";
    case TokenDType::int64:
      return "int64";
    case TokenDType::float64:
      return "float64";
    case TokenDType::float32:
      return "float32";
    case TokenDType::uint16:
      return "uint16";
  }
  return "?";
}

TokenDType optimal_token_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::uint16 : TokenDType::int32;
}

namespace {

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Token i of a .bin of dtype d, widened (float dtypes as they are).
double token_value(const unsigned char* p, TokenDType d) {
  switch (d) {
    case TokenDType::uint8:
      return double(p[0]);
    case TokenDType::int8:
      return double(int8_t(p[0]));
    case TokenDType::int16:
      return double(load<int16_t>(p));
    case TokenDType::uint16:
      return double(load<uint16_t>(p));
    case TokenDType::int32:
      return double(load<int32_t>(p));
    case TokenDType::int64:
      return double(load<int64_t>(p));
    case TokenDType::float32:
      return double(load<float>(p));
    case TokenDType::float64:
      return load<double>(p);
  }
  return -1;
}

// The largest id of tokens [0, count) of `p`, or the offset of the first that is no token id (negative, not an
// integer, above INT32_MAX): {max, -1} or {-1, offset}.
template <typename T>
std::pair<int64_t, int64_t> scan_ids(const unsigned char* p, int64_t count) {
  int64_t mx = -1;
  for (int64_t i = 0; i < count; ++i) {
    const T v = load<T>(p + size_t(i) * sizeof(T));
    if constexpr (std::is_floating_point_v<T>) {
      if (!(double(v) >= 0 && double(v) <= 2147483647.0) || v != std::floor(v)) return {-1, i};
    } else if constexpr (std::is_signed_v<T>) {
      if (v < 0 || int64_t(v) > std::numeric_limits<int32_t>::max()) return {-1, i};
    }
    if (int64_t(v) > mx) mx = int64_t(v);
  }
  return {mx, -1};
}

std::pair<int64_t, int64_t> scan_all(const unsigned char* p, int64_t count, TokenDType d) {
  switch (d) {
    case TokenDType::uint8:
      return scan_ids<uint8_t>(p, count);
    case TokenDType::int8:
      return scan_ids<int8_t>(p, count);
    case TokenDType::int16:
      return scan_ids<int16_t>(p, count);
    case TokenDType::uint16:
      return scan_ids<uint16_t>(p, count);
    case TokenDType::int32:
      return scan_ids<int32_t>(p, count);
    case TokenDType::int64:
      return scan_ids<int64_t>(p, count);
    case TokenDType::float32:
      return scan_ids<float>(p, count);
    case TokenDType::float64:
      return scan_ids<double>(p, count);
  }
  return {-1, 0};
}

template <typename T>
void widen(const unsigned char* p, std::span<int32_t> out) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = int32_t(load<T>(p + i * sizeof(T)));
}

// Whether id fits dtype d exactly (the writer's check).
bool fits(int64_t id, TokenDType d) {
  switch (d) {
    case TokenDType::uint8:
      return id >= 0 && id <= 255;
    case TokenDType::int8:
      return id >= -128 && id <= 127;
    case TokenDType::int16:
      return id >= -32768 && id <= 32767;
    case TokenDType::uint16:
      return id >= 0 && id <= 65535;
    case TokenDType::int32:
    case TokenDType::int64:
    case TokenDType::float64:
      return true;
    case TokenDType::float32:
      return id >= -(int64_t(1) << 24) && id <= (int64_t(1) << 24);
  }
  return false;
}

void put_token(unsigned char* p, int32_t id, TokenDType d) {
  switch (d) {
    case TokenDType::uint8:
    case TokenDType::int8:
      p[0] = uint8_t(id);
      return;
    case TokenDType::int16:
    case TokenDType::uint16: {
      const uint16_t v = uint16_t(id);
      std::memcpy(p, &v, 2);
      return;
    }
    case TokenDType::int32:
      std::memcpy(p, &id, 4);
      return;
    case TokenDType::int64: {
      const int64_t v = id;
      std::memcpy(p, &v, 8);
      return;
    }
    case TokenDType::float32: {
      const float v = float(id);
      std::memcpy(p, &v, 4);
      return;
    }
    case TokenDType::float64: {
      const double v = id;
      std::memcpy(p, &v, 8);
      return;
    }
  }
}

}  // namespace

IndexedDataset::Map::~Map() {
  if (base != nullptr) ::munmap(base, size_t(bytes));
}

void IndexedDataset::map_file(const std::string& path, Map& m) const {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw ConfigError(fmt::format("{} {}: {} does not exist (a Megatron indexed dataset is the pair PREFIX.bin and "
                                  "PREFIX.idx)",
                                  flag_, prefix_, path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = fd < 0 ? std::strerror(errno) : "not a regular file";
    if (fd >= 0) ::close(fd);
    throw ConfigError(fmt::format("{} {}: {} cannot be read ({})", flag_, prefix_, path, why));
  }
  const int64_t bytes = int64_t(st.st_size);
  void* base = bytes > 0 ? ::mmap(nullptr, size_t(bytes), PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  const std::string why = base == MAP_FAILED ? std::strerror(errno) : "";
  ::close(fd);
  if (base == MAP_FAILED)
    throw ConfigError(fmt::format("{} {}: {} cannot be memory-mapped ({})", flag_, prefix_, path, why));
  m.base = base;
  m.bytes = bytes;
  m.data = static_cast<const unsigned char*>(base);
}

IndexedDataset::IndexedDataset(const std::string& prefix, const std::string& flag) : prefix_(prefix), flag_(flag) {
  // On an error the members unmap what was mapped.
  map_file(prefix + ".idx", idx_);
  map_file(prefix + ".bin", bin_);
  check_index(prefix + ".idx");
  scan_tokens(prefix + ".bin");
}

IndexedDataset::~IndexedDataset() = default;

void IndexedDataset::check_index(const std::string& idx_path) {
  const unsigned char* p = idx_.data;
  auto fail = [&](const std::string& rule) {
    throw ConfigError(fmt::format("{} {}: {}: {}", flag_, prefix_, idx_path, rule));
  };
  if (idx_.bytes < kIndexHeaderBytes)
    fail(fmt::format("truncated: {} bytes, shorter than the index header's {}", idx_.bytes, kIndexHeaderBytes));
  if (std::memcmp(p, kIndexMagic, sizeof(kIndexMagic)) != 0)
    fail("bad magic: not a Megatron index file (its first 9 bytes are not MMIDIDX\\x00\\x00)");
  const uint64_t version = load<uint64_t>(p + 9);
  if (version != 1) fail(fmt::format("index version {} is not supported (Megatron writes version 1)", version));
  const uint8_t code = p[17];
  if (!valid_token_dtype(code))
    fail(fmt::format("dtype code {} is not one of Megatron's 1..8 (uint8, int8, int16, int32, int64, float64, "
                     "float32, uint16)",
                     code));
  dtype_ = TokenDType(code);
  item_ = token_dtype_bytes(dtype_);
  const uint64_t n = load<uint64_t>(p + 18), m = load<uint64_t>(p + 26);
  const uint64_t room = uint64_t(idx_.bytes);
  const uint64_t need = n > room || m > room ? UINT64_MAX : uint64_t(kIndexHeaderBytes) + 12 * n + 8 * m;
  if (need != room && (need == UINT64_MAX || need + n != room))
    fail(fmt::format("{} bytes, but the header's {} sequences and {} document-index entries need {} (or {} with "
                     "sequence modes): the file is truncated or its header is corrupt",
                     idx_.bytes, n, m, need == UINT64_MAX ? std::string("more") : std::to_string(need),
                     need == UINT64_MAX ? std::string("more") : std::to_string(need + n)));
  if (m < 1) fail("the document index has no entry (Megatron's starts with 0)");
  n_ = int64_t(n);
  m_ = int64_t(m);
  // The document index: 0, non-decreasing, ending at n.
  for (int64_t k = 0; k < m_; ++k) {
    const int64_t d = document_index(k), prev = k > 0 ? document_index(k - 1) : 0;
    if ((k == 0 && d != 0) || d < prev || d > n_)
      fail(fmt::format("document index entry {} is {}: the entries must start at 0 and never decrease, up to the {} "
                       "sequences",
                       k, d, n_));
  }
  if (document_index(m_ - 1) != n_)
    fail(fmt::format("the document index ends at {}, not at the sequence count {}", document_index(m_ - 1), n_));
  // The sequences, one after the other, filling the .bin exactly.
  __int128 total = 0;
  for (int64_t i = 0; i < n_; ++i) {
    if (sequence_length(i) < 0) fail(fmt::format("sequence {} has the negative length {}", i, sequence_length(i)));
    total += sequence_length(i);
  }
  const __int128 bin_need = total * item_;
  if (bin_need > bin_.bytes)
    throw ConfigError(fmt::format("{} {}: {}.bin: truncated: {} bytes, but the index's {} sequences hold {} {} "
                                  "tokens ({} bytes)",
                                  flag_, prefix_, prefix_, bin_.bytes, n_, int64_t(total), token_dtype_name(dtype_),
                                  int64_t(bin_need)));
  if (bin_need < bin_.bytes)
    throw ConfigError(fmt::format("{} {}: {}.bin: {} bytes, more than the index's {} sequences of {} {} tokens ({} "
                                  "bytes): the .bin and the .idx do not belong together",
                                  flag_, prefix_, prefix_, bin_.bytes, n_, int64_t(total), token_dtype_name(dtype_),
                                  int64_t(bin_need)));
  tokens_ = int64_t(total);
  const unsigned char* ptrs = p + kIndexHeaderBytes + 4 * n_;
  int64_t expected = 0;
  for (int64_t i = 0; i < n_; ++i) {
    const int64_t ptr = load<int64_t>(ptrs + 8 * i), end = ptr + int64_t(sequence_length(i)) * item_;
    if (ptr < 0 || ptr > bin_.bytes || end > bin_.bytes)
      fail(fmt::format("sequence {}'s pointer {} with {} tokens reaches byte {}, beyond the {} bytes of {}.bin", i,
                       ptr, sequence_length(i), end, bin_.bytes, prefix_));
    if (ptr != expected)
      fail(fmt::format("sequence {}'s pointer is {}, but the sequences before it end at byte {}: this engine reads "
                       "the .bin as Megatron's writer lays it out, the sequences one after the other",
                       i, ptr, expected));
    expected = end;
  }
}

void IndexedDataset::scan_tokens(const std::string& bin_path) {
  const auto [mx, bad] = scan_all(bin_.data, tokens_, dtype_);
  if (bad >= 0)
    throw ConfigError(fmt::format("{} {}: {}: token {} is {}, not a token id (ids are integers in [0, {}])", flag_,
                                  prefix_, bin_path, bad, token_value(bin_.data + bad * item_, dtype_),
                                  std::numeric_limits<int32_t>::max()));
  max_token_ = int32_t(mx);
  checksum_ = core::xxh64(bin_.data, size_t(bin_.bytes), core::xxh64(idx_.data, size_t(idx_.bytes)));
  // The pages read above go back to the kernel: they are read again (from the page cache) only where training
  // reads its windows and the splits their boundaries.
  for (Map* m : {&idx_, &bin_})
    if (m->base != nullptr) ::madvise(m->base, size_t(m->bytes), MADV_DONTNEED);
}

int32_t IndexedDataset::sequence_length(int64_t i) const {
  AMPIPE_CHECK(i >= 0 && i < n_, "sequence {} of {}", i, n_);
  return load<int32_t>(idx_.data + kIndexHeaderBytes + 4 * i);
}

int64_t IndexedDataset::sequence_start(int64_t i) const {
  AMPIPE_CHECK(i >= 0 && i <= n_, "sequence {} of {}", i, n_);
  if (i == n_) return tokens_;
  return load<int64_t>(idx_.data + kIndexHeaderBytes + 4 * n_ + 8 * i) / item_;
}

int64_t IndexedDataset::document_index(int64_t k) const {
  AMPIPE_CHECK(k >= 0 && k < m_, "document index entry {} of {}", k, m_);
  return load<int64_t>(idx_.data + kIndexHeaderBytes + 12 * n_ + 8 * k);
}

void IndexedDataset::read(int64_t first, std::span<int32_t> out) const {
  AMPIPE_CHECK(first >= 0 && first + int64_t(out.size()) <= tokens_, "tokens [{}, {}) of {}", first,
               first + int64_t(out.size()), tokens_);
  const unsigned char* p = bin_.data + first * item_;
  switch (dtype_) {
    case TokenDType::uint8:
      return widen<uint8_t>(p, out);
    case TokenDType::int8:
      return widen<int8_t>(p, out);
    case TokenDType::int16:
      return widen<int16_t>(p, out);
    case TokenDType::uint16:
      return widen<uint16_t>(p, out);
    case TokenDType::int32:
      return widen<int32_t>(p, out);
    case TokenDType::int64:
      return widen<int64_t>(p, out);
    case TokenDType::float32:
      return widen<float>(p, out);
    case TokenDType::float64:
      return widen<double>(p, out);
  }
}

std::string IndexedDataset::describe() const {
  return fmt::format("{}, {} documents, {} sequences, {} tokens", token_dtype_name(dtype_), documents(), n_, tokens_);
}

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenDType dtype, const std::string& flag)
    : prefix_(prefix), flag_(flag), dtype_(dtype) {
  const std::filesystem::path dir = std::filesystem::path(prefix).parent_path();
  std::error_code ec;
  if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
    throw ConfigError(fmt::format("{} {}: the directory {} does not exist", flag_, prefix_, dir.string()));
  const std::string path = prefix + ".bin";
  bin_ = std::fopen(path.c_str(), "wb");
  if (bin_ == nullptr)
    throw ConfigError(fmt::format("{} {}: {} cannot be written ({})", flag_, prefix_, path, std::strerror(errno)));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_ != nullptr) std::fclose(bin_);
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens, std::span<const int64_t> sequence_lengths) {
  AMPIPE_CHECK(bin_ != nullptr, "add_document after finalize");
  int64_t sum = 0;
  for (int64_t l : sequence_lengths) {
    AMPIPE_CHECK(l >= 0 && l <= std::numeric_limits<int32_t>::max(), "sequence length {}", l);
    sum += l;
  }
  AMPIPE_CHECK(sum == int64_t(tokens.size()), "sequence lengths sum to {}, the document has {} tokens", sum,
               tokens.size());
  const int64_t item = token_dtype_bytes(dtype_);
  buf_.resize(tokens.size() * size_t(item));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!fits(tokens[i], dtype_))
      throw ConfigError(fmt::format("{} {}: token id {} does not fit the dataset's dtype {}", flag_, prefix_,
                                    tokens[i], token_dtype_name(dtype_)));
    put_token(buf_.data() + i * size_t(item), tokens[i], dtype_);
  }
  if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), bin_) != buf_.size())
    throw ConfigError(fmt::format("{} {}: {}.bin cannot be written ({})", flag_, prefix_, prefix_,
                                  std::strerror(errno)));
  for (int64_t l : sequence_lengths) lengths_.push_back(int32_t(l));
  doc_index_.push_back(int64_t(lengths_.size()));
  tokens_ += sum;
}

void IndexedDatasetWriter::finalize() {
  AMPIPE_CHECK(bin_ != nullptr, "finalize twice");
  const int close_rc = std::fclose(bin_);
  bin_ = nullptr;
  if (close_rc != 0)
    throw ConfigError(fmt::format("{} {}: {}.bin cannot be written ({})", flag_, prefix_, prefix_,
                                  std::strerror(errno)));
  const int64_t n = int64_t(lengths_.size()), m = int64_t(doc_index_.size()), item = token_dtype_bytes(dtype_);
  std::vector<unsigned char> b(size_t(kIndexHeaderBytes + 12 * n + 8 * m));
  unsigned char* p = b.data();
  auto put = [&p](const auto v) {
    std::memcpy(p, &v, sizeof(v));
    p += sizeof(v);
  };
  std::memcpy(p, kIndexMagic, sizeof(kIndexMagic));
  p += sizeof(kIndexMagic);
  put(uint64_t(1));
  put(uint8_t(dtype_));
  put(uint64_t(n));
  put(uint64_t(m));
  for (int32_t l : lengths_) put(l);
  int64_t ptr = 0;
  for (int32_t l : lengths_) {
    put(ptr);
    ptr += int64_t(l) * item;
  }
  for (int64_t d : doc_index_) put(d);
  const std::string path = prefix_ + ".idx";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(b.data(), 1, b.size(), f) == b.size();
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (!ok)
    throw ConfigError(fmt::format("{} {}: {} cannot be written ({})", flag_, prefix_, path, std::strerror(errno)));
}

}  // namespace ampipe::train

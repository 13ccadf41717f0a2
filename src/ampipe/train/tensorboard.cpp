#include "ampipe/train/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "ampipe/core/checksum.h"
#include "ampipe/core/error.h"

namespace ampipe::train {

namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xFF));
}

// Field key: (field number << 3) | wire type (0 varint, 1 64-bit, 2 length-delimited, 5 32-bit).
void put_key(std::string& out, int field, int wire) { put_varint(out, uint64_t(field) << 3 | uint64_t(wire)); }

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string tf_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                     const std::string& file_version) {
  std::string ev;
  uint64_t wt = 0;
  std::memcpy(&wt, &wall_time, 8);
  put_key(ev, 1, 1);
  put_le(ev, wt, 8);
  put_key(ev, 2, 0);
  put_varint(ev, uint64_t(step));  // int64: two's complement as a 10-byte varint when negative
  if (!file_version.empty()) put_bytes(ev, 3, file_version);
  if (!scalars.empty()) {
    std::string summary;
    for (const auto& [tag, value] : scalars) {
      std::string v;
      put_bytes(v, 1, tag);
      const float f = float(value);
      uint32_t bits = 0;
      std::memcpy(&bits, &f, 4);
      put_key(v, 2, 5);
      put_le(v, bits, 4);
      put_bytes(summary, 1, v);
    }
    put_bytes(ev, 5, summary);
  }
  return ev;
}

std::string tf_record(const std::string& payload) {
  std::string r;
  put_le(r, payload.size(), 8);
  put_le(r, core::crc32c_masked(r.data(), 8), 4);
  r += payload;
  put_le(r, core::crc32c_masked(payload.data(), payload.size()), 4);
  return r;
}

EventWriter::EventWriter(const std::string& dir, const std::string& flag) : flag_(flag) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const double now = unix_seconds();
  path_ = dir + "/events.out.tfevents." + std::to_string(int64_t(now)) + "." + host;
  f_ = std::fopen(path_.c_str(), "wb");
  if (f_ == nullptr)
    throw ConfigError(fmt::format("{} {}: the event file {} cannot be created: {}", flag_, dir, path_,
                                  std::strerror(errno)));
  write_record(tf_event(now, 0, {}, "brain.Event:2"));
  flush();
}

EventWriter::~EventWriter() {
  if (f_ == nullptr) return;
  flush();
  std::fclose(f_);
}

void EventWriter::write_record(const std::string& payload) {
  if (failed_) return;
  const std::string r = tf_record(payload);
  if (std::fwrite(r.data(), 1, r.size(), f_) != r.size()) {
    failed_ = true;
    fmt::print(stderr, "ampipe: warning: {}: writing {} failed ({}); no further TensorBoard events\n", flag_, path_,
               std::strerror(errno));
  }
}

void EventWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  write_record(tf_event(unix_seconds(), step, scalars));
}

void EventWriter::flush() {
  if (failed_) return;
  if (std::fflush(f_) != 0) {
    failed_ = true;
    fmt::print(stderr, "ampipe: warning: {}: writing {} failed ({}); no further TensorBoard events\n", flag_, path_,
               std::strerror(errno));
  }
}

}  // namespace ampipe::train

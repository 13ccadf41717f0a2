// TensorBoard event files (`--tensorboard-dir`, docs/training.md "TensorBoard"), written without TensorFlow.
//
// The file DIR/events.out.tfevents.<unix seconds>.<host> is a sequence of TFRecords:
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | payload | uint32 masked CRC-32C of it
// (masked crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8, core/checksum.h). Each payload is a tensorflow.Event
// protobuf, encoded here by hand:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }    Value { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2" (what TensorBoard's loader looks for); every later one
// one step's scalars, all in one Summary. tests/train/read_tfevents.py reads the files back independently.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace ampipe::train {

class EventWriter {
 public:
  // Creates DIR/events.out.tfevents.<time>.<host> (DIR must exist and be writable: check_writable_dir) and writes
  // the file_version record. Throws ConfigError naming the flag and the file when it cannot be created.
  EventWriter(const std::string& dir, const std::string& flag = "--tensorboard-dir");
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One Event at `step` holding every (tag, value) pair. Buffered until flush().
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  // Writes the buffered records to the file. A failed write (a full disk) is said once on stderr and ends the
  // writing; training goes on.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);

  std::string path_, flag_;
  std::FILE* f_ = nullptr;
  bool failed_ = false;
};

// The bytes of one TFRecord around `payload` (exposed for tests).
std::string tf_record(const std::string& payload);
// A tensorflow.Event with wall_time, step and the scalars (empty: none), or file_version when not empty.
std::string tf_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                     const std::string& file_version = "");

}  // namespace ampipe::train

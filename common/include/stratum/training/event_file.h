// TensorBoard event files as TensorFlow's summary writer makes them: a file
// "events.out.tfevents.<seconds>.<host>.<pid>.<n>.v2" of TFRecord-framed Event protos (a
// length, its masked CRC-32C, the record, its masked CRC-32C), the first event naming the
// format ("brain.Event:2"), then one event per scalar as tf.summary.scalar writes it (a
// float32 tensor of rank 0 under the "scalars" plugin). Each scalar is flushed when
// written, so TensorBoard shows a run while it trains. Not thread-safe.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stratum {

class EventFileWriter {
 public:
  // Creates `dir` (and its parents) when missing and a new event file in it. FAILED_PRECONDITION
  // naming the folder and the reason when it cannot.
  static absl::StatusOr<std::unique_ptr<EventFileWriter>> Create(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One scalar at `step`, stamped with the time now.
  absl::Status WriteScalar(const std::string& tag, double value, int64_t step);
  const std::string& path() const { return path_; }

 private:
  EventFileWriter(std::string path, FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status WriteEvent(const std::string& serialized);

  std::string path_;
  FILE* file_;
};

}  // namespace stratum

#include "stratum/training/event_file.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "proto/event.pb.h"
#include "stratum/data/crc32c.h"

namespace stratum {
namespace {

double SecondsSinceEpoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

void AppendLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

absl::StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Create(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat("TensorBoard's log folder ", dir,
                                                      " cannot be made (", error.message(),
                                                      "): give a log_dir this process can write"));
  }
  // Two writers of one process in one second (train, then a resumed run) get distinct names.
  static std::atomic<int> count{0};
  const std::string path =
      absl::StrCat(dir, "/events.out.tfevents.", static_cast<int64_t>(SecondsSinceEpoch()), ".",
                   HostName(), ".", getpid(), ".", count++, ".v2");
  FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("TensorBoard's event file ", path,
                                                      " cannot be created (", std::strerror(errno),
                                                      "): give a log_dir this process can write"));
  }
  std::unique_ptr<EventFileWriter> writer(new EventFileWriter(path, file));
  tensorflow::Event first;
  first.set_wall_time(SecondsSinceEpoch());
  first.set_file_version("brain.Event:2");
  absl::Status written = writer->WriteEvent(first.SerializeAsString());
  if (!written.ok()) return written;
  return writer;
}

EventFileWriter::~EventFileWriter() { std::fclose(file_); }

absl::Status EventFileWriter::WriteScalar(const std::string& tag, double value, int64_t step) {
  tensorflow::Event event;
  event.set_wall_time(SecondsSinceEpoch());
  event.set_step(step);
  tensorflow::Summary::Value* summary = event.mutable_summary()->add_value();
  summary->set_tag(tag);
  summary->mutable_metadata()->mutable_plugin_data()->set_plugin_name("scalars");
  summary->mutable_metadata()->set_data_class(tensorflow::DATA_CLASS_SCALAR);
  tensorflow::TensorProto* tensor = summary->mutable_tensor();
  tensor->set_dtype(tensorflow::DT_FLOAT);
  tensor->mutable_tensor_shape();  // rank 0
  tensor->add_float_val(static_cast<float>(value));
  return WriteEvent(event.SerializeAsString());
}

absl::Status EventFileWriter::WriteEvent(const std::string& serialized) {
  std::string record;
  AppendLittleEndian(record, serialized.size(), 8);
  AppendLittleEndian(record, MaskCrc32c(Crc32c(record.data(), 8)), 4);
  record += serialized;
  AppendLittleEndian(record, MaskCrc32c(Crc32c(serialized.data(), serialized.size())), 4);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("TensorBoard's event file ", path_,
                                                     " cannot be written (", std::strerror(errno),
                                                     "): free space on its disk"));
  }
  return absl::OkStatus();
}

}  // namespace stratum

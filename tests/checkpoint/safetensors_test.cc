#include "stratum/checkpoint/safetensors.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/checkpoint_folder.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/json_text.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

std::string Path(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// What spdlog's default logger writes while one lives (it puts the previous one back).
class LogCapture {
 public:
  LogCapture()
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(100)),
        previous_(spdlog::default_logger()) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::string Text() const { return absl::StrJoin(sink_->last_formatted(), ""); }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  TensorFile file;
  file.tensors = {{"dense/kernel", Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6})},
                  {"labels", Tensor::FromVector<uint8_t>({3}, {7, 8, 9})},
                  {"step", Tensor::FromVector<int64_t>({}, {42})}};
  file.metadata = {{"format", "stratum"}, {"step", "42"}};
  const std::string path = Path("round_trip.safetensors");
  auto written = WriteSafetensors(path, file);
  ASSERT_TRUE(written.ok()) << written.status();
  auto read = ReadSafetensors(path, written->crc32);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(read->tensors[i].first, file.tensors[i].first);
    EXPECT_TRUE(read->tensors[i].second.BitwiseEqual(file.tensors[i].second));
  }
  EXPECT_EQ(read->metadata, file.metadata);
}

TEST(SafetensorsTest, TheLayoutIsTheSafetensorsFormat) {
  const std::string path = Path("layout.safetensors");
  ASSERT_OK(WriteSafetensors(path, {{{"x", Tensor::FromVector<float>({1}, {1.5f})}}, {}}));
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  EXPECT_EQ(length % 8, 0u);
  EXPECT_THAT(bytes.substr(8, length),
              HasSubstr(R"("x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})"));
  EXPECT_EQ(bytes.size(), 8 + length + 4);
}

// A file written a tensor at a time: the header, written last with the metadata known by
// then, fills the room kept for it (padded with spaces, as the format allows), and the
// file reads back whole with the checksum Finish gave.
TEST(SafetensorsTest, AWriterAddsATensorAtATimeAndWritesTheHeaderLast) {
  const std::string path = Path("streamed.safetensors");
  const std::vector<SafetensorsEntry> entries = {{"a", DType::kFloat32, Shape({2, 2})},
                                                 {"b", DType::kInt64, Shape({3})}};
  const std::map<std::string, std::string> guess = {{"a.updates", "-9223372036854775808"}};
  const uint64_t room = SafetensorsHeaderBytes(entries, guess) + 100;
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> writer = SafetensorsWriter::Open(path, room);
  ASSERT_OK(writer.status());
  const Tensor a = Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4});
  const Tensor b = Tensor::FromVector<int64_t>({3}, {5, 6, 7});
  ASSERT_OK((*writer)->Add("a", a));
  EXPECT_FALSE(std::filesystem::exists(path));  // not before Finish
  ASSERT_OK((*writer)->Add("b", b));
  const std::map<std::string, std::string> metadata = {{"a.updates", "12"}};
  absl::StatusOr<WrittenFile> written = (*writer)->Finish(metadata);
  ASSERT_OK(written.status());
  const std::string bytes = ReadFile(path);
  EXPECT_EQ(written->bytes, static_cast<int64_t>(bytes.size()));
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  EXPECT_EQ(length, (room + 7) / 8 * 8);
  EXPECT_EQ(bytes.size(), 8 + length + 16 + 24);
  EXPECT_EQ(bytes[8 + length - 1], ' ');
  absl::StatusOr<TensorFile> read = ReadSafetensors(path, written->crc32);
  ASSERT_OK(read.status());
  ASSERT_EQ(read->tensors.size(), 2u);
  EXPECT_TRUE(read->tensors[0].second.BitwiseEqual(a));
  EXPECT_TRUE(read->tensors[1].second.BitwiseEqual(b));
  EXPECT_EQ(read->metadata, metadata);
}

// A writer given too little room for its header, or dropped before Finish, leaves no file
// and no temporary file behind.
TEST(SafetensorsTest, AWriterThatCannotFinishLeavesNothing) {
  const std::string dir = Path("unfinished");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> dropped =
        SafetensorsWriter::Open(dir + "/dropped.safetensors", 64);
    ASSERT_OK(dropped.status());
    ASSERT_OK((*dropped)->Add("x", Tensor::Scalar(1)));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsWriter>> small =
      SafetensorsWriter::Open(dir + "/small.safetensors", 8);
  ASSERT_OK(small.status());
  ASSERT_OK((*small)->Add("x", Tensor::Scalar(1)));
  const absl::Status finished = (*small)->Finish({}).status();
  EXPECT_EQ(finished.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(finished.message()), HasSubstr("more than the 8 kept for it"));
  small->reset();
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

// A FIFO in a checkpoint file's place (as a Restore request may name) is refused at once:
// opening it for reading would wait for a writer forever.
TEST(SafetensorsTest, AFifoIsRefusedWithoutBlocking) {
  const std::string fifo = ::testing::TempDir() + "/fifo_" + std::to_string(getpid());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<std::string> read = ReadWholeFile(fifo, "checkpoint file");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("it is not a regular file"));
  unlink(fifo.c_str());
}

TEST(SafetensorsTest, CorruptFilesAreNamedAndRefused) {
  const std::string path = Path("corrupt.safetensors");
  auto written = WriteSafetensors(path, {{{"x", Tensor(DType::kFloat32, {4})}}, {}});
  ASSERT_OK(written);
  EXPECT_THAT(std::string(ReadSafetensors(path, written->crc32 + 1).status().message()),
              HasSubstr("its checksum is"));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "garbage";
  EXPECT_EQ(ReadSafetensors(path).status().code(), absl::StatusCode::kDataLoss);
  std::string bad_header(8, '\0');
  bad_header[0] = 60;  // a header of 60 bytes in a file that is shorter
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bad_header << "{}";
  EXPECT_THAT(std::string(ReadSafetensors(path).status().message()),
              HasSubstr("runs past the end of the file"));
  EXPECT_EQ(ReadSafetensors(Path("missing.safetensors")).status().code(),
            absl::StatusCode::kNotFound);
}

// A file that cannot be read (here a folder in its place; a disk's I/O error takes the same
// path) is damage to fall back from, named: the read used to throw from std::ifstream and
// abort stratum-train, the evaluator and the PS's restore (QA round 4, finding 1).
TEST(SafetensorsTest, AFileThatCannotBeReadIsDamageNotACrash) {
  const std::string path = Path("folder.safetensors");
  std::filesystem::create_directories(path);
  absl::StatusOr<TensorFile> read = ReadSafetensors(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr("cannot read checkpoint file " + path + ": it is a folder, not a file"));
  EXPECT_EQ(ReadWholeFile(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadWholeFile(Path("missing")).status().code(), absl::StatusCode::kNotFound);
  // A file that says no size, as /proc's do, is read to its end.
  const absl::StatusOr<std::string> status = ReadWholeFile("/proc/self/status");
  ASSERT_OK(status.status());
  EXPECT_THAT(*status, HasSubstr("VmRSS:"));
}

TEST(SafetensorsTest, AFailedWriteLeavesThePreviousFileWhole) {
  EXPECT_FALSE(WriteSafetensors("/nonexistent/folder/x.safetensors", {}).ok());
  const std::string path = Path("keep.safetensors");
  auto first = WriteSafetensors(path, {{{"x", Tensor::Scalar(1)}}, {}});
  ASSERT_OK(first);
  // A write that cannot finish (the process may write files of 64 bytes at most, as on a
  // full disk) fails without touching the existing file, and leaves no temporary file.
  const pid_t writer = fork();
  if (writer == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit small = {64, 64};
    setrlimit(RLIMIT_FSIZE, &small);
    const absl::Status failed =
        WriteSafetensors(path, {{{"x", Tensor(DType::kFloat32, Shape({1024}))}}, {}}).status();
    _exit(failed.ok() ? 1 : 0);
  }
  ASSERT_GT(writer, 0);
  int status = 0;
  ASSERT_EQ(waitpid(writer, &status, 0), writer);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto read = ReadSafetensors(path, first->crc32);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read->tensors[0].second.data<float>(), 1);
  for (const auto& entry : std::filesystem::directory_iterator(::testing::TempDir())) {
    EXPECT_EQ(entry.path().filename().string().rfind(
                  std::filesystem::path(path).filename().string() + ".tmp.", 0),
              std::string::npos)
        << entry.path();
  }
}

// A writer killed between its temporary file and the rename leaves the temporary behind:
// the next write of that file removes it, but not one of a writer still alive.
TEST(SafetensorsTest, AWriteRemovesTheTemporaryFilesOfDeadWriters) {
  const std::string dir = Path("temporaries");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const std::string path = dir + "/checkpoint";
  const std::string left = path + ".tmp." + std::to_string(dead);
  const std::string alive = path + ".tmp." + std::to_string(getppid());
  const std::string other = dir + "/summary.json.tmp." + std::to_string(dead);
  for (const std::string& file : {left, alive, other}) std::ofstream(file) << "partial";
  ASSERT_OK(WriteFileAtomically(path, "whole\n"));
  EXPECT_FALSE(std::filesystem::exists(left));
  EXPECT_TRUE(std::filesystem::exists(alive));
  EXPECT_TRUE(std::filesystem::exists(other));  // another file's: left to its own writes
  std::filesystem::remove_all(dir);
}

// The folder layout: without its "checkpoint" file a folder of complete checkpoints is not
// a new job (its first save would overwrite them) but a damaged one, and the file may only
// name a folder of its own directory.
TEST(CheckpointFolderTest, ALostPointerFileIsDamageNotANewJob) {
  const std::string dir = Path("ckpt_layout");
  std::filesystem::remove_all(dir);
  ASSERT_OK(CreateCheckpointFolder(dir, 5));
  EXPECT_FALSE(LatestCheckpointFolder(dir)->has_value());  // a half-written folder only
  ASSERT_OK(CommitCheckpoint(dir, 5, {{"step", 5}}, 3));
  ASSERT_OK(CreateCheckpointFolder(dir, 10));
  ASSERT_OK(CommitCheckpoint(dir, 10, {{"step", 10}}, 3));
  EXPECT_EQ(**LatestCheckpointFolder(dir), CheckpointFolder(dir, 10));

  std::filesystem::remove(dir + "/checkpoint");
  auto lost = LatestCheckpointFolder(dir);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(lost.status().message()),
              HasSubstr("holds 2 complete checkpoint(s), the newest ckpt-000000000010, but no "
                        "\"checkpoint\" file"));

  std::ofstream(dir + "/checkpoint")
      << R"({"latest": "../elsewhere/ckpt-000000000010", "step": 10})";
  EXPECT_EQ(LatestCheckpointFolder(dir).status().code(), absl::StatusCode::kDataLoss);
  std::filesystem::remove_all(dir);
}

// A folder left half-written (a save cut short: data files, no manifest) is not a
// checkpoint: pruning never counts it against max_to_keep, so the one just written stays,
// and the leftover goes.
TEST(CheckpointFolderTest, PruningCountsOnlyCompleteCheckpoints) {
  const std::string dir = Path("ckpt_prune");
  std::filesystem::remove_all(dir);
  ASSERT_OK(CreateCheckpointFolder(dir, 100));
  ASSERT_OK(CommitCheckpoint(dir, 100, {{"step", 100}}, 1));
  for (int step : {50, 200}) {
    ASSERT_OK(CreateCheckpointFolder(dir, step));
    std::ofstream(CheckpointFolder(dir, step) + "/state.safetensors.tmp.999") << "partial";
  }
  ASSERT_OK(CreateCheckpointFolder(dir, 150));
  ASSERT_OK(CommitCheckpoint(dir, 150, {{"step", 150}}, 1));
  EXPECT_EQ(**LatestCheckpointFolder(dir), CheckpointFolder(dir, 150));
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(dir, 150) + "/manifest.json"));
  for (int gone : {50, 100, 200}) {
    EXPECT_FALSE(std::filesystem::exists(CheckpointFolder(dir, gone))) << gone;
  }
  // With room for two, the previous complete one stays too.
  ASSERT_OK(CreateCheckpointFolder(dir, 300));
  ASSERT_OK(CommitCheckpoint(dir, 300, {{"step", 300}}, 2));
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(dir, 150)));
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(dir, 300)));
  std::filesystem::remove_all(dir);
}

// A save that failed (a full disk) says so, keeps its cause's code, names the checkpoint a
// restart resumes from, and leaves no folder of the failed step behind (QA: "cannot write
// .../state.safetensors: No space left on device" alone, exit 1 so that the launcher
// restarted the job three times, and an empty ckpt folder left).
TEST(CheckpointFolderTest, AFailedSaveNamesTheCheckpointStillIntactAndLeavesNoFolder) {
  const std::string dir = Path("ckpt_not_saved");
  std::filesystem::remove_all(dir);
  const absl::Status full = absl::FailedPreconditionError("cannot write x: No space left");
  ASSERT_OK(CreateCheckpointFolder(dir, 100));
  absl::Status first = CheckpointNotSaved(dir, 100, full);
  EXPECT_EQ(first.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(first.message()),
            "the checkpoint at step 100 was not saved: cannot write x: No space left; " + dir +
                " holds no earlier checkpoint");
  EXPECT_FALSE(std::filesystem::exists(CheckpointFolder(dir, 100)));

  ASSERT_OK(CreateCheckpointFolder(dir, 100));
  ASSERT_OK(CommitCheckpoint(dir, 100, {{"step", 100}}, 3));
  ASSERT_OK(CreateCheckpointFolder(dir, 200));
  absl::Status later = CheckpointNotSaved(dir, 200, absl::InternalError("cannot write y: EIO"));
  EXPECT_EQ(later.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(later.message()),
              HasSubstr("step 200 was not saved: cannot write y: EIO; " + dir +
                        " still holds ckpt-000000000100 intact, which the job resumes from"));
  EXPECT_FALSE(std::filesystem::exists(CheckpointFolder(dir, 200)));
  // The committed latest saved again and failed: it stays.
  (void)CheckpointNotSaved(dir, 100, full);
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(dir, 100) + "/manifest.json"));
  std::filesystem::remove_all(dir);
}

// A manifest is sealed with its own checksum: one damaged or edited by hand (a step, an
// epoch) reads as damaged, not as truth, and a field of the wrong type in an old one
// (written before the checksum) is damage too, never an exception.
TEST(CheckpointFolderTest, AnEditedOrMistypedManifestIsDamage) {
  const std::string dir = Path("ckpt_manifest");
  std::filesystem::remove_all(dir);
  for (int step : {100, 200}) {
    ASSERT_OK(CreateCheckpointFolder(dir, step));
    ASSERT_OK(CommitCheckpoint(dir, step, {{"step", step}, {"epoch", 1}}, 3));
  }
  auto manifest = ReadCheckpointManifest(CheckpointFolder(dir, 200));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ((*manifest)["epoch"], 1);
  auto rewrite = [&](const nlohmann::json& text) {
    std::ofstream(CheckpointFolder(dir, 200) + "/manifest.json") << text.dump(2);
  };
  nlohmann::json edited = *manifest;
  edited["epoch"] = 99;
  rewrite(edited);
  auto refused = ReadCheckpointManifest(CheckpointFolder(dir, 200));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("does not match its checksum: it is corrupt or was edited"));
  // Without a checksum (an older checkpoint): the step must still be the folder's.
  edited = {{"step", -5}};
  rewrite(edited);
  EXPECT_THAT(std::string(ReadCheckpointManifest(CheckpointFolder(dir, 200)).status().message()),
              HasSubstr("gives step -5, but its folder is step 200: it is corrupt"));
  // A field of the wrong type met while restoring: damage, so the one before is restored.
  rewrite({{"step", 200}, {"epoch", "one"}});
  auto restored = RestoreNewestIntact(dir, [](const std::string& folder) -> absl::Status {
    auto read = ReadCheckpointManifest(folder);
    if (!read.ok()) return read.status();
    return (*read)["epoch"].get<int>() == 1 ? absl::OkStatus() : absl::InternalError("?");
  });
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(**restored, CheckpointFolder(dir, 100));
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(dir, 200) + ".damaged"));
  std::filesystem::remove_all(dir);
}

// A diverged loss (NaN, which JSON writes as null) survives the manifest: its checksum
// matches, and the figure reads back as NaN, not as damage.
TEST(CheckpointFolderTest, ANanFigureRoundTripsThroughTheManifest) {
  const std::string dir = Path("ckpt_nan");
  std::filesystem::remove_all(dir);
  ASSERT_OK(CreateCheckpointFolder(dir, 7));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ASSERT_TRUE(
      CommitCheckpoint(dir, 7, {{"step", 7}, {"loss", nan}, {"accuracy", 0.1234567890123}}, 1)
          .ok());
  auto manifest = ReadCheckpointManifest(CheckpointFolder(dir, 7));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_TRUE(std::isnan(JsonNumberOr(*manifest, "loss", 0)));
  EXPECT_EQ(JsonNumberOr(*manifest, "accuracy", 0), 0.1234567890123);
  EXPECT_EQ(JsonNumberOr(*manifest, "missing", 5), 5);
  std::filesystem::remove_all(dir);
}

// One job writes a checkpoint folder at a time; a second is refused with the holder named,
// and the folder is free again once the first lets go.
TEST(CheckpointFolderTest, OneJobAtATimeWritesAFolder) {
  const std::string dir = Path("ckpt_lock");
  std::filesystem::remove_all(dir);
  {
    absl::StatusOr<CheckpointFolderLock> first = LockCheckpointFolder(dir);
    ASSERT_TRUE(first.ok()) << first.status();
    absl::StatusOr<CheckpointFolderLock> second =
        LockCheckpointFolder(dir, absl::Milliseconds(200));
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(second.status().message()),
                HasSubstr("checkpoint.dir " + dir + " is in use by another job (pid " +
                          std::to_string(getpid()) + " on "));
    EXPECT_THAT(std::string(second.status().message()), HasSubstr("another checkpoint.dir"));
  }
  EXPECT_OK(LockCheckpointFolder(dir, absl::ZeroDuration()));
  std::filesystem::remove_all(dir);
}

// A folder where the latest checkpoint is named is found when the job starts, with the fix,
// not at its first save as 'cannot write .../checkpoint: Is a directory' (QA round 4,
// finding 6).
TEST(CheckpointFolderTest, AFolderInThePlaceOfThePointerFileIsRefusedAtTheStart) {
  const std::string dir = Path("ckpt_pointer_folder");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/checkpoint");
  absl::StatusOr<CheckpointFolderLock> lock = LockCheckpointFolder(dir);
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(lock.status().message()),
              HasSubstr(dir + "/checkpoint is not a file (each save writes the name of the "
                              "latest checkpoint there): move it away, or set another "
                              "checkpoint.dir"));
  std::filesystem::remove_all(dir);
}

// A damaged latest checkpoint does not stop the job: the newest intact one before it is
// restored and becomes the latest, and the damaged one is kept aside.
TEST(CheckpointFolderTest, ADamagedLatestFallsBackToTheNewestIntactOne) {
  const std::string dir = Path("ckpt_fallback");
  std::filesystem::remove_all(dir);
  for (int step : {5, 10, 15}) {
    ASSERT_OK(CreateCheckpointFolder(dir, step));
    ASSERT_OK(CommitCheckpoint(dir, step, {{"step", step}}, 3));
  }
  std::vector<std::string> tried;
  // 15 has a bad checksum, 10 lost a file, 5 is intact.
  auto restore = [&](const std::string& folder) -> absl::Status {
    tried.push_back(std::filesystem::path(folder).filename().string());
    if (folder == CheckpointFolder(dir, 15)) return absl::DataLossError("crc32 differs");
    if (folder == CheckpointFolder(dir, 10)) return absl::NotFoundError("ps-1 is missing");
    return absl::OkStatus();
  };
  auto restored = RestoreNewestIntact(dir, restore);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(**restored, CheckpointFolder(dir, 5));
  EXPECT_EQ(tried, (std::vector<std::string>{"ckpt-000000000015", "ckpt-000000000010",
                                             "ckpt-000000000005"}));
  EXPECT_EQ(**LatestCheckpointFolder(dir), CheckpointFolder(dir, 5));
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(dir, 15) + ".damaged"));
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(dir, 10) + ".damaged"));
  EXPECT_FALSE(std::filesystem::exists(CheckpointFolder(dir, 15)));

  // Another kind of error (the job's own) is returned as it is, and none intact: the
  // latest's error, with nothing renamed.
  auto refused = RestoreNewestIntact(
      dir, [](const std::string&) { return absl::FailedPreconditionError("another model"); });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  auto none = RestoreNewestIntact(
      dir, [](const std::string&) { return absl::DataLossError("crc32 differs"); });
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(none.status().message()),
      HasSubstr("no checkpoint in " + dir + " is intact (ckpt-000000000005: crc32 differs)"));
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("remove " + dir));
  EXPECT_TRUE(std::filesystem::exists(CheckpointFolder(dir, 5)));

  // A corrupt "checkpoint" file: the newest intact folder is restored, and named again.
  ASSERT_OK(CreateCheckpointFolder(dir, 20));
  ASSERT_OK(CommitCheckpoint(dir, 20, {{"step", 20}}, 5));
  std::ofstream(dir + "/checkpoint") << "junk";
  tried.clear();
  restored = RestoreNewestIntact(dir, restore);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(**restored, CheckpointFolder(dir, 20));
  EXPECT_EQ(**LatestCheckpointFolder(dir), CheckpointFolder(dir, 20));

  // A lost one likewise (not a new job whose first save would overwrite them).
  std::filesystem::remove(dir + "/checkpoint");
  restored = RestoreNewestIntact(dir, restore);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(**restored, CheckpointFolder(dir, 20));
  EXPECT_EQ(**LatestCheckpointFolder(dir), CheckpointFolder(dir, 20));
  std::filesystem::remove_all(dir);
}

// A damaged folder set aside is evidence: when a step is damaged again (a job that fell
// back, trained past it anew and was damaged once more), the new one goes beside the ones
// set aside before, under the first free name, which the warning gives. It used to replace
// ckpt-<step>.damaged, and the first damage was lost.
TEST(CheckpointFolderTest, ADamagedFolderIsSetAsideUnderAFreeNameNeverOverAnEarlierOne) {
  const std::string dir = Path("ckpt_damaged_again");
  std::filesystem::remove_all(dir);
  for (int step : {5, 10}) {
    ASSERT_OK(CreateCheckpointFolder(dir, step));
    ASSERT_OK(CommitCheckpoint(dir, step, {{"step", step}}, 3));
  }
  const std::string aside = CheckpointFolder(dir, 10) + ".damaged";
  for (const std::string& earlier : {aside, aside + ".2"}) {
    std::filesystem::create_directories(earlier);
    std::ofstream(earlier + "/evidence") << earlier;
  }
  auto restore = [&](const std::string& folder) -> absl::Status {
    if (folder == CheckpointFolder(dir, 10)) return absl::DataLossError("crc32 differs");
    return absl::OkStatus();
  };
  LogCapture log;
  auto restored = RestoreNewestIntact(dir, restore);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(**restored, CheckpointFolder(dir, 5));
  EXPECT_EQ(ReadFile(aside + "/evidence"), aside);
  EXPECT_EQ(ReadFile(aside + ".2/evidence"), aside + ".2");
  EXPECT_TRUE(std::filesystem::exists(aside + ".3/manifest.json"));
  EXPECT_FALSE(std::filesystem::exists(CheckpointFolder(dir, 10)));
  EXPECT_THAT(log.Text(), HasSubstr("the damaged one is kept as " + aside + ".3"));
  // Pruning counts none of them: they stay through later saves.
  ASSERT_OK(CreateCheckpointFolder(dir, 20));
  ASSERT_OK(CommitCheckpoint(dir, 20, {{"step", 20}}, 1));
  for (const std::string& kept : {aside, aside + ".2", aside + ".3"}) {
    EXPECT_TRUE(std::filesystem::exists(kept)) << kept;
  }
  std::filesystem::remove_all(dir);
}

// What a server confines a client's paths to: inside the folder, component by component,
// links followed, relative paths as this process resolves them.
TEST(CheckpointFolderTest, CheckInsideFolderKeepsPathsInsideTheFolder) {
  namespace fs = std::filesystem;
  const fs::path base = fs::temp_directory_path() / absl::StrCat("inside_folder_", getpid());
  fs::remove_all(base);
  fs::create_directories(base / "ckpt" / "ckpt-1");
  fs::create_directories(base / "ckpt-evil");
  fs::create_symlink(base / "ckpt-evil", base / "ckpt" / "out");
  const std::string folder = (base / "ckpt").string();
  for (const std::string& inside :
       {folder + "/ckpt-1/ps-0.safetensors", folder + "/new/ps-0.safetensors",
        folder + "/./ckpt-1/../ckpt-1/x", folder + "//ckpt-1/x"}) {
    EXPECT_TRUE(CheckInsideFolder(inside, folder + "/", "Save").ok()) << inside;
  }
  for (const std::string& outside :
       {(base / "ckpt-evil" / "x").string(), folder + "/../ckpt-evil/x", folder + "/out/x", folder,
        folder + "/ckpt-1/../..", std::string("/etc/passwd")}) {
    const absl::Status refused = CheckInsideFolder(outside, folder, "Save");
    EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << outside;
    EXPECT_THAT(std::string(refused.message()),
                HasSubstr("is not inside the job's checkpoint folder"));
  }
  EXPECT_EQ(CheckInsideFolder("", folder, "Save").code(), absl::StatusCode::kInvalidArgument);
  // A relative path and folder resolve against this process's working folder alike.
  const fs::path was = fs::current_path();
  fs::current_path(base);
  EXPECT_OK(CheckInsideFolder("ckpt/ckpt-1/x", "ckpt", "Restore"));
  EXPECT_FALSE(CheckInsideFolder("ckpt-evil/x", "ckpt", "Restore").ok());
  fs::current_path(was);
  fs::remove_all(base);
}

// Confined reads and writes open beneath the folder: a link inside it that leads out (as
// one swapped in after CheckInsideFolder would) is refused by the open itself, and nothing
// is written or read outside; links that stay inside are followed.
TEST(SafetensorsTest, ConfinedFilesStayBeneathTheirFolder) {
  namespace fs = std::filesystem;
  const fs::path base = Path("confined");
  const fs::path folder = base / "ckpt";
  const fs::path outside = base / "outside";
  fs::create_directories(folder / "real");
  fs::create_directories(outside);
  fs::create_directory_symlink(outside, folder / "escape");
  fs::create_directory_symlink("real", folder / "inner");
  const Confinement confined{folder.string()};
  TensorFile file;
  file.tensors.push_back({"w", Tensor::FromVector<float>({2}, {1, 2})});

  const absl::StatusOr<WrittenFile> escaped =
      WriteSafetensors((folder / "escape" / "w.safetensors").string(), file, confined);
  EXPECT_THAT(escaped.status(), testing::StatusIs(absl::StatusCode::kPermissionDenied,
                                                  HasSubstr("leads out of the folder")));
  EXPECT_TRUE(fs::is_empty(outside));
  ASSERT_OK(WriteSafetensors((outside / "planted.safetensors").string(), file).status());
  EXPECT_THAT(
      ReadSafetensors((folder / "escape" / "planted.safetensors").string(), std::nullopt, confined)
          .status(),
      testing::StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("leads out")));
  EXPECT_THAT(ReadSafetensors((folder / ".." / "outside" / "planted.safetensors").string(),
                              std::nullopt, confined)
                  .status(),
              testing::StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("leads out")));
  // Unconfined, the same link is followed (what the check before the open guards).
  EXPECT_OK(ReadSafetensors((folder / "escape" / "planted.safetensors").string()).status());

  ASSERT_OK(
      WriteSafetensors((folder / "inner" / "w.safetensors").string(), file, confined).status());
  absl::StatusOr<TensorFile> back =
      ReadSafetensors((folder / "real" / "w.safetensors").string(), std::nullopt, confined);
  ASSERT_OK(back.status());
  EXPECT_TRUE(back->tensors[0].second.BitwiseEqual(file.tensors[0].second));
  fs::remove_all(base);
}

}  // namespace
}  // namespace stratum

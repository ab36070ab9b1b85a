#include "stratum/checkpoint/checkpoint_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "stratum/checkpoint/checkpoint_reader.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/util/error_kind.h"
#include "stratum/util/process_info.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

namespace fs = std::filesystem;

constexpr char kLatestFile[] = "checkpoint";
constexpr char kManifestFile[] = "manifest.json";

std::string FolderName(int64_t step) { return absl::StrFormat("ckpt-%012d", step); }

// The step of a folder named by FolderName; -1 for any other name.
int64_t StepOfFolder(const std::string& name) {
  int64_t step = 0;
  if (name.size() != 17 || name.rfind("ckpt-", 0) != 0 ||
      !absl::SimpleAtoi(name.substr(5), &step) || FolderName(step) != name) {
    return -1;
  }
  return step;
}

// Where RestoreNewestIntact sets a damaged `folder` aside: "<folder>.damaged", or, when
// a folder set aside before holds that name (the same step damaged again), the first free
// "<folder>.damaged.<n>" from n = 2, so no earlier damage is ever replaced.
std::string FreeDamagedName(const std::string& folder) {
  std::string name = folder + ".damaged";
  std::error_code error;
  for (int n = 2; fs::exists(fs::symlink_status(name, error)); ++n) {
    name = absl::StrCat(folder, ".damaged.", n);
  }
  return name;
}

}  // namespace

namespace {

// Why files cannot be created in `dir` (made when missing); empty when they can.
std::string WhyNotWritable(const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return error.message();
  const std::string probe = absl::StrCat(dir, "/.stratum-write-check-", getpid());
  const int fd = open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return std::strerror(errno);
  close(fd);
  unlink(probe.c_str());
  return "";
}

}  // namespace

absl::Status CheckInsideFolder(const std::string& path, const std::string& folder,
                               absl::string_view what) {
  // Resolved: the existing part of each with its links followed, the rest taken lexically.
  const auto resolve = [](const std::string& name) -> std::optional<fs::path> {
    std::error_code error;
    fs::path full = fs::absolute(name, error);
    if (error) return std::nullopt;
    full = fs::weakly_canonical(full, error);
    if (error) return std::nullopt;
    full = full.lexically_normal();
    if (full.has_relative_path() && full.filename().empty()) full = full.parent_path();
    return full;
  };
  const std::optional<fs::path> root = resolve(folder);
  const std::optional<fs::path> target = resolve(path);
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is refused: it names no file"));
  }
  if (!root || !target) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " of \"", path, "\" is refused: it or the folder ", folder, " cannot be resolved"));
  }
  const auto [in_root, in_target] =
      std::mismatch(root->begin(), root->end(), target->begin(), target->end());
  if (in_root == root->end() && in_target != target->end()) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(what, " of \"", path, "\" is refused: it resolves to ", target->string(),
                   ", which is not inside the job's checkpoint folder ", root->string(),
                   ", the only place this server writes and reads checkpoint files"));
}

absl::Status CheckWritableFolder(const std::string& dir, const std::string& what) {
  const std::string problem = WhyNotWritable(dir);
  if (problem.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, " ", dir, " cannot be written (", problem,
                                                    "): make it a folder this user can write, or "
                                                    "set ",
                                                    what, " to one"));
}

absl::Status CheckWritableFileFolder(const std::string& path, const std::string& what) {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " ", path, " is a folder: pass the path of a file, e.g. ", path, "/summary.json"));
  }
  const fs::path parent = fs::path(path).parent_path();
  const std::string folder = (parent.empty() ? fs::path(".") : parent).string();
  const std::string problem = WhyNotWritable(folder);
  if (problem.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " ", path, " cannot be written: no file can be created in its folder ", folder, " (",
      problem, "): make it a folder this user can write, or pass another path"));
}

CheckpointFolderLock::CheckpointFolderLock(CheckpointFolderLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)) {}

CheckpointFolderLock& CheckpointFolderLock::operator=(CheckpointFolderLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

CheckpointFolderLock::~CheckpointFolderLock() {
  if (fd_ >= 0) close(fd_);  // releases the flock
}

absl::StatusOr<CheckpointFolderLock> LockCheckpointFolder(const std::string& dir,
                                                          absl::Duration wait) {
  STRATUM_RETURN_IF_ERROR(CheckWritableFolder(dir, "checkpoint.dir"));
  // Each save names the latest checkpoint there: found now, not after an epoch of training.
  const std::string pointer = absl::StrCat(dir, "/checkpoint");
  std::error_code error;
  if (std::filesystem::exists(pointer, error) &&
      !std::filesystem::is_regular_file(pointer, error)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.dir ", dir, ": ", pointer,
        " is not a file (each save writes the name of the latest checkpoint there): move it "
        "away, or set another checkpoint.dir"));
  }
  const std::string path = absl::StrCat(dir, "/.lock");
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  // Another user's lock file in a shared folder: flock needs no write access.
  if (fd < 0 && errno == EACCES) fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir ", dir, ": cannot open ", path, " (", std::strerror(errno),
                     "): make it a file this user can write, or set another checkpoint.dir"));
  }
  const absl::Time deadline = absl::Now() + wait;
  bool told = false;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      spdlog::warn("cannot lock {} ({}): nothing keeps a second job from writing {} meanwhile",
                   path, std::strerror(errno), dir);
      return CheckpointFolderLock(fd);
    }
    char text[512] = {};
    const ssize_t read = pread(fd, text, sizeof(text) - 1, 0);
    const std::string holder(absl::StripTrailingAsciiWhitespace(read > 0 ? text : "?"));
    if (absl::Now() >= deadline) {
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir ", dir, " is in use by another job (", holder,
          "): two jobs writing one folder resume and delete each other's checkpoints; let that "
          "job finish or stop it, or give this one another checkpoint.dir"));
    }
    if (!told) spdlog::info("waiting for {} to release {}", holder, path);
    told = true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  const std::string owner = absl::StrCat(
      "pid ", getpid(), " on ", HostName(), ", ", program_invocation_short_name, ", since ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", absl::Now(), absl::LocalTimeZone()));
  if (ftruncate(fd, 0) != 0 || pwrite(fd, owner.data(), owner.size(), 0) < 0) {
    spdlog::debug("cannot note the owner in {}: {}", path, std::strerror(errno));
  }
  return CheckpointFolderLock(fd);
}

absl::Status DeleteCheckpoints(const std::string& dir) {
  std::error_code error;
  std::filesystem::remove(dir + "/checkpoint", error);
  std::vector<std::filesystem::path> folders;
  for (std::filesystem::directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    if (absl::StartsWith(it->path().filename().string(), "ckpt-")) folders.push_back(it->path());
  }
  for (const std::filesystem::path& folder : folders) {
    if (error) break;
    std::filesystem::remove_all(folder, error);
  }
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoints in ", dir,
                                                      " could not all be removed (",
                                                      error.message(), "): remove them by hand"));
  }
  return absl::OkStatus();
}

std::string CheckpointFolder(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/", FolderName(step));
}

absl::StatusOr<std::string> CreateCheckpointFolder(const std::string& dir, int64_t step) {
  const std::string folder = CheckpointFolder(dir, step);
  std::error_code error;
  fs::create_directories(folder, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create checkpoint folder ", folder,
                                                      ": ", error.message(),
                                                      "; fix checkpoint.dir in the job"));
  }
  return folder;
}

absl::Status CommitCheckpoint(const std::string& dir, int64_t step, const nlohmann::json& manifest,
                              int max_to_keep) {
  const std::string folder = CheckpointFolder(dir, step);
  nlohmann::json sealed = manifest;
  sealed.erase(kManifestChecksumKey);
  sealed[kManifestChecksumKey] = ManifestChecksum(sealed);
  STRATUM_RETURN_IF_ERROR(
      WriteFileAtomically(absl::StrCat(folder, "/", kManifestFile), sealed.dump(2)));
  const nlohmann::json latest = {{"latest", FolderName(step)}, {"step", step}};
  STRATUM_RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir, "/", kLatestFile), latest.dump()));
  // Only complete folders (with a manifest) count against max_to_keep; a half-written one
  // (a save cut short) is no checkpoint, so it never pushes out the one just written, and
  // it goes. Not the ".damaged" ones set aside by RestoreNewestIntact: they are kept.
  std::vector<std::string> complete;
  std::vector<std::string> leftovers;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || StepOfFolder(name) < 0) continue;
    (fs::exists(entry.path() / kManifestFile) ? complete : leftovers).push_back(name);
  }
  std::sort(complete.begin(), complete.end());
  const size_t keep = static_cast<size_t>(std::max(1, max_to_keep));
  for (size_t i = 0; i + keep < complete.size(); ++i) leftovers.push_back(complete[i]);
  for (const std::string& name : leftovers) {
    if (name != FolderName(step)) fs::remove_all(absl::StrCat(dir, "/", name), error);
  }
  spdlog::info("checkpoint at step {} written to {}", step, folder);
  return absl::OkStatus();
}

uint32_t ManifestChecksum(const nlohmann::json& manifest) {
  nlohmann::json rest = manifest;
  rest.erase(kManifestChecksumKey);
  const std::string text = rest.dump();  // keys sorted, numbers in their shortest form
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size())));
}

absl::StatusOr<nlohmann::json> ReadCheckpointManifest(const std::string& folder) {
  const std::string path = absl::StrCat(folder, "/", kManifestFile);
  STRATUM_ASSIGN_OR_RETURN(nlohmann::json manifest, ReadJsonObjectFile(path));
  // Checkpoints written before the checksum have none; their fields are checked as read.
  if (manifest.contains(kManifestChecksumKey)) {
    const nlohmann::json& stored = manifest[kManifestChecksumKey];
    if (!stored.is_number_unsigned() || stored.get<uint64_t>() != ManifestChecksum(manifest)) {
      return absl::DataLossError(
          absl::StrCat(path, " does not match its checksum: it is corrupt or was edited"));
    }
  }
  const int64_t folder_step = StepOfFolder(fs::path(folder).filename().string());
  const nlohmann::json& step = manifest["step"];
  if (!step.is_number_integer() || step.get<int64_t>() != folder_step) {
    return absl::DataLossError(absl::StrCat(path, " gives step ", step.dump(),
                                            ", but its folder is step ", folder_step,
                                            ": it is corrupt"));
  }
  return manifest;
}

absl::Status CheckpointNotSaved(const std::string& dir, int64_t step, const absl::Status& cause) {
  const std::string folder = CheckpointFolder(dir, step);
  const absl::StatusOr<std::optional<std::string>> latest = LatestCheckpointFolder(dir);
  std::string kept;
  if (latest.ok()) {
    if (*latest != folder) {
      std::error_code ignored;
      fs::remove_all(folder, ignored);
    }
    kept = latest->has_value()
               ? absl::StrCat("; ", dir, " still holds ", fs::path(**latest).filename().string(),
                              " intact, which the job resumes from when run again")
               : absl::StrCat("; ", dir, " holds no earlier checkpoint");
  }
  // The cause's kind stays (a PS that lost its variables is waited for and re-seeded).
  return Rewrapped(cause, absl::StrCat("the checkpoint at step ", step,
                                       " was not saved: ", cause.message(), kept));
}

absl::StatusOr<std::optional<std::string>> LatestCheckpointFolder(const std::string& dir) {
  const std::string pointer = absl::StrCat(dir, "/", kLatestFile);
  if (!fs::exists(pointer)) {
    // Complete checkpoints without the pointer mean it was lost (damage, which
    // RestoreNewestIntact repairs), not a new job whose first save would overwrite them.
    std::vector<std::string> complete;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(dir, error)) {
      const std::string name = entry.path().filename().string();
      if (StepOfFolder(name) >= 0 && fs::exists(entry.path() / kManifestFile)) {
        complete.push_back(name);
      }
    }
    if (complete.empty()) return std::optional<std::string>();
    std::sort(complete.begin(), complete.end());
    const std::string& newest = complete.back();
    return absl::DataLossError(absl::StrCat(
        dir, " holds ", complete.size(), " complete checkpoint(s), the newest ", newest,
        ", but no \"checkpoint\" file naming the latest: it was deleted or lost (to train "
        "from scratch, remove ",
        dir, " or set another checkpoint.dir)"));
  }
  absl::StatusOr<nlohmann::json> latest = ReadJsonObjectFile(pointer);
  if (!latest.ok()) return latest.status();
  if (!latest->contains("latest") || !(*latest)["latest"].is_string()) {
    return absl::DataLossError(absl::StrCat(pointer, " names no checkpoint: it is corrupt"));
  }
  // Only a folder of this checkpoint directory, as CommitCheckpoint names them.
  const std::string name = (*latest)["latest"].get<std::string>();
  if (StepOfFolder(name) < 0) {
    return absl::DataLossError(absl::StrCat(pointer, " names \"", name,
                                            "\", not a checkpoint folder of ", dir,
                                            " (ckpt-<12-digit step>): it is corrupt"));
  }
  return std::optional<std::string>(absl::StrCat(dir, "/", name));
}

absl::StatusOr<std::optional<std::string>> RestoreNewestIntact(
    const std::string& dir, const std::function<absl::Status(const std::string& folder)>& restore) {
  absl::StatusOr<std::optional<std::string>> latest = LatestCheckpointFolder(dir);
  // A corrupt "checkpoint" file: every complete folder is a candidate, newest first.
  const absl::Status pointer_error =
      absl::IsDataLoss(latest.status()) ? latest.status() : absl::OkStatus();
  if (!latest.ok() && pointer_error.ok()) return latest.status();
  if (latest.ok() && !latest->has_value()) return latest;
  // The latest, then the complete folders before it, newest first.
  const int64_t latest_step = latest.ok() ? StepOfFolder(fs::path(**latest).filename().string())
                                          : std::numeric_limits<int64_t>::max();
  std::vector<std::string> older;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    const int64_t step = StepOfFolder(name);
    if (step >= 0 && step < latest_step && fs::exists(entry.path() / kManifestFile)) {
      older.push_back(name);
    }
  }
  std::sort(older.rbegin(), older.rend());
  std::vector<std::string> candidates;
  if (latest.ok()) candidates.push_back(**latest);
  for (const std::string& name : older) candidates.push_back(absl::StrCat(dir, "/", name));

  absl::Status first_error = pointer_error;
  std::vector<std::string> damaged;
  std::string why_damaged;  // each damaged folder and its error
  for (const std::string& folder : candidates) {
    absl::Status restored;
    try {
      restored = restore(folder);
    } catch (const nlohmann::json::exception& error) {  // a field of the wrong type
      restored = absl::DataLossError(absl::StrCat(folder, "/", kManifestFile,
                                                  " has a field Stratum cannot read (",
                                                  error.what(), "): it is corrupt"));
    }
    if (restored.ok()) {
      if (first_error.ok()) return std::optional<std::string>(folder);
      const std::string name = fs::path(folder).filename().string();
      const nlohmann::json pointer = {{"latest", name}, {"step", StepOfFolder(name)}};
      STRATUM_RETURN_IF_ERROR(
          WriteFileAtomically(absl::StrCat(dir, "/", kLatestFile), pointer.dump()));
      // Each under a name of its own: what was set aside before stays as it is.
      std::vector<std::string> aside;
      for (const std::string& bad : damaged) {
        aside.push_back(FreeDamagedName(bad));
        fs::rename(bad, aside.back(), error);
      }
      if (damaged.empty()) {
        spdlog::warn(
            "restored {}, the newest intact checkpoint, because {}/{} is damaged ({}); "
            "it names that one now",
            folder, dir, kLatestFile, std::string(first_error.message()));
      } else if (fs::exists(damaged.front())) {
        spdlog::warn(
            "restored {} instead of the latest checkpoint, {}, which is damaged ({}) and could "
            "not be set aside as {}",
            folder, damaged.front(), std::string(first_error.message()), aside.front());
      } else if (fs::exists(aside.front())) {
        spdlog::warn(
            "restored {} instead of the latest checkpoint, which is damaged ({}); the "
            "damaged one is kept as {}",
            folder, std::string(first_error.message()), aside.front());
      } else {
        spdlog::warn("restored {} instead of the latest checkpoint, {}, which is gone ({})", folder,
                     damaged.front(), std::string(first_error.message()));
      }
      // The damaged ones between the latest and the one restored.
      for (size_t i = 1; i < damaged.size(); ++i) {
        if (fs::exists(aside[i]) && !fs::exists(damaged[i])) {
          spdlog::warn("checkpoint {} is damaged too; it is kept as {}", damaged[i], aside[i]);
        }
      }
      return std::optional<std::string>(folder);
    }
    // A file of a complete checkpoint that is missing is damage too.
    if (!absl::IsDataLoss(restored) && !absl::IsNotFound(restored)) return restored;
    if (first_error.ok()) first_error = restored;
    damaged.push_back(folder);
    absl::StrAppend(&why_damaged, why_damaged.empty() ? "" : "; ",
                    fs::path(folder).filename().string(), ": ", restored.message());
  }
  if (damaged.empty()) return first_error;  // only the "checkpoint" file, and no folder
  // Not DATA_LOSS: the job cannot go on until someone acts, so it is not to be retried.
  return absl::FailedPreconditionError(absl::StrCat(
      "no checkpoint in ", dir, " is intact (", why_damaged,
      "), so training cannot resume: to train from scratch, remove ", dir,
      " or set another checkpoint.dir; to keep the damaged ones, move them away first"));
}

}  // namespace stratum

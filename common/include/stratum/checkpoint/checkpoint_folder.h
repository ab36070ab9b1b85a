// The layout every Stratum checkpoint shares, whoever writes it (the PS job's coordinator,
// a MultiWorkerMirrored chief, stratum-train): folder <dir>/ckpt-<step>/ holding the data
// files and manifest.json, written last and atomically; the file <dir>/checkpoint names
// the latest complete folder and is replaced atomically after the manifest, so a crash at
// any moment leaves the previous checkpoint whole and named; folders beyond max_to_keep
// are deleted only after the new one is complete. Not thread-safe per folder.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace stratum {

// OK when files can be created in `dir` (made when missing); else FAILED_PRECONDITION
// naming `what` (e.g. "checkpoint.dir"), the folder and the reason. Jobs check where they
// will write before training, not at their first save or at the end.
absl::Status CheckWritableFolder(const std::string& dir, const std::string& what);
// The same for the folder a file will be written into (e.g. what = "--summary_json").
absl::Status CheckWritableFileFolder(const std::string& path, const std::string& what);

// OK when `path` is inside `folder` once both are resolved as this process sees them
// (absolute, symbolic links followed, "." and ".." taken out); PERMISSION_DENIED naming
// `what` (e.g. "Save"), the path, what it resolves to and the folder otherwise. For servers
// that write or read files a client names (a parameter server's checkpoint files).
absl::Status CheckInsideFolder(const std::string& path, const std::string& folder,
                               absl::string_view what);

// Held by the one job that writes a checkpoint folder, for as long as it runs: an flock on
// "<dir>/.lock", which the kernel releases when the process ends however it ends, so a
// lock is never stale. Two jobs writing one folder would resume each other's checkpoints
// and prune each other's folders.
class CheckpointFolderLock {
 public:
  explicit CheckpointFolderLock(int fd) : fd_(fd) {}
  CheckpointFolderLock(CheckpointFolderLock&& other) noexcept;
  CheckpointFolderLock& operator=(CheckpointFolderLock&& other) noexcept;
  CheckpointFolderLock(const CheckpointFolderLock&) = delete;
  CheckpointFolderLock& operator=(const CheckpointFolderLock&) = delete;
  ~CheckpointFolderLock();

 private:
  int fd_;
};

// Takes the lock of `dir` (made when missing) for this process, waiting up to `wait` for
// a holder that is finishing (a job restarted while its previous run still saves). Then
// FAILED_PRECONDITION naming the holder (pid, host, program, since when) and the fix. A
// file system without flock gets a warning and no lock rather than no training.
absl::StatusOr<CheckpointFolderLock> LockCheckpointFolder(const std::string& dir,
                                                          absl::Duration wait = absl::Seconds(5));

// Removes the checkpoints of `dir` (the file "checkpoint" first, so that no reader follows
// it into a folder half removed, then every ckpt-* folder), leaving other files. For
// BackupAndRestore's delete_checkpoint, once its job is complete. FAILED_PRECONDITION naming
// what could not be removed.
absl::Status DeleteCheckpoints(const std::string& dir);

// "<dir>/ckpt-000000000042" for step 42.
std::string CheckpointFolder(const std::string& dir, int64_t step);

// Creates the folder of `step` (FAILED_PRECONDITION naming it when it cannot).
absl::StatusOr<std::string> CreateCheckpointFolder(const std::string& dir, int64_t step);

// The manifest's own checksum: CRC-32 of its compact dump without this key, so that a
// manifest damaged or edited by hand (a step, an epoch) reads as damaged, not as truth.
inline constexpr char kManifestChecksumKey[] = "manifest_crc32";
uint32_t ManifestChecksum(const nlohmann::json& manifest);

// Reads <folder>/manifest.json as CommitCheckpoint wrote it. NOT_FOUND when missing;
// DATA_LOSS when it is not a JSON object, does not match its checksum, or gives a step
// other than its folder's.
absl::StatusOr<nlohmann::json> ReadCheckpointManifest(const std::string& folder);

// Completes the checkpoint of `step` whose files are in place: writes its manifest (with
// its checksum), points "checkpoint" at it, and prunes the oldest folders beyond
// `max_to_keep`.
absl::Status CommitCheckpoint(const std::string& dir, int64_t step, const nlohmann::json& manifest,
                              int max_to_keep);

// What a save of `step` into `dir` that failed with `cause` says, with `cause`'s code: that
// the checkpoint was not saved, why, and which checkpoint of `dir` a restart resumes from
// (still intact: a save never touches the committed ones). Its folder, unless it is the
// committed latest (saved again), is no checkpoint and is removed now.
absl::Status CheckpointNotSaved(const std::string& dir, int64_t step, const absl::Status& cause);

// The latest complete checkpoint's folder, or nullopt when `dir` has none yet. DATA_LOSS
// when the pointer file is corrupt, or lost beside complete checkpoints.
absl::StatusOr<std::optional<std::string>> LatestCheckpointFolder(const std::string& dir);

// Restores the latest checkpoint of `dir` with `restore` (given its folder). When that one
// is damaged (`restore` answers DATA_LOSS: a checksum that does not match, a file that does
// not parse; or NOT_FOUND: a file it lists is missing), the complete ones before it are tried,
// newest first; the first that restores becomes the latest ("checkpoint" names it) and the damaged
// ones are renamed "<folder>.damaged", kept for inspection (or, when one set aside before has
// that name, the first free "<folder>.damaged.2", ".3", ...: none is ever replaced; the
// warning gives the name). A corrupt or lost "checkpoint" file is damage: the newest intact
// folder is restored and named. Returns the folder restored from, nullopt when
// `dir` has no checkpoint, or, when no checkpoint is intact, FAILED_PRECONDITION naming
// each one and its damage (then nothing is renamed).
absl::StatusOr<std::optional<std::string>> RestoreNewestIntact(
    const std::string& dir, const std::function<absl::Status(const std::string& folder)>& restore);

}  // namespace stratum

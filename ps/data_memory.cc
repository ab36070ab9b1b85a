#include "data_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"

namespace stratum {
namespace {

std::string ErrnoText(int error) { return std::strerror(error); }

}  // namespace

void AlignedBuffer::Reserve(size_t bytes, size_t keep) {
  if (bytes <= capacity_) return;
  const size_t capacity = std::max(bytes, capacity_ + capacity_ / 2) / 64 * 64 + 64;
  void* memory = std::aligned_alloc(64, capacity);
  if (memory == nullptr) throw std::bad_alloc();
  std::shared_ptr<void> grown(memory, [](void* p) { std::free(p); });
  if (keep > 0) std::memcpy(grown.get(), memory_.get(), std::min(keep, capacity_));
  memory_ = std::move(grown);
  capacity_ = capacity;
}

void AlignedBuffer::Release() {
  memory_.reset();
  capacity_ = 0;
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Create(size_t size) {
  std::shared_ptr<SharedSegment> segment(new SharedSegment());
  segment->fd_ = memfd_create("stratum-ps-data", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (segment->fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("memfd_create: ", ErrnoText(errno)));
  }
  if (ftruncate(segment->fd_, static_cast<off_t>(size)) != 0 ||
      fcntl(segment->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot size a shared segment of ", size, " bytes: ", ErrnoText(errno)));
  }
  void* data =
      mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, segment->fd_, 0);
  if (data == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("cannot map a shared segment of ", size, " bytes: ", ErrnoText(errno)));
  }
  segment->data_ = static_cast<char*>(data);
  segment->size_ = size;
  return segment;
}

absl::StatusOr<std::shared_ptr<SharedSegment>> SharedSegment::Map(int fd, size_t max_size) {
  std::shared_ptr<SharedSegment> segment(new SharedSegment());
  segment->fd_ = fd;
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return absl::InvalidArgumentError(
        "the shared segment passed is not a memfd sealed against shrinking and growing");
  }
  struct stat info {};
  if (fstat(fd, &info) != 0 || info.st_size <= 0) {
    return absl::InvalidArgumentError("the shared segment passed is empty");
  }
  const size_t size = static_cast<size_t>(info.st_size);
  if (size > max_size) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the shared segment passed holds ", size, " bytes, more than the ", max_size,
                     " a request and its answer may take: send smaller requests"));
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map the shared segment passed: ", ErrnoText(errno)));
  }
  segment->data_ = static_cast<char*>(data);
  segment->size_ = size;
  segment->CloseFd();
  return segment;
}

SharedSegment::~SharedSegment() {
  if (data_ != nullptr) munmap(data_, size_);
  CloseFd();
}

void SharedSegment::CloseFd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace stratum

#include "stratum/cuda/device.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/util/status_macros.h"

namespace stratum::cuda {

bool IsCapturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
}

int PhysicalGpuCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // Clears the error so later CUDA calls start clean.
    return 0;
  }
  return count;
}

CachingAllocator::CachingAllocator(int device) : device_(device) {}

CachingAllocator::~CachingAllocator() {
  absl::MutexLock lock(&mutex_);
  EmptyCacheLocked();
}

size_t CachingAllocator::RoundUp(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kSmallLimit = size_t{1} << 20;
  if (bytes == 0) bytes = 1;
  if (bytes <= kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes) {
  const size_t size = RoundUp(bytes);
  absl::MutexLock lock(&mutex_);
  void* pointer = nullptr;
  auto cached = free_.find(size);
  if (cached != free_.end() && !cached->second.empty()) {
    pointer = cached->second.back();
    cached->second.pop_back();
    ++stats_.cache_hits;
    stats_.bytes_cached -= static_cast<int64_t>(size);
  } else {
    int previous = 0;
    STRATUM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
    STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaError_t error = cudaMalloc(&pointer, size);
    if (error == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      EmptyCacheLocked();
      error = cudaMalloc(&pointer, size);
    }
    cudaSetDevice(previous);
    if (error == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat(
          "GPU:", device_, " has no room for ", size, " more bytes (", stats_.bytes_in_use,
          " in use by Stratum): use a smaller batch or model, or a GPU with more memory"));
    }
    STRATUM_CUDA_RETURN_IF_ERROR(error);
    ++stats_.driver_allocations;
  }
  sizes_[pointer] = size;
  ++stats_.allocations;
  stats_.bytes_in_use += static_cast<int64_t>(size);
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return pointer;
}

void CachingAllocator::Free(void* pointer) {
  if (pointer == nullptr) return;
  absl::MutexLock lock(&mutex_);
  auto it = sizes_.find(pointer);
  if (it == sizes_.end()) {
    CheckOk(absl::InternalError(absl::StrCat(
        "CachingAllocator::Free of ", reinterpret_cast<uintptr_t>(pointer), ", which GPU:", device_,
        "'s allocator did not "
        "hand out")));
  }
  const size_t size = it->second;
  sizes_.erase(it);
  free_[size].push_back(pointer);
  stats_.bytes_in_use -= static_cast<int64_t>(size);
  stats_.bytes_cached += static_cast<int64_t>(size);
}

void CachingAllocator::EmptyCache() {
  absl::MutexLock lock(&mutex_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  for (auto& [size, pointers] : free_) {
    for (void* pointer : pointers) {
      // Memory that was handed out may still be in use by queued work; cudaFree
      // synchronizes the device first.
      STRATUM_CUDA_CHECK(cudaFree(pointer));
      ++stats_.driver_frees;
      stats_.bytes_cached -= static_cast<int64_t>(size);
    }
  }
  free_.clear();
}

AllocatorStats CachingAllocator::stats() const {
  absl::MutexLock lock(&mutex_);
  return stats_;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(CachingAllocator& allocator, size_t bytes) {
  absl::StatusOr<void*> pointer = allocator.Allocate(bytes);
  if (!pointer.ok()) return pointer.status();
  DeviceBuffer buffer;
  buffer.allocator_ = &allocator;
  buffer.data_ = *pointer;
  buffer.size_ = bytes;
  return buffer;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : allocator_(std::exchange(other.allocator_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    allocator_ = std::exchange(other.allocator_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void DeviceBuffer::Release() {
  if (allocator_ != nullptr) allocator_->Free(data_);
  allocator_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

absl::StatusOr<Stream> Stream::Create(int device) {
  Stream stream;
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  STRATUM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream.stream_, cudaStreamNonBlocking));
  stream.device_ = device;
  return stream;
}

Stream::~Stream() {
  if (stream_ != nullptr) STRATUM_CUDA_CHECK(cudaStreamDestroy(stream_));
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) STRATUM_CUDA_CHECK(cudaStreamDestroy(stream_));
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

absl::Status Stream::Synchronize() const {
  STRATUM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<Event> Event::Create(int device, bool timing) {
  Event event;
  STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  STRATUM_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&event.event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  return event;
}

Event::~Event() {
  if (event_ != nullptr) STRATUM_CUDA_CHECK(cudaEventDestroy(event_));
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) STRATUM_CUDA_CHECK(cudaEventDestroy(event_));
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

absl::Status Event::Record(const Stream& stream) const {
  STRATUM_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream.get()));
  return absl::OkStatus();
}

absl::Status Event::WaitOn(const Stream& stream) const {
  STRATUM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream.get(), event_, 0));
  return absl::OkStatus();
}

absl::Status Event::Synchronize() const {
  STRATUM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return absl::OkStatus();
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes) {
  PinnedBuffer buffer;
  STRATUM_CUDA_RETURN_IF_ERROR(cudaMallocHost(&buffer.data_, bytes == 0 ? 1 : bytes));
  buffer.size_ = bytes;
  return buffer;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) STRATUM_CUDA_CHECK(cudaFreeHost(data_));
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) STRATUM_CUDA_CHECK(cudaFreeHost(data_));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

absl::StatusOr<void*> GrowOnlyBuffer::Reserve(CachingAllocator& allocator, size_t bytes) {
  if (!Holds(bytes)) {
    STRATUM_ASSIGN_OR_RETURN(DeviceBuffer buffer,
                             DeviceBuffer::Allocate(allocator, std::max<size_t>(bytes, 256)));
    buffers_.push_back(std::move(buffer));
  }
  return data();
}

}  // namespace stratum::cuda

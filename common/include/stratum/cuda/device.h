// Device memory, streams, events and pinned host memory for the GPU path.
//
// CachingAllocator: device memory from plain cudaMalloc (never managed memory), kept in
// per-size-class free lists once freed, so that a training loop allocates from the driver
// only while it warms up. One allocator serves one physical device; its methods are
// thread-safe. DeviceBuffer owns one allocation and returns it on destruction.
//
// Stream and Event wrap cudaStream_t / cudaEvent_t; PinnedBuffer is page-locked host memory
// (cudaMallocHost) for asynchronous copies. All are move-only RAII owners; each is used by
// one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace stratum::cuda {

// The physical devices this process sees (0 without a driver or device).
int PhysicalGpuCount();

// Whether `stream` is being captured into a CUDA graph (where nothing may be allocated).
bool IsCapturing(cudaStream_t stream);

struct AllocatorStats {
  int64_t driver_allocations = 0;  // cudaMalloc calls that succeeded
  int64_t driver_frees = 0;        // cudaFree calls (EmptyCache, destruction)
  int64_t allocations = 0;         // Allocate calls that succeeded
  int64_t cache_hits = 0;          // ... served from a free list
  int64_t bytes_in_use = 0;        // handed out and not returned
  int64_t bytes_cached = 0;        // in the free lists
  int64_t peak_bytes_in_use = 0;
};

class CachingAllocator {
 public:
  // Memory of physical device `device`.
  explicit CachingAllocator(int device);
  ~CachingAllocator();  // frees the cache; every allocation must have been returned
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  int device() const { return device_; }
  // At least `bytes` (rounded up to a size class: 512 B granules below 1 MiB, then 2 MiB
  // granules), 256-byte aligned. RESOURCE_EXHAUSTED naming the device and the size when
  // the driver has no more, after the cache was returned to it and the allocation retried.
  absl::StatusOr<void*> Allocate(size_t bytes);
  // Returns an allocation of this allocator to its free list.
  void Free(void* pointer);
  // Returns the free lists to the driver.
  void EmptyCache();
  AllocatorStats stats() const;

  // The size class `bytes` rounds up to.
  static size_t RoundUp(size_t bytes);

 private:
  void EmptyCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const int device_;
  mutable absl::Mutex mutex_;
  std::map<size_t, std::vector<void*>> free_ ABSL_GUARDED_BY(mutex_);  // by size class
  std::map<void*, size_t> sizes_ ABSL_GUARDED_BY(mutex_);              // live allocations
  AllocatorStats stats_ ABSL_GUARDED_BY(mutex_);
};

// One allocation of a CachingAllocator.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Allocate(CachingAllocator& allocator, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }

 private:
  void Release();

  CachingAllocator* allocator_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Device memory that only grows, for buffers a CUDA graph captures a pointer to: a request
// larger than the newest buffer allocates another, and the older ones stay alive for the
// graphs captured with them. Never grow it while a stream is captured.
class GrowOnlyBuffer {
 public:
  // The newest buffer, after making it at least `bytes` long.
  absl::StatusOr<void*> Reserve(CachingAllocator& allocator, size_t bytes);
  // Whether the newest buffer holds `bytes` already.
  bool Holds(size_t bytes) const { return !buffers_.empty() && buffers_.back().size() >= bytes; }
  void* data() const { return buffers_.empty() ? nullptr : buffers_.back().data(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data());
  }
  size_t size() const { return buffers_.empty() ? 0 : buffers_.back().size(); }

 private:
  std::vector<DeviceBuffer> buffers_;
};

class Stream {
 public:
  Stream() = default;
  // A non-blocking stream on physical device `device`.
  static absl::StatusOr<Stream> Create(int device);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  absl::Status Synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

class Event {
 public:
  Event() = default;
  // An event without timing (cheapest to record and wait on), or with timing.
  static absl::StatusOr<Event> Create(int device, bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  absl::Status Record(const Stream& stream) const;
  // Makes `stream` wait (on the device) for the work recorded before this event.
  absl::Status WaitOn(const Stream& stream) const;
  absl::Status Synchronize() const;

 private:
  cudaEvent_t event_ = nullptr;
};

// Page-locked host memory for asynchronous copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace stratum::cuda

#include "stratum/cuda/all_reduce.h"

#include <nccl.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "stratum/cuda/cuda_check.h"
#include "stratum/cuda/kernels.h"
#include "stratum/util/status_macros.h"

namespace stratum::cuda {
namespace {

// ReductionToOneDevice (a star onto replica 0) and HierarchicalCopyAllReduce (a tree).
class CopyAllReduce final : public DeviceAllReduce {
 public:
  CopyAllReduce(bool tree, std::vector<int> devices) : tree_(tree), devices_(std::move(devices)) {}

  std::string name() const override {
    return tree_ ? "HierarchicalCopyAllReduce" : "ReductionToOneDevice";
  }

  absl::Status Init(const std::vector<CachingAllocator*>& allocators, int64_t count) {
    const bool one_device = std::set<int>(devices_.begin(), devices_.end()).size() == 1;
    for (int device : devices_) {
      STRATUM_ASSIGN_OR_RETURN(Event ready, Event::Create(device));
      STRATUM_ASSIGN_OR_RETURN(Event done, Event::Create(device));
      ready_.push_back(std::move(ready));
      done_.push_back(std::move(done));
      DeviceBuffer staging;
      if (!one_device) {
        STRATUM_ASSIGN_OR_RETURN(
            staging, DeviceBuffer::Allocate(*allocators[static_cast<size_t>(device)],
                                            static_cast<size_t>(count) * sizeof(float)));
      }
      staging_.push_back(std::move(staging));
    }
    return absl::OkStatus();
  }

  absl::Status AllReduce(const std::vector<ReplicaBuffer>& buffers, int64_t count) override {
    const size_t n = buffers.size();
    if (n != devices_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), " made for ", devices_.size(), " replicas, given ", n));
    }
    if (n == 1) return absl::OkStatus();
    for (size_t r = 0; r < n; ++r) STRATUM_RETURN_IF_ERROR(ready_[r].Record(*buffers[r].stream));
    if (tree_) {
      for (size_t stride = 1; stride < n; stride *= 2) {
        for (size_t r = 0; r + stride < n; r += 2 * stride) {
          STRATUM_RETURN_IF_ERROR(Add(buffers, r, r + stride, count));
          STRATUM_RETURN_IF_ERROR(ready_[r].Record(*buffers[r].stream));
        }
      }
    } else {
      for (size_t r = 1; r < n; ++r) STRATUM_RETURN_IF_ERROR(Add(buffers, 0, r, count));
    }
    // Replica 0 holds the sum: copy it to the others, and keep replica 0 from writing its
    // buffer again before they have read it.
    STRATUM_RETURN_IF_ERROR(done_[0].Record(*buffers[0].stream));
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    for (size_t r = 1; r < n; ++r) {
      STRATUM_RETURN_IF_ERROR(done_[0].WaitOn(*buffers[r].stream));
      STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_[r]));
      STRATUM_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(buffers[r].data, devices_[r],
                                                       buffers[0].data, devices_[0], bytes,
                                                       buffers[r].stream->get()));
      STRATUM_RETURN_IF_ERROR(done_[r].Record(*buffers[r].stream));
    }
    for (size_t r = 1; r < n; ++r) STRATUM_RETURN_IF_ERROR(done_[r].WaitOn(*buffers[0].stream));
    return absl::OkStatus();
  }

 private:
  // buffers[to] += buffers[from], on `to`'s stream.
  absl::Status Add(const std::vector<ReplicaBuffer>& buffers, size_t to, size_t from,
                   int64_t count) {
    const Stream& stream = *buffers[to].stream;
    STRATUM_RETURN_IF_ERROR(ready_[from].WaitOn(stream));
    STRATUM_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices_[to]));
    const float* source = buffers[from].data;
    if (devices_[to] != devices_[from]) {
      STRATUM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyPeerAsync(staging_[to].data(), devices_[to], source, devices_[from],
                              static_cast<size_t>(count) * sizeof(float), stream.get()));
      source = staging_[to].as<float>();
    }
    return AddInto(buffers[to].data, source, count, stream.get());
  }

  const bool tree_;
  const std::vector<int> devices_;
  std::vector<Event> ready_, done_;
  std::vector<DeviceBuffer> staging_;
};

class NcclAllReduceOp final : public DeviceAllReduce {
 public:
  NcclAllReduceOp(int num_packs, std::vector<int> devices)
      : num_packs_(std::max(num_packs, 1)), devices_(std::move(devices)) {}
  ~NcclAllReduceOp() override {
    for (ncclComm_t comm : comms_) ncclCommDestroy(comm);
  }

  std::string name() const override { return "NcclAllReduce"; }

  absl::Status Init() {
    comms_.resize(devices_.size());
    STRATUM_NCCL_RETURN_IF_ERROR(
        ncclCommInitAll(comms_.data(), static_cast<int>(devices_.size()), devices_.data()));
    return absl::OkStatus();
  }

  absl::Status AllReduce(const std::vector<ReplicaBuffer>& buffers, int64_t count) override {
    if (buffers.size() != comms_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("NcclAllReduce made for ", comms_.size(),
                                                     " replicas, given ", buffers.size()));
    }
    // num_packs chunks, as TF's NcclAllReduce packs the gradients before reducing them.
    const int64_t pack = (count + num_packs_ - 1) / num_packs_;
    STRATUM_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    for (size_t r = 0; r < buffers.size(); ++r) {
      for (int64_t first = 0; first < count; first += pack) {
        const size_t length = static_cast<size_t>(std::min(pack, count - first));
        const ncclResult_t result =
            ncclAllReduce(buffers[r].data + first, buffers[r].data + first, length, ncclFloat,
                          ncclSum, comms_[r], buffers[r].stream->get());
        if (result != ncclSuccess) {
          ncclGroupEnd();
          return NcclStatus(result, "ncclAllReduce(...)", __FILE__, __LINE__);
        }
      }
    }
    STRATUM_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
    return absl::OkStatus();
  }

 private:
  const int num_packs_;
  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceAllReduce>> MakeDeviceAllReduce(
    const std::string& name, int num_packs, const std::vector<int>& devices,
    const std::vector<CachingAllocator*>& allocators, int64_t count) {
  if (name == "NcclAllReduce") {
    if (std::set<int>(devices.begin(), devices.end()).size() != devices.size()) {
      return absl::InvalidArgumentError(
          "NcclAllReduce needs one replica per physical GPU, but some replicas share a GPU "
          "(logical GPUs): use HierarchicalCopyAllReduce or ReductionToOneDevice");
    }
    auto op = std::make_unique<NcclAllReduceOp>(num_packs, devices);
    STRATUM_RETURN_IF_ERROR(op->Init());
    return std::unique_ptr<DeviceAllReduce>(std::move(op));
  }
  if (name == "HierarchicalCopyAllReduce" || name == "ReductionToOneDevice") {
    auto op = std::make_unique<CopyAllReduce>(name == "HierarchicalCopyAllReduce", devices);
    STRATUM_RETURN_IF_ERROR(op->Init(allocators, count));
    return std::unique_ptr<DeviceAllReduce>(std::move(op));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cross-device op \"", name,
                   "\" is not supported on GPUs: use NcclAllReduce, HierarchicalCopyAllReduce or "
                   "ReductionToOneDevice"));
}

}  // namespace stratum::cuda

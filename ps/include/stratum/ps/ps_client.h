// PsClient: one parameter-server task as a worker or the coordinator sees it. Every call
// has a deadline (PsClientOptions::timeout) and its errors name the task ("ps:1 at
// host:port: ..."), so a PS that died is reported, not waited for. Thread-safe (gRPC
// stubs are).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "proto/ps.grpc.pb.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

struct PsClientOptions {
  absl::Duration timeout = absl::Seconds(30);
};

struct NamedValue {
  std::string name;
  Tensor value;
};

class PsClient {
 public:
  // `task` names the PS in errors ("ps:0").
  PsClient(std::string task, std::string address, PsClientOptions options = {});

  const std::string& task() const { return task_; }
  const std::string& address() const { return address_; }

  // Creates variables (idempotent for identical specs); returns which were new.
  absl::StatusOr<std::vector<bool>> CreateVariables(const std::vector<NamedValue>& initial,
                                                    const nlohmann::json& optimizer);
  absl::StatusOr<std::vector<Tensor>> Pull(const std::vector<std::string>& names);
  // Applies the gradients; with `pulled` the updated values come back in the same call.
  absl::Status Push(const std::vector<NamedValue>& gradients,
                    std::vector<Tensor>* pulled = nullptr);
  absl::Status Assign(const std::vector<NamedValue>& values);
  absl::StatusOr<proto::ListVariablesResponse> ListVariables();
  // Checkpoints: the PS writes / reads `path` on its own file system.
  absl::StatusOr<proto::SaveResponse> Save(const std::string& path);
  absl::Status Restore(const std::string& path, uint32_t crc32);

 private:
  std::string Peer() const;

  std::string task_;
  std::string address_;
  PsClientOptions options_;
  std::unique_ptr<proto::ParameterServer::Stub> stub_;
};

}  // namespace stratum

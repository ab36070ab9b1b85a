// TF_CONFIG as a task reads it from its environment: any text is a resolver or an error,
// never a crash; a resolver's task is one its cluster has (the evaluator, which is no part
// of the cluster in TensorFlow's convention, aside).
#include <cstdint>
#include <cstdlib>
#include "absl/strings/string_view.h"

#include "stratum/cluster/cluster_resolver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<stratum::TFConfigClusterResolver> resolver =
      stratum::TFConfigClusterResolver::Create(text);
  if (!resolver.ok() || resolver->task_type().empty()) return 0;
  // What every task does next with its resolver.
  if (resolver->task_type() != "evaluator" &&
      !resolver->cluster_spec().TaskAddress(resolver->task_type(), resolver->task_id()).ok()) {
    std::abort();  // validated, yet its own task has no address
  }
  (void)resolver->id_in_cluster();
  (void)resolver->worker_count();
  (void)stratum::ChiefTask(resolver->cluster_spec());
  return 0;
}

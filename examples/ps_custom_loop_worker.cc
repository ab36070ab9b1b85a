// The worker program of a parameter-server custom training loop (TensorFlow's "Parameter
// server training" tutorial's custom loop, in C++): it registers a per-worker dataset and
// a step function, then serves them as a worker task (TF_CONFIG type "worker") until
// SIGTERM. Its coordinator program, ps_custom_loop_coordinator.cc, schedules the step by
// name. Start it where stratum-worker would run:
//
//   TF_CONFIG='{"cluster": ..., "task": {"type": "worker", "index": 0}}'
//   build/bin/ps_custom_loop_worker [--data_dir=/usr/share/datasets/fashion-mnist]
#include <optional>

#include "absl/flags/flag.h"
#include "ps_custom_loop.h"
#include "stratum/data/idx.h"
#include "stratum/net/task_main.h"
#include "stratum/training/evaluate.h"
#include "stratum/util/flags.h"
#include "stratum/util/status_macros.h"
#include "stratum/worker/worker_functions.h"

ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Fashion-MNIST folder");

namespace {

using namespace stratum;

// One training step on this worker: the next batch of its own dataset, the variables from
// the parameter servers, forward and backward on each local replica, and the gradients'
// sum pushed back (the PSs apply the optimizer). Returns [mean loss, correct, examples].
absl::StatusOr<std::vector<Tensor>> TrainStep(WorkerContext& worker, const ClosureArguments& args) {
  STRATUM_ASSIGN_OR_RETURN(DistributedIterator * iterator, args.iterator(0));
  STRATUM_ASSIGN_OR_RETURN(std::optional<PerReplica<Element>> batch, iterator->GetNext());
  if (!batch.has_value()) return absl::OutOfRangeError("this worker's dataset ended");
  STRATUM_ASSIGN_OR_RETURN(const std::vector<Tensor> variables, worker.PullVariables());
  Strategy& strategy = worker.strategy();
  const int replicas = strategy.NumLocalReplicas();
  int64_t rows = 0;
  for (const Element& part : batch->values()) rows += part[0].rows();
  std::vector<std::vector<Tensor>> gradients(static_cast<size_t>(replicas));
  STRATUM_ASSIGN_OR_RETURN(
      const PerReplica<StepStats> stats,
      strategy.Run<StepStats>([&](ReplicaContext& context) -> absl::StatusOr<StepStats> {
        const int r = context.local_replica_id();
        // The loss is scaled by 1 / the worker's batch, each replica's share of the update.
        return worker.model().TrainStep(variables, (*batch)[r][0], (*batch)[r][1], worker.loss(),
                                        1.0f / static_cast<float>(rows), worker.workspace(r),
                                        gradients[static_cast<size_t>(r)],
                                        1.0f / static_cast<float>(replicas));
      }));
  for (size_t r = 1; r < gradients.size(); ++r) {
    for (size_t i = 0; i < gradients[0].size(); ++i)
      gradients[0][i].Flat() += gradients[r][i].Flat();
  }
  STRATUM_RETURN_IF_ERROR(worker.PushGradients(gradients[0]));
  const StepStats sums = SumOverReplicas(stats);
  return std::vector<Tensor>{Tensor::Scalar(static_cast<float>(sums.loss_sum / rows)),
                             Tensor::Scalar(static_cast<float>(sums.correct)),
                             Tensor::Scalar(static_cast<float>(sums.examples))};
}

}  // namespace

int main(int argc, char** argv) {
  ShutdownWatcher shutdown;
  ParseFlagsOrExit(argc, argv,
                   "The worker program of a parameter-server custom training loop: serves "
                   "train_step_fn and the dataset \"train\" to its coordinator program.");
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  WorkerFunctions functions;
  // tf.distribute's dataset_fn: this worker's shard of Fashion-MNIST's training set,
  // shuffled in its own order, repeated, in batches of the worker's local replicas.
  absl::Status registered = functions.RegisterDataset(
      "train", [data_dir](const InputContext& input) -> absl::StatusOr<Dataset> {
        STRATUM_ASSIGN_OR_RETURN(const MnistLikeData data, LoadFashionMnist(data_dir));
        STRATUM_ASSIGN_OR_RETURN(
            const Model model,
            Model::FromKerasJson(nlohmann::json::parse(ps_custom_loop::kJob)["model"]));
        const Dataset examples = Dataset::FromTensorSlices({data.train_images, data.train_labels})
                                     .Shard(input.num_input_pipelines, input.input_pipeline_id);
        return MakeBatches(examples, model,
                           ps_custom_loop::kBatchPerReplica * input.num_replicas_in_sync,
                           /*rescale=*/1.0 / 255, /*shuffle_buffer=*/10000,
                           /*seed=*/static_cast<uint64_t>(input.input_pipeline_id + 1),
                           /*repeat=*/true);
      });
  if (registered.ok()) registered = functions.Register("train_step_fn", TrainStep);
  if (!registered.ok()) return ReportFatal("ps_custom_loop_worker", registered);
  return ServeWorkerFunctions("ps_custom_loop_worker", std::move(functions), shutdown);
}

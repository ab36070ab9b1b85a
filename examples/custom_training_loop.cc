// A custom training loop written against Stratum's library API, as a tf.distribute user
// writes one in Python: a MirroredStrategy over two logical CPU devices, a distributed
// dataset, strategy.Run for the per-replica step, ReplicaContext::AllReduce for the
// gradients, strategy.Reduce for the loss.
//
//   build/bin/custom_training_loop [--epochs=3] [--data_dir=/usr/share/datasets/fashion-mnist]
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "stratum/data/dataset.h"
#include "stratum/data/idx.h"
#include "stratum/model/loss.h"
#include "stratum/model/model.h"
#include "stratum/model/optimizer.h"
#include "stratum/training/evaluate.h"
#include "stratum/util/exit_codes.h"
#include "stratum/util/flags.h"
#include "stratum/worker/mirrored_strategy.h"

ABSL_FLAG(int, epochs, 3, "Epochs to train");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Fashion-MNIST folder");

namespace {

constexpr char kModel[] = R"({"class_name": "Sequential", "config": {"layers": [
  {"class_name": "Flatten", "config": {"batch_input_shape": [null, 28, 28]}},
  {"class_name": "Dense", "config": {"name": "hidden", "units": 128, "activation": "relu"}},
  {"class_name": "Dense", "config": {"name": "logits", "units": 10, "activation": "linear"}}]}})";

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "custom_training_loop: %s\n", std::string(status.message()).c_str());
  return stratum::ExitCodeFor(status);  // 2 for a missing data file, as every binary
}

}  // namespace

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(argc, argv, "A custom training loop on Stratum's library API.");
  using namespace stratum;
  if (absl::GetFlag(FLAGS_epochs) < 1) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--epochs ", absl::GetFlag(FLAGS_epochs), " trains nothing: give 1 or more")));
  }

  auto strategy = MirroredStrategy::Create({.devices = {"CPU:0", "CPU:1"}});
  if (!strategy.ok()) return Fail(strategy.status());
  auto scope = (*strategy)->Scope();  // GetStrategy() is now the mirrored strategy

  auto data = LoadFashionMnist(absl::GetFlag(FLAGS_data_dir));
  if (!data.ok()) return Fail(data.status());
  auto model = Model::FromKerasJson(absl::string_view(kModel));
  if (!model.ok()) return Fail(model.status());
  const Loss loss = Loss::SparseCategoricalCrossentropy(/*from_logits=*/true);
  auto optimizer = Optimizer::FromKeras("adam");
  if (!optimizer.ok()) return Fail(optimizer.status());

  const int replicas = (*strategy)->NumLocalReplicas();
  const int64_t global_batch = 64 * replicas;
  const Dataset batches =
      MakeBatches(Dataset::FromTensorSlices({data->train_images, data->train_labels}), *model,
                  global_batch, 1.0 / 255, /*shuffle_buffer=*/10000, /*seed=*/1, /*repeat=*/false);
  auto distributed = (*strategy)->ExperimentalDistributeDataset(batches);
  if (!distributed.ok()) return Fail(distributed.status());

  // Mirrored variables: one copy per replica, with its own optimizer slots. Created in
  // the strategy's scope: variables made before it would be refused where first used.
  std::vector<std::string> names;
  for (const VariableSpec& variable : model->variables()) names.push_back(variable.name);
  DistributedVariables variables =
      (*strategy)->CreateVariables(model->InitialVariables(1), std::move(names));
  std::vector<std::vector<std::vector<Tensor>>> slots(static_cast<size_t>(replicas));
  std::vector<std::unique_ptr<Workspace>> workspaces;
  std::vector<std::vector<Tensor>> gradients(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r) workspaces.push_back(model->NewWorkspace(r));

  int64_t iteration = 0;
  for (int epoch = 1; epoch <= absl::GetFlag(FLAGS_epochs); ++epoch) {
    auto iterator = distributed->MakeIterator();
    double loss_sum = 0;
    int64_t steps = 0;
    while (true) {
      auto batch = iterator->GetNext();
      if (!batch.ok()) return Fail(batch.status());
      if (!batch->has_value()) break;
      const PerReplica<Element>& parts = **batch;
      int64_t rows = 0;
      for (const Element& part : parts.values()) rows += part[0].rows();

      // The replica step: forward and backward on this replica's part of the batch, the
      // loss scaled by 1 / GLOBAL batch size, gradients summed over replicas, and the same
      // update applied to every replica's copy.
      auto per_replica_loss =
          (*strategy)->Run<Tensor>([&](ReplicaContext& context) -> absl::StatusOr<Tensor> {
            const int r = context.local_replica_id();
            auto copy = variables.ForReplica(context);  // this replica's copy
            if (!copy.ok()) return copy.status();
            auto stats = model->TrainStep(
                **copy, parts[r][0], parts[r][1], loss, 1.0f / static_cast<float>(rows),
                *workspaces[r], gradients[static_cast<size_t>(r)],
                1.0f / static_cast<float>((*strategy)->NumReplicasInSync()));
            if (!stats.ok()) return stats.status();
            if (auto s = context.AllReduce(ReduceOp::kSum, gradients[static_cast<size_t>(r)]);
                !s.ok()) {
              return s;
            }
            (*optimizer)
                ->Apply(**copy, gradients[static_cast<size_t>(r)], slots[static_cast<size_t>(r)],
                        iteration);
            return Tensor::Scalar(static_cast<float>(stats->loss_sum / static_cast<double>(rows)));
          });
      if (!per_replica_loss.ok()) return Fail(per_replica_loss.status());
      auto step_loss = (*strategy)->Reduce(ReduceOp::kSum, *per_replica_loss);
      if (!step_loss.ok()) return Fail(step_loss.status());
      loss_sum += *step_loss->data<float>();
      ++iteration;
      ++steps;
    }
    auto test = EvaluateDataset(**strategy, *model, loss, variables.primary(),
                                Dataset::FromTensorSlices({data->test_images, data->test_labels}),
                                1.0 / 255, 1024);
    if (!test.ok()) return Fail(test.status());
    std::printf("epoch %d: train loss %.4f, test accuracy %.4f\n", epoch,
                loss_sum / static_cast<double>(steps), test->val_accuracy);
  }
  return 0;
}

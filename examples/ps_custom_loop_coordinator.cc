// The coordinator program of a parameter-server custom training loop (TensorFlow's
// "Parameter server training" tutorial's custom loop, in C++): it creates the model's
// variables on the parameter servers, makes a per-worker dataset, schedules the workers'
// registered step function by name epoch by epoch, and evaluates the variables the PSs
// hold after each epoch. Its workers run ps_custom_loop_worker.cc; its PSs are
// stratum-ps. Start it as the chief:
//
//   TF_CONFIG='{"cluster": ..., "task": {"type": "chief", "index": 0}}'
//   build/bin/ps_custom_loop_coordinator [--epochs=3] [--steps_per_epoch=300]
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "ps_custom_loop.h"
#include "stratum/coordinator/parameter_server_cluster.h"
#include "stratum/data/idx.h"
#include "stratum/net/task_main.h"
#include "stratum/strategy/strategy.h"
#include "stratum/training/evaluate.h"
#include "stratum/util/flags.h"

ABSL_FLAG(int, epochs, 3, "Epochs to train");
ABSL_FLAG(int, steps_per_epoch, 300, "Closures (one step each) scheduled per epoch");
ABSL_FLAG(absl::Duration, cluster_timeout, absl::Minutes(2),
          "How long to wait for every parameter server and worker to answer");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Fashion-MNIST folder, for the test set evaluated here");

int main(int argc, char** argv) {
  using namespace stratum;
  ShutdownWatcher shutdown;
  ParseFlagsOrExit(argc, argv,
                   "The coordinator program of a parameter-server custom training loop: "
                   "schedules its workers' train_step_fn (ps_custom_loop_worker).");
  const std::string binary = "ps_custom_loop_coordinator";
  const TaskContext context = ResolveTaskOrExit({.binary = binary, .task_types = {kChief}});
  if (absl::GetFlag(FLAGS_epochs) < 1 || absl::GetFlag(FLAGS_steps_per_epoch) < 1) {
    return ReportFatal(
        binary, absl::InvalidArgumentError("--epochs and --steps_per_epoch train nothing below 1: "
                                           "give 1 or more"));
  }
  auto test = LoadFashionMnist(absl::GetFlag(FLAGS_data_dir));
  if (!test.ok()) return ReportFatal(binary, test.status());

  ParameterServerClusterOptions options;
  options.channel = context.channel_options();
  options.cancel = &shutdown.notification();
  options.cluster_timeout = absl::GetFlag(FLAGS_cluster_timeout);
  auto cluster = ParameterServerCluster::Create(context.resolver.cluster_spec(),
                                                ps_custom_loop::kJob, options);
  if (!cluster.ok()) return ReportFatal(binary, cluster.status());
  ClusterCoordinator& coordinator = (*cluster)->coordinator();
  auto loss = Loss::FromKeras((*cluster)->job().loss);
  if (!loss.ok()) return ReportFatal(binary, loss.status());

  // coordinator.create_per_worker_dataset(dataset_fn): each worker builds "train" itself.
  const PerWorkerValues iterators = coordinator.CreatePerWorkerDataset("train");
  DefaultStrategy evaluation;
  for (int epoch = 1; epoch <= absl::GetFlag(FLAGS_epochs); ++epoch) {
    std::vector<std::shared_ptr<RemoteValue>> steps;
    for (int step = 0; step < absl::GetFlag(FLAGS_steps_per_epoch); ++step) {
      auto scheduled = coordinator.Schedule("train_step_fn", {iterators});
      if (!scheduled.ok()) return ReportFatal(binary, scheduled.status());
      steps.push_back(*std::move(scheduled));
    }
    if (absl::Status joined = coordinator.Join(); !joined.ok()) return ReportFatal(binary, joined);
    double loss_sum = 0, correct = 0, examples = 0;
    for (const std::shared_ptr<RemoteValue>& step : steps) {
      auto outputs = step->Fetch();
      if (!outputs.ok()) return ReportFatal(binary, outputs.status());
      loss_sum += *(*outputs)[0].data<float>();
      correct += *(*outputs)[1].data<float>();
      examples += *(*outputs)[2].data<float>();
    }
    // Evaluated here, on the variables the parameter servers hold now.
    auto variables = (*cluster)->ReadVariables();
    if (!variables.ok()) return ReportFatal(binary, variables.status());
    auto tested = EvaluateDataset(evaluation, (*cluster)->model(), *loss, *variables,
                                  Dataset::FromTensorSlices({test->test_images, test->test_labels}),
                                  1.0 / 255, 1024);
    if (!tested.ok()) return ReportFatal(binary, tested.status());
    std::printf("epoch %d: train loss %.4f, train accuracy %.4f, test accuracy %.4f\n", epoch,
                loss_sum / static_cast<double>(steps.size()), correct / examples,
                tested->val_accuracy);
    std::fflush(stdout);
  }
  // A RemoteValue fetched on its own, as the tutorial's last step does.
  auto last = coordinator.Schedule("train_step_fn", {iterators});
  if (!last.ok()) return ReportFatal(binary, last.status());
  auto outputs = (*last)->Fetch();
  if (!outputs.ok()) return ReportFatal(binary, outputs.status());
  std::printf("final loss %.4f, %lld closures run again after a worker failed\n",
              *(*outputs)[0].data<float>(), static_cast<long long>(coordinator.retried_closures()));
  return 0;
}

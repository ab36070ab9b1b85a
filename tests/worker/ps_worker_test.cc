// PsWorker, the parameter-server worker's logic, driven directly (no gRPC, no PS): the
// job's set-up, functions the worker program registered, per-worker datasets built once
// per set-up, and the refusals a coordinator gets by name.
#include "worker/ps_worker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/tensor/tensor_proto.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = R"({
  "model": {"class_name": "Sequential", "config": {"layers": [
    {"class_name": "Dense", "config": {"units": 2, "batch_input_shape": [null, 3]}}]}},
  "compile": {"optimizer": "sgd", "loss": "mse"}})";

proto::SetupJobRequest JobFrom(uint64_t incarnation, const std::string& secret) {
  proto::SetupJobRequest request;
  request.set_job_json(kJob);
  request.set_coordinator_incarnation(incarnation);
  request.mutable_coordinator()->set_incarnation(incarnation);
  request.mutable_coordinator()->set_secret(secret);
  request.mutable_coordinator()->set_description("the test's coordinator");
  request.set_num_workers(3);
  request.set_worker_index(2);
  return request;
}

proto::RunClosureRequest Closure(const std::string& function, uint64_t incarnation,
                                 const std::string& secret) {
  proto::RunClosureRequest request;
  request.set_function(function);
  request.set_coordinator_incarnation(incarnation);
  request.set_coordinator_secret(secret);
  return request;
}

void AddPerWorker(proto::RunClosureRequest& request, int64_t id, const std::string& dataset) {
  proto::PerWorkerArgument* argument = request.add_args()->mutable_per_worker();
  argument->set_id(id);
  argument->set_dataset(dataset);
}

class PsWorkerTest : public ::testing::Test {
 protected:
  PsWorkerTest() : worker_({}, absl::Seconds(5), Functions()) {}

  // "next" returns the next batch's first value and this worker's index; "fail" fails.
  WorkerFunctions Functions() {
    WorkerFunctions functions;
    EXPECT_TRUE(functions
                    .RegisterDataset("numbers",
                                     [this](const InputContext& input) -> absl::StatusOr<Dataset> {
                                       ++built_;
                                       input_ = input;
                                       Tensor values(DType::kFloat32, Shape({6, 1}));
                                       for (int i = 0; i < 6; ++i) values.data<float>()[i] = i;
                                       return Dataset::FromTensorSlices({values, values}).Batch(2);
                                     })
                    .ok());
    EXPECT_TRUE(functions
                    .Register("next",
                              [](WorkerContext& worker, const ClosureArguments& args)
                                  -> absl::StatusOr<std::vector<Tensor>> {
                                absl::StatusOr<DistributedIterator*> iterator = args.iterator(0);
                                if (!iterator.ok()) return iterator.status();
                                auto batch = (*iterator)->GetNext();
                                if (!batch.ok()) return batch.status();
                                if (!batch->has_value()) return absl::OutOfRangeError("ended");
                                return std::vector<Tensor>{
                                    Tensor::Scalar((**batch)[0][0].data<float>()[0]),
                                    Tensor::Scalar(static_cast<float>(worker.worker_index()))};
                              })
                    .ok());
    EXPECT_TRUE(functions
                    .RegisterDataset("remote",
                                     [](const InputContext&) -> absl::StatusOr<Dataset> {
                                       return absl::UnavailableError("the bucket did not answer");
                                     })
                    .ok());
    EXPECT_TRUE(functions
                    .Register("fail",
                              [](WorkerContext&,
                                 const ClosureArguments&) -> absl::StatusOr<std::vector<Tensor>> {
                                return absl::UnavailableError("the function's own outage");
                              })
                    .ok());
    return functions;
  }

  absl::StatusOr<float> Next(uint64_t incarnation = 1, int64_t id = 1) {
    proto::RunClosureRequest request = Closure("next", incarnation, "s");
    AddPerWorker(request, id, "numbers");
    absl::StatusOr<proto::RunClosureResponse> response = worker_.RunClosure(request);
    if (!response.ok()) return response.status();
    absl::StatusOr<Tensor> value = TensorFromProto(response->outputs(0));
    if (!value.ok()) return value.status();
    return value->data<float>()[0];
  }

  int built_ = 0;
  InputContext input_;
  PsWorker worker_;
};

TEST_F(PsWorkerTest, APerWorkerDatasetIsBuiltOncePerSetUpAndIteratedAcrossClosures) {
  ASSERT_OK(worker_.SetupJob(JobFrom(1, "s")));
  EXPECT_EQ(*Next(), 0.0f);
  EXPECT_EQ(*Next(), 2.0f);
  EXPECT_EQ(*Next(), 4.0f);
  EXPECT_EQ(built_, 1);
  EXPECT_EQ(input_.num_input_pipelines, 3);
  EXPECT_EQ(input_.input_pipeline_id, 2);
  EXPECT_EQ(input_.num_replicas_in_sync, 1);
  // The end of the data is the function's to say.
  EXPECT_EQ(Next().status().code(), absl::StatusCode::kOutOfRange);
  // Other values of the same function: another iterator.
  EXPECT_EQ(*Next(1, 2), 0.0f);
  EXPECT_EQ(built_, 2);
  // Set up again (as after a restart): built again, from the start.
  ASSERT_OK(worker_.SetupJob(JobFrom(1, "s")));
  EXPECT_EQ(*Next(), 0.0f);
  EXPECT_EQ(built_, 3);
}

TEST_F(PsWorkerTest, UnknownNamesAndWrongArgumentsAreRefusedByName) {
  ASSERT_OK(worker_.SetupJob(JobFrom(1, "s")));
  auto unknown = worker_.RunClosure(Closure("step", 1, "s"));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(),
              HasSubstr("function \"step\" is not registered on this worker (it has fail, next, "
                        "and the built-in train_step)"));
  proto::RunClosureRequest dataset = Closure("next", 1, "s");
  AddPerWorker(dataset, 1, "letters");
  EXPECT_THAT(worker_.RunClosure(dataset).status().message(),
              HasSubstr("dataset function \"letters\" is not registered on this worker (it has "
                        "numbers, remote)"));
  proto::RunClosureRequest tensor = Closure("next", 1, "s");
  TensorToProto(Tensor::Scalar(1.0f), tensor.add_args()->mutable_tensor());
  EXPECT_THAT(worker_.RunClosure(tensor).status().message(),
              HasSubstr("wants a per-worker dataset (CreatePerWorkerDataset's values) as "
                        "argument 0, and it is a tensor"));
  EXPECT_THAT(worker_.RunClosure(Closure("next", 1, "s")).status().message(),
              HasSubstr("and the closure has 0 argument(s)"));
  // One id is one dataset's values.
  ASSERT_OK(Next());
  proto::RunClosureRequest other = Closure("next", 1, "s");
  AddPerWorker(other, 1, "letters");
  EXPECT_THAT(worker_.RunClosure(other).status().message(),
              HasSubstr("per-worker values 1 are this worker's iterator over dataset "
                        "\"numbers\", not over \"letters\""));
  // The job has no data: the built-in step says so.
  EXPECT_THAT(worker_.RunClosure(Closure("train_step", 1, "s")).status().message(),
              HasSubstr("train_step trains on the job's data.train, and this job has none"));
}

TEST_F(PsWorkerTest, AFunctionsOutageIsItsOwnErrorNotAFailedWorker) {
  ASSERT_OK(worker_.SetupJob(JobFrom(1, "s")));
  absl::Status failed = worker_.RunClosure(Closure("fail", 1, "s")).status();
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnknown) << failed;
  EXPECT_THAT(failed.message(),
              HasSubstr("function \"fail\" failed (UNAVAILABLE): the function's own outage"));
  // A dataset function's outage too: the worker is fine, the closure is not retried.
  proto::RunClosureRequest remote = Closure("next", 1, "s");
  AddPerWorker(remote, 1, "remote");
  absl::Status dataset = worker_.RunClosure(remote).status();
  EXPECT_EQ(dataset.code(), absl::StatusCode::kUnknown) << dataset;
  EXPECT_THAT(dataset.message(),
              HasSubstr("dataset function \"remote\": the bucket did not answer"));
}

TEST_F(PsWorkerTest, OnlyTheCoordinatorThatSetItUpRunsClosures) {
  // Before any set-up, and from another incarnation: "not set up" (the coordinator sets it
  // up again); without the holder's secret: refused.
  EXPECT_THAT(Next().status().message(), HasSubstr("not set up"));
  ASSERT_OK(worker_.SetupJob(JobFrom(1, "s")));
  proto::RunClosureRequest forged = Closure("next", 1, "not the secret");
  AddPerWorker(forged, 1, "numbers");
  EXPECT_EQ(worker_.RunClosure(forged).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(built_, 0);
  // Leave drops the job: a closure after it finds none.
  proto::LeaveRequest leave;
  leave.set_coordinator_incarnation(1);
  leave.set_coordinator_secret("s");
  EXPECT_TRUE(worker_.Leave(leave).left());
  EXPECT_THAT(Next().status().message(), HasSubstr("not set up"));
}

TEST(WorkerFunctionsTest, NamesAreTheirOwn) {
  WorkerFunctions functions;
  const auto nothing = [](WorkerContext&,
                          const ClosureArguments&) -> absl::StatusOr<std::vector<Tensor>> {
    return std::vector<Tensor>{};
  };
  EXPECT_THAT(functions.Register("train_step", nothing).message(),
              HasSubstr("is the built-in one"));
  EXPECT_OK(functions.Register("step", nothing));
  EXPECT_THAT(functions.Register("step", nothing).message(),
              HasSubstr("function \"step\" is registered already"));
  EXPECT_FALSE(functions.Register("", nothing).ok());
  EXPECT_FALSE(functions.Register("empty", nullptr).ok());
  EXPECT_EQ(functions.Names(), "step");
  EXPECT_EQ(functions.DatasetNames(), "none");
}

}  // namespace
}  // namespace stratum

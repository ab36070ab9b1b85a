// The parameter-server training job (RunParameterServerJob) driven in one process: its
// parameter servers are PsServices and its workers PsWorkers of the test's own, reached
// through in-process links (PsJobLinks), with no socket and no gRPC runtime. The test
// stops a PS, restarts one as a new process, or takes a worker away, between two calls it
// chooses, and checks what the job does: trains every step once, waits for a PS and
// re-seeds it from the checkpoint, goes on with nothing rolled back when the PS is the
// same process, refuses to wait without a checkpoint, and retries a lost worker's
// closures on the others.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/ps_job_links.h"
#include "nlohmann/json.hpp"
#include "stratum/job/job_spec.h"
#include "stratum/ps/ps_service.h"
#include "stratum/ps/ps_transport.h"
#include "stratum/ps/variable_store.h"
#include "stratum/testing/status_matchers.h"
#include "worker/ps_worker.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::StatusIs;

// A parameter server of the test: a PsService over its own VariableStore. The test stops
// it (its calls fail UNAVAILABLE, as a PS that died or was cut off), lets it answer again
// as the same process, or restarts it as a new process (an empty store, another
// incarnation). A call already in its service when it restarts finishes on the old one.
class FakePs {
 public:
  explicit FakePs(uint64_t incarnation) { Restart(incarnation); }

  // Calls from here on fail UNAVAILABLE.
  void Stop() {
    absl::MutexLock lock(&mutex_);
    up_ = false;
  }
  // Answers again, the same process with what it held.
  void Resume() {
    absl::MutexLock lock(&mutex_);
    up_ = true;
  }
  // A new process serves: nothing of the old one's variables or claims.
  void Restart(uint64_t incarnation) {
    auto served = std::make_shared<Served>();
    served->service = std::make_unique<PsService>(served->store);
    served->transport = InProcessPsTransport(*served->service);
    served->incarnation = incarnation;
    absl::MutexLock lock(&mutex_);
    served_ = std::move(served);
    up_ = true;
  }
  bool up() const {
    absl::MutexLock lock(&mutex_);
    return up_;
  }
  uint64_t incarnation() const {
    absl::MutexLock lock(&mutex_);
    return served_->incarnation;
  }
  int pushes() const {
    absl::MutexLock lock(&mutex_);
    return pushes_;
  }
  // Called with each push's number (1, 2, ...) before it is served: a test stops or
  // restarts the PS there.
  void OnPush(std::function<void(int)> hook) {
    absl::MutexLock lock(&mutex_);
    on_push_ = std::move(hook);
  }
  // The updates applied to `variable` by the process serving now.
  int64_t Updates(const std::string& variable) {
    std::shared_ptr<Served> served = Current();
    absl::StatusOr<VariableInfo> info = served->store.Info(variable);
    return info.ok() ? info->updates : -1;
  }

  std::unique_ptr<PsTransport> Connect();

 private:
  friend class FakePsTransport;
  struct Served {
    VariableStore store;
    std::unique_ptr<PsService> service;
    std::unique_ptr<PsTransport> transport;
    uint64_t incarnation = 0;
  };

  std::shared_ptr<Served> Current() {
    absl::MutexLock lock(&mutex_);
    return served_;
  }
  // The process serving now, or null while stopped.
  std::shared_ptr<Served> Serving() {
    absl::MutexLock lock(&mutex_);
    return up_ ? served_ : nullptr;
  }
  // The process to serve a push, after the hook had its say.
  std::shared_ptr<Served> ServingPush() {
    std::function<void(int)> hook;
    int push;
    {
      absl::MutexLock lock(&mutex_);
      push = ++pushes_;
      hook = on_push_;
    }
    if (hook) hook(push);
    return Serving();
  }

  mutable absl::Mutex mutex_;
  std::shared_ptr<Served> served_ ABSL_GUARDED_BY(mutex_);
  bool up_ ABSL_GUARDED_BY(mutex_) = true;
  int pushes_ ABSL_GUARDED_BY(mutex_) = 0;
  std::function<void(int)> on_push_ ABSL_GUARDED_BY(mutex_);
};

grpc::Status Refused() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect: connection refused");
}

// A client's calls to a FakePs: to the process serving at the time of each call.
class FakePsTransport final : public PsTransport {
 public:
  explicit FakePsTransport(FakePs& ps) : ps_(ps) {}

  grpc::Status CreateVariables(const proto::CreateVariablesRequest& request,
                               proto::CreateVariablesResponse* response,
                               absl::Duration timeout) override {
    return Forward(&PsTransport::CreateVariables, ps_.Serving(), request, response, timeout);
  }
  grpc::Status Pull(const proto::PullRequest& request, proto::PullResponse* response,
                    absl::Duration timeout) override {
    return Forward(&PsTransport::Pull, ps_.Serving(), request, response, timeout);
  }
  grpc::Status Push(const proto::PushRequest& request, proto::PushResponse* response,
                    absl::Duration timeout) override {
    return Forward(&PsTransport::Push, ps_.ServingPush(), request, response, timeout);
  }
  grpc::Status Assign(const proto::AssignRequest& request, proto::AssignResponse* response,
                      absl::Duration timeout) override {
    return Forward(&PsTransport::Assign, ps_.Serving(), request, response, timeout);
  }
  grpc::Status SetLearningRate(const proto::SetLearningRateRequest& request,
                               proto::SetLearningRateResponse* response,
                               absl::Duration timeout) override {
    return Forward(&PsTransport::SetLearningRate, ps_.Serving(), request, response, timeout);
  }
  grpc::Status ListVariables(const proto::ListVariablesRequest& request,
                             proto::ListVariablesResponse* response,
                             absl::Duration timeout) override {
    return Forward(&PsTransport::ListVariables, ps_.Serving(), request, response, timeout);
  }
  grpc::Status Save(const proto::SaveRequest& request, proto::SaveResponse* response,
                    absl::Duration timeout) override {
    return Forward(&PsTransport::Save, ps_.Serving(), request, response, timeout);
  }
  grpc::Status Restore(const proto::RestoreRequest& request, proto::RestoreResponse* response,
                       absl::Duration timeout) override {
    return Forward(&PsTransport::Restore, ps_.Serving(), request, response, timeout);
  }
  grpc::Status DataPath(const proto::DataPathRequest& request, proto::DataPathResponse* response,
                        absl::Duration timeout) override {
    return Forward(&PsTransport::DataPath, ps_.Serving(), request, response, timeout);
  }
  grpc::Status Watch(const proto::WatchRequest& request, proto::WatchResponse* response,
                     absl::Duration timeout) override {
    auto served = ps_.Serving();
    if (!served) return Refused();
    grpc::Status status = served->transport->Watch(request, response, timeout);
    response->set_incarnation(served->incarnation);  // each fake is a process of its own
    return status;
  }

 private:
  // The call, to `served`, or refused when the PS is stopped (null).
  template <typename Request, typename Response>
  static grpc::Status Forward(grpc::Status (PsTransport::*method)(const Request&, Response*,
                                                                  absl::Duration),
                              const std::shared_ptr<FakePs::Served>& served, const Request& request,
                              Response* response, absl::Duration timeout) {
    return served ? ((*served->transport).*method)(request, response, timeout) : Refused();
  }

  FakePs& ps_;
};

std::unique_ptr<PsTransport> FakePs::Connect() { return std::make_unique<FakePsTransport>(*this); }

// A worker of the test: a PsWorker whose PS clients reach the FakePs at each address. The
// test takes it away (its calls fail UNAVAILABLE, as a worker that died).
class FakeWorker {
 public:
  FakeWorker(uint64_t incarnation, std::map<std::string, FakePs*> ps_by_address)
      : incarnation_(incarnation),
        worker_({}, absl::Seconds(5), WorkerFunctions{},
                [ps_by_address](const std::string& address, const ChannelOptions&) {
                  return ps_by_address.at(address)->Connect();
                }) {}

  PsWorker& worker() { return worker_; }
  uint64_t incarnation() const { return incarnation_; }
  void Stop() {
    absl::MutexLock lock(&mutex_);
    up_ = false;
  }
  bool up() const {
    absl::MutexLock lock(&mutex_);
    return up_;
  }
  int closures() const {
    absl::MutexLock lock(&mutex_);
    return closures_;
  }
  // Called with each closure's number (1, 2, ...) before it runs.
  void OnClosure(std::function<void(int)> hook) {
    absl::MutexLock lock(&mutex_);
    on_closure_ = std::move(hook);
  }
  // Counts a closure; false when the worker is down by then.
  bool StartClosure() {
    std::function<void(int)> hook;
    int closure;
    {
      absl::MutexLock lock(&mutex_);
      if (!up_) return false;
      closure = ++closures_;
      hook = on_closure_;
    }
    if (hook) hook(closure);
    return up();
  }

 private:
  const uint64_t incarnation_;
  PsWorker worker_;
  mutable absl::Mutex mutex_;
  bool up_ ABSL_GUARDED_BY(mutex_) = true;
  int closures_ ABSL_GUARDED_BY(mutex_) = 0;
  std::function<void(int)> on_closure_ ABSL_GUARDED_BY(mutex_);
};

absl::Status WorkerGone(const std::string& peer) {
  return absl::UnavailableError(absl::StrCat(peer, ": failed to connect: connection refused"));
}

// The coordinator's connection to a FakeWorker.
class FakeWorkerConnection final : public WorkerConnection {
 public:
  FakeWorkerConnection(std::string peer, FakeWorker& worker)
      : peer_(std::move(peer)), worker_(worker) {}

  absl::StatusOr<proto::SetupJobResponse> SetupJob(const proto::SetupJobRequest& request,
                                                   absl::Duration) override {
    if (!worker_.up()) return WorkerGone(peer_);
    absl::StatusOr<proto::SetupJobResponse> response = worker_.worker().SetupJob(request);
    if (response.ok()) response->set_worker_incarnation(worker_.incarnation());
    return response;
  }
  absl::StatusOr<proto::RunClosureResponse> RunClosure(const proto::RunClosureRequest& request,
                                                       absl::Duration) override {
    if (cancelled()) return absl::CancelledError("cancelled");
    if (!worker_.StartClosure()) return WorkerGone(peer_);
    return worker_.worker().RunClosure(request);
  }
  void Leave(const proto::LeaveRequest& request, absl::Duration) override {
    if (worker_.up()) worker_.worker().Leave(request);
  }
  absl::StatusOr<TaskReport> Report(absl::Duration) override {
    if (!worker_.up()) return WorkerGone(peer_);
    TaskReport report;
    report.healthy = true;
    report.incarnation = worker_.incarnation();
    return report;
  }
  absl::Status Health(absl::Duration) override {
    return worker_.up() ? absl::OkStatus() : WorkerGone(peer_);
  }
  void CancelAll() override {
    absl::MutexLock lock(&mutex_);
    cancelled_ = true;
  }

 private:
  bool cancelled() {
    absl::MutexLock lock(&mutex_);
    return cancelled_;
  }

  const std::string peer_;
  FakeWorker& worker_;
  absl::Mutex mutex_;
  bool cancelled_ ABSL_GUARDED_BY(mutex_) = false;
};

// Fashion-MNIST's MLP as examples/fashion_mnist_ps.json trains it, cut to `epochs` of
// `steps` steps (closures of 5).
nlohmann::json Job(int epochs, int steps, const std::string& checkpoint_dir = "",
                   int every_steps = 0) {
  std::ifstream file(std::string(STRATUM_SOURCE_DIR) + "/examples/fashion_mnist_ps.json");
  nlohmann::json job = nlohmann::json::parse(file);
  job["fit"]["epochs"] = epochs;
  job["fit"]["steps_per_epoch"] = steps;
  job["fit"]["steps_per_execution"] = 5;
  job["fit"]["shuffle_buffer"] = 1000;
  job.erase("checkpoint");
  if (!checkpoint_dir.empty()) {
    job["checkpoint"] = {{"dir", checkpoint_dir}, {"every_steps", every_steps}, {"max_to_keep", 2}};
  }
  return job;
}

class PsTrainingJobTest : public ::testing::Test {
 protected:
  // A cluster of a chief, `workers` workers and `ps` parameter servers, all fakes.
  void MakeCluster(int workers, int ps) {
    cluster_.SetTask(kChief, 0, "chief.test:2222");
    std::map<std::string, FakePs*> ps_by_address;
    for (int task = 0; task < ps; ++task) {
      const std::string address = absl::StrCat("ps-", task, ".test:2222");
      cluster_.SetTask(kPs, task, address);
      ps_.push_back(std::make_unique<FakePs>(NextIncarnation()));
      ps_by_address[address] = ps_.back().get();
      ps_at_[address] = ps_.back().get();
    }
    for (int task = 0; task < workers; ++task) {
      const std::string address = absl::StrCat("worker-", task, ".test:2222");
      cluster_.SetTask(kWorker, task, address);
      workers_.push_back(std::make_unique<FakeWorker>(NextIncarnation(), ps_by_address));
      worker_at_[address] = workers_.back().get();
    }
  }

  uint64_t NextIncarnation() { return next_incarnation_++; }

  PsJobLinks Links() {
    PsJobLinks links;
    links.ps = [this](const std::string& address, const ChannelOptions&) {
      return ps_at_.at(address)->Connect();
    };
    links.worker = [this](const std::string& peer, const std::string& address,
                          const ChannelOptions&) -> std::unique_ptr<WorkerConnection> {
      return std::make_unique<FakeWorkerConnection>(peer, *worker_at_.at(address));
    };
    links.report = [this](const std::string& address, absl::Duration,
                          const ChannelOptions&) -> absl::StatusOr<TaskReport> {
      FakePs* ps = ps_at_.at(address);
      if (!ps->up()) return absl::UnavailableError(absl::StrCat(address, ": connection refused"));
      TaskReport report;
      report.address = address;
      report.healthy = true;
      report.incarnation = ps->incarnation();
      return report;
    };
    // The PSs as they are now: a test resumes or restarts a PS from wait_for_ps_ (the
    // moment the job starts waiting) or earlier.
    links.wait_healthy = [this](
                             const ClusterSpec& cluster,
                             const ClusterWaitOptions&) -> absl::StatusOr<std::vector<TaskReport>> {
      ++waits_;
      if (wait_for_ps_) wait_for_ps_();
      std::vector<TaskReport> reports;
      for (int task : cluster.task_indices(kPs)) {
        FakePs* ps = ps_at_.at(*cluster.TaskAddress(kPs, task));
        if (!ps->up()) {
          return absl::DeadlineExceededError(
              absl::StrCat("ps:", task, " did not answer within --ps_recovery_timeout"));
        }
        TaskReport report;
        report.healthy = true;
        report.incarnation = ps->incarnation();
        reports.push_back(report);
      }
      return reports;
    };
    return links;
  }

  // Runs `job` on the cluster; what it printed goes to output_.
  absl::StatusOr<FitSummary> Run(const nlohmann::json& job, PsTrainingOptions options = {}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(job.dump(), "the test's job");
    if (!spec.ok()) return spec.status();
    char* text = nullptr;
    size_t size = 0;
    FILE* out = open_memstream(&text, &size);
    options.out = out;
    options.ps_recovery_timeout = absl::Seconds(30);
    options.worker_recovery_timeout = absl::Seconds(30);
    const std::string json = job.dump();
    absl::StatusOr<FitSummary> summary =
        RunParameterServerJob(*spec, json, "", cluster_, options, Links());
    std::fclose(out);
    output_ = std::string(text, size);
    std::free(text);
    return summary;
  }

  std::string CheckpointDir(const std::string& name) {
    const std::string dir = ::testing::TempDir() + "/ps_training_job_test_" + name;
    std::filesystem::remove_all(dir);
    return dir;
  }

  ClusterSpec cluster_;
  std::vector<std::unique_ptr<FakePs>> ps_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::map<std::string, FakePs*> ps_at_;
  std::map<std::string, FakeWorker*> worker_at_;
  uint64_t next_incarnation_ = 1000;
  std::function<void()> wait_for_ps_;
  int waits_ = 0;
  std::string output_;
};

TEST_F(PsTrainingJobTest, TrainsEveryStepOnceOverItsWorkersAndParameterServers) {
  MakeCluster(/*workers=*/2, /*ps=*/2);
  absl::StatusOr<FitSummary> summary = Run(Job(/*epochs=*/2, /*steps=*/40));
  ASSERT_OK(summary) << output_;
  EXPECT_EQ(summary->steps, 80);
  ASSERT_EQ(summary->history.size(), 2u) << output_;
  EXPECT_EQ(summary->num_workers, 2);
  EXPECT_EQ(summary->num_ps, 2);
  EXPECT_THAT(output_, HasSubstr("Epoch 1/2 - 40 steps on 2 workers"));
  EXPECT_THAT(output_, HasSubstr("Epoch 2/2 - 40 steps on 2 workers"));
  // 16 closures of 5 steps, each run once, shared by both workers.
  EXPECT_EQ(workers_[0]->closures() + workers_[1]->closures(), 16);
  EXPECT_GT(workers_[0]->closures(), 0);
  EXPECT_GT(workers_[1]->closures(), 0);
  // Every step pushed to both PSs once (the balanced placement gives each a variable).
  EXPECT_EQ(ps_[0]->pushes(), 80);
  EXPECT_EQ(ps_[1]->pushes(), 80);
  // 80 steps of Adam from Glorot: better than chance by far.
  EXPECT_GT(summary->test_accuracy, 0.6);
}

TEST_F(PsTrainingJobTest, APsThatRestartsIsReseededFromTheCheckpointAndTrainingGoesOn) {
  MakeCluster(/*workers=*/2, /*ps=*/2);
  const std::string checkpoints = CheckpointDir("restart");
  // ps:1 restarts as a new process at its 33rd push (step 33: the checkpoint of step 30
  // holds what it lost).
  ps_[1]->OnPush([this](int push) {
    if (push == 33) ps_[1]->Restart(NextIncarnation());
  });
  absl::StatusOr<FitSummary> summary = Run(Job(/*epochs=*/2, /*steps=*/40, checkpoints, 10));
  ASSERT_OK(summary) << output_;
  EXPECT_THAT(output_, HasSubstr("a parameter server is unavailable"));
  EXPECT_THAT(output_, HasSubstr("the parameter servers are back: restored the checkpoint at "
                                 "step 30 and training goes on"));
  EXPECT_EQ(summary->steps, 80);
  ASSERT_EQ(summary->history.size(), 2u) << output_;
  // Each epoch reported once, with its steps all counted.
  EXPECT_EQ(summary->history[0].epoch, 1);
  EXPECT_EQ(summary->history[1].epoch, 2);
}

TEST_F(PsTrainingJobTest, APsThatStallsAndAnswersAgainAsTheSameProcessLosesNoStep) {
  MakeCluster(/*workers=*/2, /*ps=*/2);
  const std::string checkpoints = CheckpointDir("stall");
  ps_[0]->OnPush([this](int push) {
    if (push == 23) ps_[0]->Stop();
  });
  wait_for_ps_ = [this] { ps_[0]->Resume(); };
  absl::StatusOr<FitSummary> summary = Run(Job(/*epochs=*/2, /*steps=*/40, checkpoints, 10));
  ASSERT_OK(summary) << output_;
  EXPECT_EQ(waits_, 1);
  EXPECT_THAT(output_, HasSubstr("each the same process as before (none restarted): their "
                                 "variables are intact, so training goes on from step"));
  EXPECT_THAT(output_, Not(HasSubstr("restored the checkpoint")));
  EXPECT_EQ(summary->steps, 80);
  EXPECT_EQ(summary->history.size(), 2u);
}

TEST_F(PsTrainingJobTest, APsThatFailsWithoutACheckpointDirEndsTheJobNamingTheFix) {
  MakeCluster(/*workers=*/2, /*ps=*/2);
  ps_[1]->OnPush([this](int push) {
    if (push == 12) ps_[1]->Stop();
  });
  absl::StatusOr<FitSummary> summary = Run(Job(/*epochs=*/2, /*steps=*/40));
  EXPECT_THAT(summary.status(), StatusIs(absl::StatusCode::kUnavailable,
                                         HasSubstr("set checkpoint.dir, and a parameter server "
                                                   "that comes back is re-seeded")));
  EXPECT_THAT(summary.status().message(), HasSubstr("ps:1"));
  EXPECT_EQ(waits_, 0);  // nothing to re-seed from: not waited for
}

TEST_F(PsTrainingJobTest, ALostWorkersClosuresAreTrainedByTheOthers) {
  MakeCluster(/*workers=*/3, /*ps=*/1);
  workers_[2]->OnClosure([this](int closure) {
    if (closure == 2) workers_[2]->Stop();
  });
  absl::StatusOr<FitSummary> summary = Run(Job(/*epochs=*/2, /*steps=*/40));
  ASSERT_OK(summary) << output_;
  EXPECT_EQ(summary->steps, 80);
  // The closure the lost worker was given is trained again elsewhere: each step once.
  EXPECT_EQ(workers_[2]->closures(), 2);
  EXPECT_EQ(workers_[0]->closures() + workers_[1]->closures(), 16 - 1);
  EXPECT_EQ(ps_[0]->pushes(), 80);
}

}  // namespace
}  // namespace stratum

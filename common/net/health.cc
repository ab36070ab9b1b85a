#include "stratum/net/health.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <future>

#include <grpcpp/client_context.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "proto/health.grpc.pb.h"
#include "proto/task.grpc.pb.h"
#include "stratum/net/channel.h"
#include "stratum/net/host_port.h"

namespace stratum {
namespace {

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

std::string DescribeRpcError(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return "no answer in time";
  std::string message = status.error_message();
  // gRPC's connection errors nest causes ("failed to connect to all addresses; last error:
  // UNKNOWN: ipv4:...: Failed to connect to remote host: Connection refused"); the
  // innermost one says what happened.
  if (size_t cut = message.rfind(": "); cut != std::string::npos) message = message.substr(cut + 2);
  // OpenSSL's words for the two usual TLS mistakes, said plainly.
  if (absl::StrContains(message, "wrong version number")) {
    absl::StrAppend(&message, " (it does not speak TLS: give it the cluster's certificates)");
  } else if (absl::StrContains(message, "certificate verify failed")) {
    absl::StrAppend(&message,
                    " (its certificate is not signed by our CA, or not for the name we check)");
  }
  return message.empty() ? "unavailable" : message;
}

// `wait_for_ready`: wait (up to `timeout`) for a connection instead of failing at once
// when there is none. Waiting calls also drive the connection attempts: a fail-fast call
// while a channel reconnects leaves the attempt to gRPC's backup poller, which looks only
// every 5 s.
absl::Status CheckHealthOn(grpc::health::v1::Health::Stub& stub, absl::Duration timeout,
                           bool wait_for_ready = false) {
  grpc::ClientContext context;
  SetDeadline(context, timeout);
  context.set_wait_for_ready(wait_for_ready);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub.Check(&context, request, &response);
  if (!status.ok()) return absl::UnavailableError(DescribeRpcError(status));
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat(
        "reports ", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())));
  }
  return absl::OkStatus();
}

absl::StatusOr<TaskReport> ReportOn(const std::shared_ptr<grpc::Channel>& channel,
                                    absl::Duration timeout) {
  auto stub = proto::TaskService::NewStub(channel);
  grpc::ClientContext context;
  SetDeadline(context, timeout);
  proto::GetTaskStatusResponse response;
  grpc::Status status = stub->GetTaskStatus(&context, proto::GetTaskStatusRequest(), &response);
  if (!status.ok()) return absl::UnavailableError(DescribeRpcError(status));
  TaskReport report;
  report.task = {response.task_type(), response.task_index()};
  report.healthy = true;
  report.binary = response.binary();
  report.version = response.version();
  report.incarnation = response.incarnation();
  report.uptime_seconds = response.uptime_seconds();
  report.pid = response.pid();
  return report;
}

// Polls one task until it is healthy, the deadline passes or the wait is cancelled.
TaskReport WaitForTask(const TaskKey& task, const std::string& address, absl::Time deadline,
                       const ClusterWaitOptions& options) {
  TaskReport report;
  report.task = task;
  report.address = address;
  std::shared_ptr<grpc::Channel> channel = MakeChannel(address, options.channel);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  report.last_error = "never checked";
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    absl::Status status = CheckHealthOn(*stub, std::min(left, absl::Seconds(1)),
                                        /*wait_for_ready=*/true);
    if (status.ok()) {
      report.healthy = true;
      report.last_error.clear();
      break;
    }
    // A waiting call only says "no answer in time"; a fail-fast one says why.
    absl::Status reason = CheckHealthOn(*stub, absl::Milliseconds(200));
    report.last_error = std::string((reason.ok() ? status : reason).message());
    const absl::Duration pause = std::min(options.poll_interval, deadline - absl::Now());
    if (options.cancel != nullptr ? options.cancel->WaitForNotificationWithTimeout(pause)
                                  : (absl::SleepFor(pause), false)) {
      break;
    }
  }
  if (!report.healthy) return report;
  // The health service answered; who is it? (A task that is not Stratum's may not say.)
  absl::StatusOr<TaskReport> details = ReportOn(channel, absl::Seconds(2));
  if (details.ok()) {
    report.answers_as = details->task;
    report.binary = details->binary;
    report.version = details->version;
    report.incarnation = details->incarnation;
    report.uptime_seconds = details->uptime_seconds;
    report.pid = details->pid;
  }
  return report;
}

}  // namespace

absl::Status CheckHealth(const std::string& address, absl::Duration timeout,
                         const ChannelOptions& channel) {
  auto stub = grpc::health::v1::Health::NewStub(MakeChannel(address, channel));
  return CheckHealthOn(*stub, timeout);
}

bool RefusesConnections(const std::string& address, absl::Duration timeout) {
  const auto [host, port] = SplitHostPort(address);
  if (port.empty()) return false;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int resolved = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  // A name that no longer resolves: its process is gone with it (a deleted pod's record).
  if (resolved == EAI_NONAME) return true;
  if (resolved != 0 || found == nullptr) return false;
  bool refused = false;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd >= 0) {
    if (connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
      if (errno == EINPROGRESS) {
        pollfd poll_fd{fd, POLLOUT, 0};
        if (poll(&poll_fd, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1) {
          int error = 0;
          socklen_t length = sizeof(error);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
          refused = error == ECONNREFUSED;
        }
      } else {
        refused = errno == ECONNREFUSED;
      }
    }
    close(fd);
  }
  freeaddrinfo(found);
  return refused;
}

absl::StatusOr<TaskReport> GetTaskReport(const std::string& address, absl::Duration timeout,
                                         const ChannelOptions& channel) {
  absl::StatusOr<TaskReport> report = ReportOn(MakeChannel(address, channel), timeout);
  if (report.ok()) report->address = address;
  return report;
}

absl::StatusOr<std::vector<TaskReport>> WaitForClusterHealthy(const ClusterSpec& spec,
                                                              const ClusterWaitOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  std::vector<std::future<TaskReport>> pending;
  for (const TaskKey& task : spec.AllTasks()) {
    const std::string address = *spec.TaskAddress(task.type, task.index);
    pending.push_back(std::async(std::launch::async, [task, address, deadline, &options] {
      return WaitForTask(task, address, deadline, options);
    }));
  }
  std::vector<TaskReport> reports;
  for (auto& report : pending) reports.push_back(report.get());

  if (options.cancel != nullptr && options.cancel->HasBeenNotified()) {
    return absl::CancelledError("stopped while waiting for the cluster to become healthy");
  }
  std::vector<std::string> missing;
  for (const TaskReport& report : reports) {
    const bool optional = std::find(options.optional_jobs.begin(), options.optional_jobs.end(),
                                    report.task.type) != options.optional_jobs.end();
    if (!report.healthy && !optional) {
      missing.push_back(absl::StrCat(report.task.ToString(), " at ", report.address, " (",
                                     report.last_error, ")"));
    }
  }
  // An address that leads to another task (a typo in TF_CONFIG, a port given twice) would
  // fail later with an error that names neither.
  std::vector<std::string> misplaced;
  for (const TaskReport& report : reports) {
    if (!report.healthy || report.answers_as.type.empty() || report.answers_as == report.task) {
      continue;
    }
    misplaced.push_back(absl::StrCat(report.task.ToString(), " at ", report.address, " answers as ",
                                     report.answers_as.ToString(), " (", report.binary, ", pid ",
                                     report.pid, ")"));
  }
  if (!misplaced.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cluster spec gives tasks the addresses of others: ", absl::StrJoin(misplaced, "; "),
        "; give each task its own address in TF_CONFIG, the one it serves on"));
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(
        missing.size(), missing.size() == 1 ? " task" : " tasks", " never answered within ",
        absl::FormatDuration(options.timeout), ": ", absl::StrJoin(missing, ", "),
        "; check that each is running and reachable at that address, or raise ",
        options.timeout_flag));
  }
  return reports;
}

std::string FormatClusterTable(const std::vector<TaskReport>& reports) {
  std::vector<std::vector<std::string>> rows = {
      {"TASK", "ADDRESS", "STATE", "BINARY", "PID", "INCARNATION", "UPTIME", "VERSION"}};
  for (const TaskReport& report : reports) {
    rows.push_back({report.task.ToString(), report.address,
                    report.healthy ? "SERVING" : "NOT ANSWERING",
                    report.binary.empty() ? "-" : report.binary,
                    report.pid == 0 ? "-" : absl::StrCat(report.pid),
                    report.incarnation == 0 ? "-" : absl::StrFormat("%016x", report.incarnation),
                    report.healthy ? absl::StrFormat("%.1fs", report.uptime_seconds) : "-",
                    report.version.empty() ? "-" : report.version});
  }
  std::vector<size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string table;
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&table, row[i]);
      if (i + 1 < row.size()) table.append(widths[i] - row[i].size() + 2, ' ');
    }
    table.push_back('\n');
  }
  return table;
}

}  // namespace stratum

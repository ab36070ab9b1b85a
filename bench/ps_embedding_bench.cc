// The parameter servers' sparse data path: W worker processes train a logistic model over
// the rows of one embedding table (ROWS x DIM float32, split in P row shards over P real
// stratum-ps processes, Adagrad lr 0.05 with initial accumulator 0.1), each step drawing
// BATCH examples of FIELDS Zipf(1.1) ids, pulling the unique rows they read and pushing their
// row gradients. The same work as PyTorch's RPC anchor
// (shared/peers/ps_embedding_torch_rpc.py), run side by side: examples/s, unique rows/s and
// pulled+pushed MB/s, and the ratio against the anchor (goal: at least 3x, with 1 worker
// and with 2 workers over 2 PSs).
//
// Stratum's workers do what a PS-job worker does (worker/worker_service.cc): each push also
// brings back the rows the next batch reads (one round trip per step, where the anchor
// makes two). Ids are spread over the table by a fixed odd multiplier (a bijection on the
// table's 2^k rows) so that Zipf's hot ids do not all land in the first shard; the anchor
// spreads them by taking rows modulo P.
//
//   build/bin/ps_embedding_bench [--seconds=5] [--rows=2097152] [--dim=32] [--batch=512]
//                                [--fields=26] [--ps=2] [--workers=1,2] [--anchors=true]
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "nlohmann/json.hpp"
#include "stratum/ps/sharded_variables.h"
#include "stratum/testing/local_cluster.h"
#include "stratum/util/flags.h"

ABSL_FLAG(double, seconds, 5, "Seconds per measurement");
ABSL_FLAG(int64_t, rows, int64_t{1} << 21, "Rows of the table (a power of two)");
ABSL_FLAG(int64_t, dim, 32, "Floats per row");
ABSL_FLAG(int64_t, batch, 512, "Examples per step");
ABSL_FLAG(int64_t, fields, 26, "Ids per example");
ABSL_FLAG(int, ps, 2, "Parameter servers");
ABSL_FLAG(std::vector<std::string>, workers, std::vector<std::string>({"1", "2"}),
          "Worker counts to measure");
ABSL_FLAG(bool, anchors, true, "Measure the PyTorch anchor beside each");
ABSL_FLAG(std::string, peers_dir, STRATUM_SOURCE_DIR "/../shared/peers", "Anchor programs");
ABSL_FLAG(std::string, worker_addresses, "", "Internal: run as one worker against these PSs");
ABSL_FLAG(int, worker_index, 0, "Internal: the worker's index (its random seed)");

namespace stratum {
namespace {

const nlohmann::json kAdagrad = nlohmann::json::parse(
    R"({"class_name": "Adagrad", "config": {"learning_rate": 0.05, "initial_accumulator_value": 0.1}})");

// The table's shards: rows split like `div` (the first rows % P shards one row longer), one
// per PS, as a FixedShards(P) partitioner places them.
std::unique_ptr<ShardedVariables> Table(const std::vector<std::string>& addresses, int64_t rows,
                                        int64_t dim) {
  const auto ps = static_cast<int64_t>(addresses.size());
  std::vector<ShardSpec> shards;
  std::vector<std::unique_ptr<PsClient>> clients;
  int64_t first = 0;
  for (int64_t p = 0; p < ps; ++p) {
    const int64_t count = rows / ps + (p < rows % ps ? 1 : 0);
    shards.push_back({.name = absl::StrCat("table/part_", p),
                      .variable = "table",
                      .shard_index = static_cast<int>(p),
                      .num_shards = static_cast<int>(ps),
                      .first_row = first,
                      .shape = Shape({count, dim}),
                      .ps_task = static_cast<int>(p)});
    first += count;
    clients.push_back(
        std::make_unique<PsClient>(absl::StrCat("ps:", p), addresses[static_cast<size_t>(p)]));
  }
  return std::make_unique<ShardedVariables>(std::vector<std::string>{"table"},
                                            std::vector<Shape>{Shape({rows, dim})},
                                            std::move(shards), std::move(clients));
}

// numpy's Generator.zipf(a): Devroye's rejection method, values >= 1.
int64_t Zipf(std::mt19937_64& rng, double a) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const double am1 = a - 1.0, b = std::pow(2.0, am1);
  while (true) {
    const double u = 1.0 - uniform(rng), v = uniform(rng);
    const double x = std::floor(std::pow(u, -1.0 / am1));
    if (x < 1.0 || x > 9.2e18) continue;
    const double t = std::pow(1.0 + 1.0 / x, am1);
    if (v * x * (t - 1.0) / (b - 1.0) <= t / b) return static_cast<int64_t>(x);
  }
}

// One step's examples: the ids' rows, the unique rows (sorted), each id's position among
// them, and the labels (the parity of each example's first id).
struct Batch {
  std::vector<int64_t> unique;
  std::vector<int32_t> position;  // [batch * fields]
  std::vector<float> labels;
};

Batch Draw(std::mt19937_64& rng, int64_t batch, int64_t fields, int64_t rows) {
  Batch out;
  const int64_t count = batch * fields;
  // (row << 32 | position) keys, sorted once: the unique rows and every id's place among
  // them in one pass over them, as np.unique(return_inverse=True) gives them.
  std::vector<uint64_t> keys(static_cast<size_t>(count));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t f = 0; f < fields; ++f) {
      const int64_t id = (Zipf(rng, 1.1) - 1) % rows;
      if (f == 0) out.labels.push_back(static_cast<float>(id % 2));
      // An odd multiplier permutes the 2^k rows: hot ids spread over the shards.
      const uint64_t row =
          (static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) & static_cast<uint64_t>(rows - 1);
      keys[static_cast<size_t>(b * fields + f)] = row << 32 | static_cast<uint64_t>(b * fields + f);
    }
  }
  std::sort(keys.begin(), keys.end());
  out.position.resize(keys.size());
  for (uint64_t key : keys) {
    const auto row = static_cast<int64_t>(key >> 32);
    if (out.unique.empty() || out.unique.back() != row) out.unique.push_back(row);
    out.position[key & 0xffffffffu] = static_cast<int32_t>(out.unique.size() - 1);
  }
  return out;
}

// One worker: steps for `seconds`, then {"examples", "rows", "seconds"} on stdout.
int RunWorker() {
  const std::vector<std::string> addresses =
      absl::StrSplit(absl::GetFlag(FLAGS_worker_addresses), ',');
  const int64_t rows = absl::GetFlag(FLAGS_rows), dim = absl::GetFlag(FLAGS_dim),
                batch = absl::GetFlag(FLAGS_batch), fields = absl::GetFlag(FLAGS_fields);
  std::unique_ptr<ShardedVariables> table = Table(addresses, rows, dim);
  std::mt19937_64 rng(static_cast<uint64_t>(absl::GetFlag(FLAGS_worker_index)) + 1);
  Batch step = Draw(rng, batch, fields, rows);
  absl::StatusOr<std::vector<Tensor>> pulled = table->Pull({&step.unique});
  if (!pulled.ok()) {
    std::fprintf(stderr, "%s\n", std::string(pulled.status().message()).c_str());
    return 1;
  }
  std::vector<Tensor> values = *std::move(pulled);
  int64_t examples = 0, unique_rows = 0;
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(absl::GetFlag(FLAGS_seconds))) {
    // Logistic regression on the sum of each example's rows' first element.
    const float* v = values[0].data<float>();
    Tensor gradient(DType::kFloat32, Shape({static_cast<int64_t>(step.unique.size()), dim}));
    gradient.SetZero();
    float* g = gradient.data<float>();
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t* at = step.position.data() + b * fields;
      float logit = 0;
      for (int64_t f = 0; f < fields; ++f) logit += v[at[f] * dim];
      const float d = (1.0f / (1.0f + std::exp(-logit)) - step.labels[static_cast<size_t>(b)]) /
                      static_cast<float>(batch);
      for (int64_t f = 0; f < fields; ++f) g[at[f] * dim] += d;
    }
    Batch next = Draw(rng, batch, fields, rows);
    if (absl::Status status = table->Push({gradient}, &values, {&step.unique}, {&next.unique});
        !status.ok()) {
      std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
      return 1;
    }
    examples += batch;
    unique_rows += static_cast<int64_t>(step.unique.size());
    step = std::move(next);
  }
  std::printf("%s\n", nlohmann::json({{"examples", examples},
                                      {"rows", unique_rows},
                                      {"seconds", absl::ToDoubleSeconds(absl::Now() - start)}})
                          .dump()
                          .c_str());
  return 0;
}

struct Rates {
  double examples_per_s = 0;
  double rows_per_s = 0;
};

absl::StatusOr<Rates> MeasureStratum(const std::vector<std::string>& addresses, int workers) {
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::vector<std::unique_ptr<Subprocess>> processes;
  for (int w = 0; w < workers; ++w) {
    SubprocessOptions options;
    options.argv = {std::string(self, static_cast<size_t>(std::max<ssize_t>(length, 0))),
                    "--worker_addresses=" + absl::StrJoin(addresses, ","),
                    absl::StrCat("--worker_index=", w),
                    absl::StrCat("--seconds=", absl::GetFlag(FLAGS_seconds)),
                    absl::StrCat("--rows=", absl::GetFlag(FLAGS_rows)),
                    absl::StrCat("--dim=", absl::GetFlag(FLAGS_dim)),
                    absl::StrCat("--batch=", absl::GetFlag(FLAGS_batch)),
                    absl::StrCat("--fields=", absl::GetFlag(FLAGS_fields))};
    options.forward_fd = -1;
    options.capture_output = true;
    auto process = Subprocess::Spawn(std::move(options));
    if (!process.ok()) return process.status();
    processes.push_back(*std::move(process));
  }
  Rates rates;
  for (auto& process : processes) {
    auto exit = process->Wait(absl::Seconds(absl::GetFlag(FLAGS_seconds) + 120));
    if (!exit.ok() || !exit->success()) {
      return absl::InternalError(absl::StrCat("a worker failed: ", process->output()));
    }
    const nlohmann::json result = bench::LastJsonLine(process->output());
    if (!result.is_object()) {
      return absl::InternalError(absl::StrCat("a worker printed no result: ", process->output()));
    }
    const double seconds = result["seconds"].get<double>();
    rates.examples_per_s += result["examples"].get<double>() / seconds;
    rates.rows_per_s += result["rows"].get<double>() / seconds;
  }
  return rates;
}

Rates MeasureTorch(int workers) {
  absl::StatusOr<std::string> output = bench::RunProgram(
      {"/usr/bin/python3", absl::GetFlag(FLAGS_peers_dir) + "/ps_embedding_torch_rpc.py",
       std::to_string(workers), std::to_string(absl::GetFlag(FLAGS_ps)),
       std::to_string(absl::GetFlag(FLAGS_rows)), std::to_string(absl::GetFlag(FLAGS_dim)),
       std::to_string(absl::GetFlag(FLAGS_batch)), std::to_string(absl::GetFlag(FLAGS_fields)),
       absl::StrCat(absl::GetFlag(FLAGS_seconds))},
      absl::Minutes(5));
  Rates rates;
  if (!output.ok()) {
    std::fprintf(stderr, "ps_embedding_bench: the anchor failed: %s\n",
                 std::string(output.status().message()).c_str());
    return rates;
  }
  static const std::regex kExamples(R"(examples_per_s=([0-9.]+))"),
      kRows(R"(unique_rows_per_s=([0-9.]+))");
  std::smatch match;
  if (std::regex_search(*output, match, kExamples)) rates.examples_per_s = std::stod(match[1]);
  if (std::regex_search(*output, match, kRows)) rates.rows_per_s = std::stod(match[1]);
  return rates;
}

int Run() {
  const int ps = absl::GetFlag(FLAGS_ps);
  const int64_t rows = absl::GetFlag(FLAGS_rows), dim = absl::GetFlag(FLAGS_dim);
  if (rows <= 0 || (rows & (rows - 1)) != 0) {
    std::fprintf(stderr, "ps_embedding_bench: --rows must be a power of two\n");
    return 2;
  }
  auto cluster = testing::LocalCluster::Start(
      {.num_workers = 1, .num_ps = ps, .not_started = {{"worker", 0}}, .forward_output = false});
  if (!cluster.ok()) {
    std::fprintf(stderr, "ps_embedding_bench: %s\n",
                 std::string(cluster.status().message()).c_str());
    return 1;
  }
  std::vector<std::string> addresses;
  for (int p = 0; p < ps; ++p) addresses.push_back((*cluster)->Address({"ps", p}));
  const std::string setup =
      absl::StrCat(rows, " x ", dim, " float32 table in ", ps, " shards on ", ps,
                   " stratum-ps, Adagrad, batch ", absl::GetFlag(FLAGS_batch), " x ",
                   absl::GetFlag(FLAGS_fields), " Zipf(1.1) ids, this host's loopback");
  for (const std::string& count : absl::GetFlag(FLAGS_workers)) {
    const int workers = std::stoi(count);
    // A fresh table for each measurement, as the anchor starts afresh.
    std::unique_ptr<ShardedVariables> table = Table(addresses, rows, dim);
    Tensor initial(DType::kFloat32, Shape({rows, dim}));
    std::mt19937 init(7);
    std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
    for (int64_t i = 0; i < initial.num_elements(); ++i) initial.data<float>()[i] = uniform(init);
    if (absl::Status created = table->Create({initial}, std::vector<nlohmann::json>{kAdagrad});
        !created.ok()) {
      std::fprintf(stderr, "ps_embedding_bench: %s\n", std::string(created.message()).c_str());
      return 1;
    }
    const Rates torch = absl::GetFlag(FLAGS_anchors) ? MeasureTorch(workers) : Rates{};
    absl::StatusOr<Rates> ours = MeasureStratum(addresses, workers);
    if (!ours.ok()) {
      std::fprintf(stderr, "ps_embedding_bench: %s\n",
                   std::string(ours.status().message()).c_str());
      return 1;
    }
    const std::string where = absl::StrCat(workers, "w_", ps, "ps");
    const double mb = ours->rows_per_s * static_cast<double>(dim) * 4 * 2 / 1e6;
    bench::PrintFigure("ps_embedding_examples_per_s_" + where, ours->examples_per_s, "examples/s",
                       nullptr, "", setup);
    bench::PrintFigure("ps_embedding_unique_rows_per_s_" + where, ours->rows_per_s, "rows/s",
                       nullptr, "", setup);
    bench::PrintFigure("ps_embedding_pull_push_mb_per_s_" + where, mb, "MB/s", nullptr, "", setup);
    if (torch.examples_per_s > 0) {
      bench::PrintFigure("torch_rpc_embedding_examples_per_s_" + where, torch.examples_per_s,
                         "examples/s", nullptr, "", setup);
      bench::PrintFigure("ps_embedding_vs_torch_rpc_" + where,
                         ours->examples_per_s / torch.examples_per_s, "x PyTorch RPC", 3.0,
                         "at_least", setup);
    }
  }
  return 0;
}

}  // namespace
}  // namespace stratum

int main(int argc, char** argv) {
  stratum::ParseFlagsOrExit(
      argc, argv, "ps_embedding_bench: sparse embedding rows over parameter servers, as JSON");
  if (!absl::GetFlag(FLAGS_worker_addresses).empty()) return stratum::RunWorker();
  return stratum::Run();
}

#include "stratum/data/record_files.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "dataset_graph.h"
#include "spdlog/spdlog.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using data_internal::DatasetGraph;
using data_internal::DatasetNode;
using data_internal::NodePtr;

// ---- TFRecord of tf.Example ----

class TFRecordExampleReader : public ExampleReader {
 public:
  TFRecordExampleReader(std::unique_ptr<TFRecordReader> records,
                        std::shared_ptr<const ExampleParser> parser)
      : records_(std::move(records)), parser_(std::move(parser)) {}

  absl::StatusOr<std::optional<Element>> Next() override {
    STRATUM_ASSIGN_OR_RETURN(const std::optional<absl::string_view> record, records_->Next());
    if (!record) return std::nullopt;
    Element element;
    element.reserve(parser_->specs().size());
    const absl::Status parsed = parser_->Parse(*record, element);
    if (!parsed.ok()) {
      return absl::Status(parsed.code(),
                          absl::StrCat(records_->path(), ": the record at byte offset ",
                                       records_->record_offset(), ": ", parsed.message()));
    }
    return element;
  }

 private:
  std::unique_ptr<TFRecordReader> records_;
  std::shared_ptr<const ExampleParser> parser_;
};

class TFRecordExampleFormat : public RecordFormat {
 public:
  TFRecordExampleFormat(Compression compression, std::vector<FeatureSpec> features)
      : compression_(compression),
        parser_(std::make_shared<const ExampleParser>(std::move(features))) {}

  absl::StatusOr<std::unique_ptr<ExampleReader>> Open(const std::string& path) const override {
    STRATUM_ASSIGN_OR_RETURN(auto records, TFRecordReader::Open(path, compression_));
    return std::make_unique<TFRecordExampleReader>(std::move(records), parser_);
  }
  absl::StatusOr<int64_t> Count(const std::string& path) const override {
    return CountTFRecords(path, compression_);
  }
  std::string Name() const override {
    return compression_ == Compression::kNone
               ? "TFRecord"
               : absl::StrCat("TFRecord (", CompressionName(compression_), ")");
  }

 private:
  Compression compression_;
  std::shared_ptr<const ExampleParser> parser_;
};

// ---- the source node ----

class RecordFilesNode : public DatasetNode {
 public:
  RecordFilesNode(std::vector<std::string> files, std::shared_ptr<const RecordFormat> format,
                  ReadOptions options)
      : DatasetNode(nullptr),
        files_(std::move(files)),
        format_(std::move(format)),
        options_(std::move(options)) {}

  std::unique_ptr<Iterator> MakeIterator() const override;
  int64_t Cardinality() const override {
    if (options_.record_counts.size() != files_.size()) return kUnknownCardinality;
    int64_t total = 0;
    for (int64_t count : options_.record_counts) total += count;
    return total;
  }
  std::string Name() const override {
    return absl::StrCat(format_->Name(), "(", files_.size(),
                        files_.size() == 1 ? " file)" : " files)");
  }
  NodePtr WithInput(NodePtr) const override { return nullptr; }
  std::vector<std::string> SourceFiles() const override { return files_; }
  int64_t NumFileUnits() const override { return static_cast<int64_t>(files_.size()); }
  NodePtr ShardFiles(int64_t num_shards, int64_t index) const override {
    std::vector<std::string> kept;
    ReadOptions options = options_;
    options.record_counts.clear();
    const bool counted = options_.record_counts.size() == files_.size();
    for (size_t i = static_cast<size_t>(index); i < files_.size();
         i += static_cast<size_t>(num_shards)) {
      kept.push_back(files_[i]);
      if (counted) options.record_counts.push_back(options_.record_counts[i]);
    }
    return std::make_shared<RecordFilesNode>(std::move(kept), format_, std::move(options));
  }

  const std::vector<std::string>& files() const { return files_; }
  const RecordFormat& format() const { return *format_; }
  const ReadOptions& options() const { return options_; }

 private:
  std::vector<std::string> files_;
  std::shared_ptr<const RecordFormat> format_;
  ReadOptions options_;
};

using NextExample = absl::StatusOr<std::optional<Element>>;

// One open file of the cycle: read in the caller's thread, or ahead on a thread of its own
// into a bounded queue (the thread also opens the file, so slow opens overlap too).
class Slot {
 public:
  Slot(const RecordFormat& format, std::string path, bool threaded, size_t read_ahead)
      : format_(format), path_(std::move(path)), capacity_(std::max<size_t>(read_ahead, 1)) {
    if (threaded) thread_ = std::thread([this] { ReadAhead(); });
  }
  ~Slot() {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;

  const std::string& path() const { return path_; }

  // Whether Next() would return at once.
  bool Ready() {
    if (!thread_.joinable()) return true;
    absl::MutexLock lock(&mu_);
    return !queue_.empty();
  }

  // The file's next example, its end (nullopt) or its error; nothing after those.
  NextExample Next() {
    if (!thread_.joinable()) return ReadOne();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::deque<NextExample>* queue) { return !queue->empty(); }, &queue_));
    NextExample next = std::move(queue_.front());
    queue_.pop_front();
    return next;
  }

 private:
  NextExample ReadOne() {
    if (!reader_) {
      absl::StatusOr<std::unique_ptr<ExampleReader>> opened = format_.Open(path_);
      if (!opened.ok()) return opened.status();
      reader_ = *std::move(opened);
    }
    try {
      return reader_->Next();
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path_, ": out of memory while reading an example"));
    }
  }

  void ReadAhead() {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return cancelled_ || queue_.size() < capacity_;
        };
        mu_.Await(absl::Condition(&room));
        if (cancelled_) return;
      }
      NextExample next = ReadOne();
      const bool last = !next.ok() || !next->has_value();
      {
        absl::MutexLock lock(&mu_);
        queue_.push_back(std::move(next));
      }
      if (last) return;
    }
  }

  const RecordFormat& format_;
  const std::string path_;
  const size_t capacity_;
  std::unique_ptr<ExampleReader> reader_;  // used by one thread only: the reader's or ours
  absl::Mutex mu_;
  std::deque<NextExample> queue_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class RecordFilesIterator : public Iterator {
 public:
  explicit RecordFilesIterator(std::shared_ptr<const RecordFilesNode> node)
      : node_(std::move(node)),
        options_(node_->options()),
        cycle_(static_cast<size_t>(std::max(1, options_.cycle_length))) {}

 protected:
  NextExample GetNextInternal() override {
    const std::vector<std::string>& files = node_->files();
    while (true) {
      if (active_ == 0 && next_file_ >= files.size()) return std::nullopt;
      std::unique_ptr<Slot>& slot = cycle_[current_];
      if (!slot) {
        if (next_file_ < files.size()) {
          slot = std::make_unique<Slot>(node_->format(), files[next_file_++],
                                        options_.num_parallel_reads > 1,
                                        static_cast<size_t>(options_.read_ahead));
          ++active_;
          block_taken_ = 0;
        } else {
          Advance();
        }
        continue;
      }
      Slot* from = slot.get();
      size_t at = current_;
      if (!options_.deterministic && !from->Ready()) {
        // Pass over a slot still reading for one with an example ready.
        for (size_t k = 1; k < cycle_.size(); ++k) {
          const size_t other = (current_ + k) % cycle_.size();
          if (cycle_[other] && cycle_[other]->Ready()) {
            from = cycle_[other].get();
            at = other;
            break;
          }
        }
      }
      NextExample next = from->Next();
      if (!next.ok()) {
        if (!options_.ignore_errors) return next.status();
        spdlog::warn("ignore_errors: {} (the rest of {} is skipped)",
                     std::string(next.status().message()), from->path());
        next = std::optional<Element>();
      }
      if (!next->has_value()) {
        cycle_[at].reset();
        --active_;
        if (at == current_) Advance();
        continue;
      }
      if (at == current_ && ++block_taken_ >= options_.block_length) Advance();
      return std::move(*next);
    }
  }

 private:
  void Advance() {
    current_ = (current_ + 1) % cycle_.size();
    block_taken_ = 0;
  }

  std::shared_ptr<const RecordFilesNode> node_;
  const ReadOptions& options_;
  std::vector<std::unique_ptr<Slot>> cycle_;
  size_t current_ = 0;
  size_t next_file_ = 0;
  int active_ = 0;
  int block_taken_ = 0;
};

std::unique_ptr<Iterator> RecordFilesNode::MakeIterator() const {
  return std::make_unique<RecordFilesIterator>(Self<RecordFilesNode>());
}

bool IsRemote(absl::string_view path) { return absl::StrContains(path, "://"); }

}  // namespace

std::shared_ptr<const RecordFormat> TFRecordExamples(Compression compression,
                                                     std::vector<FeatureSpec> features) {
  return std::make_shared<const TFRecordExampleFormat>(compression, std::move(features));
}

Dataset RecordFilesDataset(std::vector<std::string> files,
                           std::shared_ptr<const RecordFormat> format, ReadOptions options) {
  if (files.empty() || format == nullptr) {
    return DatasetGraph::Fail(
        absl::InvalidArgumentError("RecordFilesDataset: no files given: pass at least one file"));
  }
  if (!options.record_counts.empty() && options.record_counts.size() != files.size()) {
    return DatasetGraph::Fail(absl::InvalidArgumentError(
        absl::StrCat("RecordFilesDataset: ", options.record_counts.size(), " record counts for ",
                     files.size(), " files: give one count per file, or none")));
  }
  if (options.cycle_length < 1 || options.block_length < 1 || options.num_parallel_reads < 1 ||
      options.read_ahead < 1) {
    return DatasetGraph::Fail(absl::InvalidArgumentError(
        "RecordFilesDataset: cycle_length, block_length, num_parallel_reads and read_ahead must "
        "be at least 1"));
  }
  // TFRecordDataset(num_parallel_reads=N) interleaves N files.
  if (options.num_parallel_reads > 1 && options.cycle_length == 1) {
    options.cycle_length = options.num_parallel_reads;
  }
  return DatasetGraph::Wrap(
      std::make_shared<RecordFilesNode>(std::move(files), std::move(format), std::move(options)));
}

namespace {

// The examples an iterator with ignore_errors reads of `path`: those before its first error.
absl::StatusOr<int64_t> CountUpToAnError(const RecordFormat& format, const std::string& path) {
  absl::StatusOr<std::unique_ptr<ExampleReader>> reader = format.Open(path);
  int64_t count = 0;
  absl::Status error = reader.status();
  while (error.ok()) {
    absl::StatusOr<std::optional<Element>> next = (*reader)->Next();
    if (!next.ok()) {
      error = next.status();
    } else if (!next->has_value()) {
      return count;
    } else {
      ++count;
    }
  }
  spdlog::warn("ignore_errors: {} (the {} examples before it are read)",
               std::string(error.message()), count);
  return count;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> CountRecords(const std::vector<std::string>& files,
                                                  const RecordFormat& format, int threads,
                                                  bool ignore_errors) {
  std::vector<absl::StatusOr<int64_t>> counts(files.size(), int64_t{0});
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < files.size(); i = next++) {
      try {
        counts[i] = ignore_errors ? CountUpToAnError(format, files[i]) : format.Count(files[i]);
      } catch (const std::exception& e) {  // an allocation: nothing may escape a thread
        counts[i] = absl::ResourceExhaustedError(
            absl::StrCat("cannot count the examples of ", files[i], ": ", e.what()));
      }
    }
  };
  std::vector<std::thread> pool;
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(1, threads)), files.size());
  for (size_t t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  std::vector<int64_t> out;
  out.reserve(files.size());
  for (absl::StatusOr<int64_t>& count : counts) {
    if (!count.ok()) return count.status();
    out.push_back(*count);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ResolveDataFiles(const std::vector<std::string>& entries,
                                                          absl::string_view base_dir,
                                                          absl::string_view field) {
  if (entries.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " names no files: give a list of paths or glob patterns"));
  }
  std::vector<std::string> files;
  for (const std::string& entry : entries) {
    if (IsRemote(entry)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " names \"", entry,
          "\", a remote path: Stratum reads local and mounted files only; copy the data to a "
          "local disk or mount the bucket (e.g. with gcsfuse or s3fs) and give that path"));
    }
    const std::string path = entry.empty() || entry[0] == '/' || base_dir.empty()
                                 ? entry
                                 : absl::StrCat(base_dir, "/", entry);
    if (path.find_first_of("*?[") == std::string::npos) {
      struct stat info {};
      if (::stat(path.c_str(), &info) != 0) {
        return absl::NotFoundError(
            absl::StrCat(field, " names ", path, ", which does not exist: check the path"));
      }
      files.push_back(path);
      continue;
    }
    glob_t matches{};
    const int rc = ::glob(path.c_str(), GLOB_ERR, nullptr, &matches);
    if (rc != 0) {
      globfree(&matches);
      return absl::NotFoundError(
          absl::StrCat(field, " pattern ", path, " matches no file: check the folder and pattern"));
    }
    std::vector<std::string> matched(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
    globfree(&matches);
    std::sort(matched.begin(), matched.end());
    files.insert(files.end(), matched.begin(), matched.end());
  }
  return files;
}

}  // namespace stratum

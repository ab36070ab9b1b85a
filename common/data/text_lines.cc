#include "stratum/data/text_lines.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "input_stream.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using data_internal::InputStream;

// Splits a stream into lines, through a block buffer.
class LineReader {
 public:
  explicit LineReader(std::unique_ptr<InputStream> stream)
      : stream_(std::move(stream)), buffer_(1 << 18, '\0') {}

  const std::string& path() const { return stream_->path(); }
  // The 1-based number of the line Next() returned last.
  int64_t line() const { return line_; }

  // The next line into `out`, without its '\n' or the '\r' before it; false at the end.
  absl::StatusOr<bool> Next(std::string& out) {
    out.clear();
    bool any = false;
    while (true) {
      if (begin_ == end_) {
        STRATUM_ASSIGN_OR_RETURN(const size_t got, stream_->Read(buffer_.data(), buffer_.size()));
        begin_ = 0;
        end_ = got;
        if (got == 0) {
          if (any) ++line_;
          return any;
        }
      }
      any = true;
      const char* start = buffer_.data() + begin_;
      const auto* newline = static_cast<const char*>(std::memchr(start, '\n', end_ - begin_));
      if (newline == nullptr) {
        out.append(start, end_ - begin_);
        begin_ = end_;
        continue;
      }
      out.append(start, static_cast<size_t>(newline - start));
      begin_ += static_cast<size_t>(newline - start) + 1;
      if (!out.empty() && out.back() == '\r') out.pop_back();
      ++line_;
      return true;
    }
  }

 private:
  std::unique_ptr<InputStream> stream_;
  std::string buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
  int64_t line_ = 0;
};

class TextLineReader : public ExampleReader {
 public:
  TextLineReader(std::unique_ptr<LineReader> lines, const TextLineOptions& options, int64_t label)
      : lines_(std::move(lines)), options_(options), label_(label) {}

  absl::StatusOr<std::optional<Element>> Next() override {
    STRATUM_ASSIGN_OR_RETURN(const bool more, lines_->Next(line_));
    if (!more) return std::nullopt;
    Tensor x(DType::kFloat32, Shape({options_.length}));
    options_.vectorizer->Vectorize(line_, options_.length, x.data<float>());
    Tensor y(DType::kInt64, Shape({}));
    *y.data<int64_t>() = label_;
    Element element;
    element.reserve(2);
    element.push_back(std::move(x));
    element.push_back(std::move(y));
    return element;
  }

 private:
  std::unique_ptr<LineReader> lines_;
  const TextLineOptions& options_;
  int64_t label_;
  std::string line_;
};

class TextLineFormat : public RecordFormat {
 public:
  explicit TextLineFormat(TextLineOptions options) : options_(std::move(options)) {}

  absl::StatusOr<std::unique_ptr<ExampleReader>> Open(const std::string& path) const override {
    const auto label = options_.labels.find(path);
    if (label == options_.labels.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " has no label: name it in the source's files"));
    }
    STRATUM_ASSIGN_OR_RETURN(auto stream, InputStream::Open(path, options_.compression));
    return std::make_unique<TextLineReader>(std::make_unique<LineReader>(std::move(stream)),
                                            options_, label->second);
  }
  absl::StatusOr<int64_t> Count(const std::string& path) const override {
    return CountTextLines(path, options_.compression);
  }
  std::string Name() const override {
    return options_.compression == Compression::kNone
               ? "text lines"
               : absl::StrCat("text lines (", CompressionName(options_.compression), ")");
  }

 private:
  TextLineOptions options_;
};

}  // namespace

std::shared_ptr<const RecordFormat> TextLines(TextLineOptions options) {
  return std::make_shared<TextLineFormat>(std::move(options));
}

absl::StatusOr<int64_t> CountTextLines(const std::string& path, Compression compression) {
  STRATUM_ASSIGN_OR_RETURN(auto stream, InputStream::Open(path, compression));
  std::string buffer(1 << 18, '\0');
  int64_t lines = 0;
  bool open_line = false;  // bytes read since the last '\n'
  while (true) {
    STRATUM_ASSIGN_OR_RETURN(const size_t got, stream->Read(buffer.data(), buffer.size()));
    if (got == 0) return lines + (open_line ? 1 : 0);
    const auto newlines = std::count(buffer.data(), buffer.data() + got, '\n');
    lines += newlines;
    open_line = buffer[got - 1] != '\n';
  }
}

}  // namespace stratum

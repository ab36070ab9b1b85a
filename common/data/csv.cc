#include "stratum/data/csv.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "input_stream.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using data_internal::InputStream;
using Type = CsvColumnDefault::Type;

constexpr int kInferenceRows = 100;  // make_csv_dataset's num_rows_for_inference

// Splits a CSV stream into records of fields (RFC 4180 quoting when `quotes`).
class CsvTokenizer {
 public:
  CsvTokenizer(std::unique_ptr<InputStream> stream, char delim, bool quotes)
      : stream_(std::move(stream)), delim_(delim), quotes_(quotes), buffer_(1 << 18, '\0') {}

  const std::string& path() const { return stream_->path(); }
  int64_t line() const { return record_line_; }

  // The next record's fields; false at the end. Blank lines are skipped.
  absl::StatusOr<bool> Next(std::vector<std::string>& fields) {
    while (true) {
      record_line_ = line_;
      size_t count = 0;
      auto field = [&]() -> std::string& {
        if (fields.size() <= count) fields.emplace_back();
        std::string& f = fields[count++];
        f.clear();
        return f;
      };
      int c = Get();
      if (c < 0) {
        if (!status_.ok()) return status_;
        return false;
      }
      if (c == '\n') {
        ++line_;
        continue;
      }
      if (c == '\r') continue;
      std::string* current = &field();
      bool at_field_start = true;
      while (true) {
        if (c < 0) {
          if (!status_.ok()) return status_;
          break;
        }
        if (quotes_ && at_field_start && c == '"') {
          // A quoted field: up to the closing quote; "" is a quote.
          while (true) {
            c = Get();
            if (c < 0) {
              if (!status_.ok()) return status_;
              return absl::InvalidArgumentError(
                  absl::StrCat(path(), " line ", record_line_,
                               ": a quoted field is not closed before the end of the file: close "
                               "the quote, or set use_quote_delim false"));
            }
            if (c == '\n') ++line_;
            if (c == '"') {
              const int after = Peek();
              if (after == '"') {
                Get();
                current->push_back('"');
                continue;
              }
              break;
            }
            current->push_back(static_cast<char>(c));
          }
          at_field_start = false;
          c = Get();
          if (c >= 0 && c != delim_ && c != '\n' && c != '\r') {
            return absl::InvalidArgumentError(absl::StrCat(
                path(), " line ", record_line_,
                ": text after a quoted field's closing quote: quote the whole field, or set "
                "use_quote_delim false"));
          }
          continue;
        }
        if (c == delim_) {
          current = &field();
          at_field_start = true;
        } else if (c == '\n') {
          ++line_;
          break;
        } else if (c != '\r') {
          current->push_back(static_cast<char>(c));
          at_field_start = false;
        }
        c = Get();
      }
      fields.resize(count);
      return true;
    }
  }

 private:
  int Get() {
    if (begin_ == end_ && !Refill()) return -1;
    return static_cast<unsigned char>(buffer_[begin_++]);
  }
  int Peek() {
    if (begin_ == end_ && !Refill()) return -1;
    return static_cast<unsigned char>(buffer_[begin_]);
  }
  bool Refill() {
    if (!status_.ok()) return false;
    absl::StatusOr<size_t> got = stream_->Read(buffer_.data(), buffer_.size());
    if (!got.ok()) {
      status_ = got.status();
      return false;
    }
    begin_ = 0;
    end_ = *got;
    return end_ > 0;
  }

  std::unique_ptr<InputStream> stream_;
  char delim_;
  bool quotes_;
  std::string buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
  int64_t line_ = 1;
  int64_t record_line_ = 1;
  absl::Status status_;
};

// The number in a field, as TensorFlow's CSV parsing reads one: spaces around it and a
// leading '+' allowed.
absl::string_view NumberText(const std::string& s) {
  absl::string_view text = absl::StripAsciiWhitespace(s);
  if (text.size() > 1 && text[0] == '+' && text[1] != '-' && text[1] != '+') text.remove_prefix(1);
  return text;
}

bool ParseInt(const std::string& s, int64_t& out) {
  const absl::string_view text = NumberText(s);
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, out);
  return !text.empty() && ec == std::errc() && p == end;
}

bool ParseFloat(const std::string& s, double& out) {
  const absl::string_view text = NumberText(s);
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, out);
  return !text.empty() && ec == std::errc() && p == end;
}

struct Column {
  std::string name;
  CsvColumnDefault spec;
  int output = -1;                            // -1: not read; -2: the label; else the index in x
  std::shared_ptr<const TokenLookup> lookup;  // values to ids, or null
};

class CsvFileFormat;

class CsvExampleReader : public ExampleReader {
 public:
  CsvExampleReader(const CsvFileFormat& format, std::unique_ptr<CsvTokenizer> tokens)
      : format_(format), tokens_(std::move(tokens)) {}
  absl::StatusOr<std::optional<Element>> Next() override;

 private:
  const CsvFileFormat& format_;
  std::unique_ptr<CsvTokenizer> tokens_;
  std::vector<std::string> fields_;
};

class CsvFileFormat : public RecordFormat {
 public:
  CsvFileFormat(CsvOptions options, std::vector<std::string> header, std::vector<Column> columns,
                int64_t features, Type label_type)
      : options_(std::move(options)),
        header_(std::move(header)),
        columns_(std::move(columns)),
        features_(features),
        label_type_(label_type) {}

  // A tokenizer past the file's header, which must match the first file's.
  absl::StatusOr<std::unique_ptr<CsvTokenizer>> OpenTokens(const std::string& path) const {
    STRATUM_ASSIGN_OR_RETURN(auto stream, InputStream::Open(path, options_.compression));
    auto tokens = std::make_unique<CsvTokenizer>(std::move(stream), options_.field_delim,
                                                 options_.use_quote_delim);
    if (options_.header) {
      std::vector<std::string> header;
      STRATUM_ASSIGN_OR_RETURN(const bool any, tokens->Next(header));
      if (!any) return tokens;  // an empty file: no rows
      if (options_.column_names.empty() && header != header_) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": its header (", absl::StrJoin(header, ","), ") differs from the first file's (",
            absl::StrJoin(header_, ","), "): give files of the same columns"));
      }
    }
    return tokens;
  }

  absl::StatusOr<std::unique_ptr<ExampleReader>> Open(const std::string& path) const override {
    STRATUM_ASSIGN_OR_RETURN(auto tokens, OpenTokens(path));
    return std::make_unique<CsvExampleReader>(*this, std::move(tokens));
  }
  absl::StatusOr<int64_t> Count(const std::string& path) const override {
    STRATUM_ASSIGN_OR_RETURN(auto tokens, OpenTokens(path));
    std::vector<std::string> fields;
    int64_t rows = 0;
    while (true) {
      STRATUM_ASSIGN_OR_RETURN(const bool more, tokens->Next(fields));
      if (!more) return rows;
      ++rows;
    }
  }
  std::string Name() const override {
    return options_.compression == Compression::kNone
               ? "CSV"
               : absl::StrCat("CSV (", CompressionName(options_.compression), ")");
  }

  const CsvOptions& options() const { return options_; }
  const std::vector<Column>& columns() const { return columns_; }
  int64_t features() const { return features_; }
  Type label_type() const { return label_type_; }

 private:
  CsvOptions options_;
  std::vector<std::string> header_;  // the first file's, which every file must repeat
  std::vector<Column> columns_;
  int64_t features_;
  Type label_type_;
};

absl::StatusOr<std::optional<Element>> CsvExampleReader::Next() {
  STRATUM_ASSIGN_OR_RETURN(const bool more, tokens_->Next(fields_));
  if (!more) return std::nullopt;
  const std::vector<Column>& columns = format_.columns();
  auto where = [&] { return absl::StrCat(tokens_->path(), " line ", tokens_->line()); };
  if (fields_.size() != columns.size()) {
    return absl::InvalidArgumentError(absl::StrCat(where(), " has ", fields_.size(),
                                                   " fields, but the data has ", columns.size(),
                                                   " columns: fix the row, or the quoting"));
  }
  Tensor x(DType::kFloat32, Shape({format_.features()}));
  Tensor y = format_.label_type() == Type::kInt64 ? Tensor(DType::kInt64, Shape({}))
                                                  : Tensor(DType::kFloat32, Shape({}));
  float* xs = x.data<float>();
  for (size_t c = 0; c < columns.size(); ++c) {
    const Column& column = columns[c];
    if (column.output == -1) continue;
    const std::string& text = fields_[c];
    double value = 0;
    if (column.lookup != nullptr && column.spec.type == Type::kString) {
      // A token: an empty field is the token "" (make_csv_dataset's default for text).
      const int64_t id = column.lookup->Index(text);
      if (column.output == -2) {
        *y.data<int64_t>() = id;
      } else {
        xs[column.output] = static_cast<float>(id);
      }
      continue;
    }
    if (text.empty() || text == format_.options().na_value) {
      if (column.spec.required) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), ": column \"", column.name,
                         "\" is empty and has no default: give one in column_defaults"));
      }
      value = column.spec.value;
      if (column.lookup != nullptr) {
        value = static_cast<double>(column.lookup->Index(static_cast<int64_t>(value)));
      }
    } else if (column.spec.type == Type::kInt64) {
      int64_t v;
      if (!ParseInt(text, v)) {
        return absl::InvalidArgumentError(absl::StrCat(where(), ": column \"", column.name,
                                                       "\" holds \"", text,
                                                       "\", not an int64: fix the value, or make "
                                                       "the column's default a float"));
      }
      if (column.lookup != nullptr) v = column.lookup->Index(v);
      if (column.output == -2) {
        *y.data<int64_t>() = v;
        continue;
      }
      value = static_cast<double>(v);
    } else if (!ParseFloat(text, value) || std::abs(value) > std::numeric_limits<float>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": column \"", column.name,
                                                     "\" holds \"", text,
                                                     "\", not a float32 number: fix the value"));
    }
    if (column.output == -2) {
      if (format_.label_type() == Type::kInt64) {
        *y.data<int64_t>() = static_cast<int64_t>(value);
      } else {
        *y.data<float>() = static_cast<float>(value);
      }
    } else {
      xs[column.output] = static_cast<float>(value);
    }
  }
  Element element;
  element.reserve(2);
  element.push_back(std::move(x));
  element.push_back(std::move(y));
  return element;
}

}  // namespace

absl::StatusOr<int64_t> CountCsvRows(const std::string& path, const CsvOptions& options) {
  STRATUM_ASSIGN_OR_RETURN(auto stream, InputStream::Open(path, options.compression));
  CsvTokenizer tokens(std::move(stream), options.field_delim, options.use_quote_delim);
  std::vector<std::string> fields;
  int64_t rows = 0;
  while (true) {
    STRATUM_ASSIGN_OR_RETURN(const bool more, tokens.Next(fields));
    if (!more) return options.header && rows > 0 ? rows - 1 : rows;
    ++rows;
  }
}

absl::StatusOr<std::shared_ptr<const RecordFormat>> CsvFormat(const std::string& first_file,
                                                              CsvOptions options) {
  if (options.label_name.empty()) {
    return absl::InvalidArgumentError(
        "CSV data needs label_name, the column the model learns to predict");
  }
  STRATUM_ASSIGN_OR_RETURN(auto stream, InputStream::Open(first_file, options.compression));
  CsvTokenizer tokens(std::move(stream), options.field_delim, options.use_quote_delim);
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> fields;
  if (options.header) {
    STRATUM_ASSIGN_OR_RETURN(const bool any, tokens.Next(header));
    if (!any) {
      return absl::InvalidArgumentError(
          absl::StrCat(first_file, " is empty, but header is true: give a CSV file with a header"));
    }
  }
  while (static_cast<int>(rows.size()) < kInferenceRows) {
    STRATUM_ASSIGN_OR_RETURN(const bool more, tokens.Next(fields));
    if (!more) break;
    rows.push_back(fields);
  }
  const std::vector<std::string> names =
      options.column_names.empty() ? header : options.column_names;
  if (names.empty()) {
    return absl::InvalidArgumentError(
        "CSV data without a header needs column_names: give the columns' names in order");
  }
  if (!options.column_defaults.empty() && options.column_defaults.size() != names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("column_defaults has ", options.column_defaults.size(),
                     " entries but the data has ", names.size(), " columns: give one per column"));
  }
  std::vector<Column> columns(names.size());
  for (size_t c = 0; c < names.size(); ++c) {
    columns[c].name = names[c];
    if (!options.column_defaults.empty()) columns[c].spec = options.column_defaults[c];
  }
  for (const std::string& selected : options.select_columns) {
    if (std::find(names.begin(), names.end(), selected) == names.end()) {
      return absl::InvalidArgumentError(absl::StrCat("select_columns names \"", selected,
                                                     "\", which is not a column: the columns are ",
                                                     absl::StrJoin(names, ", ")));
    }
  }
  const auto label = std::find(names.begin(), names.end(), options.label_name);
  if (label == names.end()) {
    return absl::InvalidArgumentError(absl::StrCat("label_name \"", options.label_name,
                                                   "\" is not a column: the columns are ",
                                                   absl::StrJoin(names, ", ")));
  }
  int64_t features = 0;
  Type label_type = Type::kFloat32;
  for (size_t c = 0; c < columns.size(); ++c) {
    Column& column = columns[c];
    const bool is_label = names[c] == options.label_name;
    const bool selected = options.select_columns.empty() ||
                          std::find(options.select_columns.begin(), options.select_columns.end(),
                                    names[c]) != options.select_columns.end();
    if (!is_label && !selected) continue;
    std::string text_seen;  // the first value that is not a number, and where
    if (column.spec.type == Type::kInfer) {
      bool all_int = true;
      bool all_number = true;
      for (size_t r = 0; r < rows.size(); ++r) {
        const auto& row = rows[r];
        if (c >= row.size() || row[c].empty() || row[c] == options.na_value) continue;
        int64_t i;
        double d;
        if (!ParseInt(row[c], i)) all_int = false;
        if (!ParseFloat(row[c], d) && all_number) {
          all_number = false;
          text_seen =
              absl::StrCat(" (\"", row[c], "\" in data row ", r + 1, " of ", first_file, ")");
        }
      }
      column.spec.type = all_int ? Type::kInt64 : all_number ? Type::kFloat32 : Type::kString;
    }
    if (const auto lookup = options.lookups.find(names[c]); lookup != options.lookups.end()) {
      column.lookup = lookup->second;
      const bool strings = column.lookup->kind() == TokenLookup::Kind::kString;
      // A StringLookup takes the column as text, whatever it looks like ("007" is a token).
      if (strings) column.spec.type = Type::kString;
      if (!strings && column.spec.type != Type::kInt64) {
        return absl::InvalidArgumentError(
            absl::StrCat("CSV column \"", names[c], "\" goes through an IntegerLookup but holds ",
                         column.spec.type == Type::kString ? "text" : "float32 numbers", text_seen,
                         ": give it a StringLookup for text, or integer values"));
      }
    }
    if (column.spec.type == Type::kString && column.lookup == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CSV column \"", names[c], "\" holds text", text_seen,
          ", but Stratum's models take numbers: make its tokens ids with a StringLookup in the "
          "source's preprocess, leave it out with select_columns, or give numeric values"));
    }
    if (is_label) {
      column.output = -2;
      label_type = column.lookup != nullptr ? Type::kInt64 : column.spec.type;
    } else if (options.input_columns.empty()) {
      column.output = static_cast<int>(features++);
    }
  }
  for (size_t i = 0; i < options.input_columns.size(); ++i) {
    const std::string& input = options.input_columns[i];
    const auto named = std::find(names.begin(), names.end(), input);
    Column* column = named == names.end() ? nullptr : &columns[named - names.begin()];
    if (column == nullptr || input == options.label_name ||
        (!options.select_columns.empty() &&
         std::find(options.select_columns.begin(), options.select_columns.end(), input) ==
             options.select_columns.end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model takes an input \"", input,
          "\", which is no selected feature column of the CSV data: the columns are ",
          absl::StrJoin(names, ", "), "; name the model's inputs after the columns they take"));
    }
    column->output = static_cast<int>(features++);
  }
  if (features == 0) {
    return absl::InvalidArgumentError(
        "the CSV data has no feature column besides the label: select at least one");
  }
  return std::shared_ptr<const RecordFormat>(std::make_shared<CsvFileFormat>(
      std::move(options), std::move(header), std::move(columns), features, label_type));
}

}  // namespace stratum

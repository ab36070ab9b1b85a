// CSV files with tf.data.experimental.make_csv_dataset's semantics: a header line per file
// (or column_names), column_defaults that give each column's type and the value of an
// empty field (a column without one is required), select_columns, label_name,
// field_delim, quoted fields ("a, b" and "" for a quote inside, spanning lines), na_value,
// GZIP/ZLIB compression. Types not given are inferred from the first 100 rows of the first
// file as make_csv_dataset does: int64 when every value is an integer, else float32 when
// every value is a number, else string.
//
// Elements are (x, y): x float32 [features], the selected columns other than the label,
// in the file's column order, or in input_columns' order when given (the model's named
// inputs); y the label column (int64 or float32 by its type). A text column needs a
// StringLookup (`lookups`), which makes its tokens ids; without one it is refused by name.
// An IntegerLookup makes an int64 column's values ids.
//
// Thread safety: the format is immutable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/data/lookup.h"
#include "stratum/data/record_files.h"
#include "stratum/data/tfrecord.h"

namespace stratum {

struct CsvColumnDefault {
  enum class Type { kInfer, kInt64, kFloat32, kString };
  Type type = Type::kInfer;
  bool required = true;  // an empty field is an error
  double value = 0;      // float32 and int64 defaults
};

struct CsvOptions {
  bool header = true;
  std::vector<std::string> column_names;          // empty: the header's
  std::vector<CsvColumnDefault> column_defaults;  // empty, or one per column
  std::vector<std::string> select_columns;        // empty: every column
  std::string label_name;                         // required: the y column
  char field_delim = ',';
  bool use_quote_delim = true;
  std::string na_value;  // a field equal to it counts as empty
  Compression compression = Compression::kNone;
  // Per column: the lookup its values go through (the job's preprocess).
  std::map<std::string, std::shared_ptr<const TokenLookup>> lookups;
  // The columns that form x, in order; empty: the selected columns but the label.
  std::vector<std::string> input_columns;
};

// The format of `first_file` (read for its header and type inference) and the files like
// it. INVALID_ARGUMENT naming the option for a label or selected column that is not there,
// a string feature column, mismatched defaults.
absl::StatusOr<std::shared_ptr<const RecordFormat>> CsvFormat(const std::string& first_file,
                                                              CsvOptions options);

// The data rows of a CSV file (its header, when options.header, left out), read with the
// file's quoting but without the columns' types: a count that needs no label.
absl::StatusOr<int64_t> CountCsvRows(const std::string& path, const CsvOptions& options);

}  // namespace stratum

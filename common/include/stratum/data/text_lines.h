// Text files of one example a line, as tf.data.TextLineDataset reads them: every line is an
// element, a blank one too, its '\n' (and a '\r' before it) dropped; a last line without
// '\n' counts; GZIP and ZLIB files are inflated as they are read. A line becomes ids through
// the source's TextVectorization (or StringLookup) and is labelled by its file, as
// TensorFlow's text-loading tutorial labels each translation's lines by the file's index.
//
// Elements are (x, y): x float32 [length] ids, y int64 [] the file's label.
//
// Thread safety: the format is immutable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "stratum/data/record_files.h"
#include "stratum/data/text_vectorization.h"
#include "stratum/data/tfrecord.h"

namespace stratum {

struct TextLineOptions {
  Compression compression = Compression::kNone;
  std::shared_ptr<const TextVectorizer> vectorizer;  // required
  int64_t length = 1;                                // ids per line
  std::map<std::string, int64_t> labels;             // each file's label, by path
};

// A file not in options.labels is refused when opened, by name.
std::shared_ptr<const RecordFormat> TextLines(TextLineOptions options);

// The lines of a file: its '\n's, and one more when its last line has none.
absl::StatusOr<int64_t> CountTextLines(const std::string& path, Compression compression);

}  // namespace stratum

// Writing data sets as TFRecord shards of tf.train.Example, as TensorFlow input pipelines
// keep them: what `stratum-data convert` does, and what tests and benchmarks use to make
// realistic multi-file inputs. The Examples are built with protobuf's generated classes
// (proto/example.proto), not with Stratum's reader's code, so a round trip checks both.
//
// Thread safety: plain functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stratum/data/dataset.h"
#include "stratum/data/tfrecord.h"

namespace stratum {

struct ConvertOptions {
  std::string out_prefix;  // shards are <out_prefix>-00000-of-00008.tfrecord[.gz|.zlib]
  int shards = 1;
  Compression compression = Compression::kNone;
  std::string input_key = "image";  // the feature that holds x
  std::string label_key = "label";  // the feature that holds y
};

// Writes the (x, y) elements of `examples`, `count` of them, into options.shards files of
// contiguous ranges (shard i holds examples [i*count/n, (i+1)*count/n)). x becomes one
// feature: raw bytes when uint8 (row-major, decode_raw uint8), a float_list when float32,
// an int64_list when int32 or int64; y an int64_list when integer (uint8 labels too, as
// TensorFlow keeps class ids), else a float_list.
// Each file appears whole or not at all (TFRecordWriter renames it into place). Returns
// the files in order.
absl::StatusOr<std::vector<std::string>> WriteTFRecordShards(const Dataset& examples, int64_t count,
                                                             const ConvertOptions& options);

// The job file's "features" object that reads what WriteTFRecordShards writes for elements
// shaped like `example` (x, y).
nlohmann::json FeatureSpecsFor(const Element& example, const ConvertOptions& options);

}  // namespace stratum

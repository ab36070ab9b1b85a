#include "stratum/data/convert.h"

#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/example.pb.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

const char* Suffix(Compression compression) {
  switch (compression) {
    case Compression::kNone:
      return ".tfrecord";
    case Compression::kGzip:
      return ".tfrecord.gz";
    case Compression::kZlib:
      return ".tfrecord.zlib";
  }
  return ".tfrecord";
}

// uint8 x is raw bytes (images, as TF pipelines keep them); integer labels are int64s.
void SetFeature(const Tensor& t, bool is_label, tensorflow::Feature& feature) {
  switch (t.dtype()) {
    case DType::kUInt8:
      if (is_label) {
        auto* list = feature.mutable_int64_list();
        const uint8_t* v = t.data<uint8_t>();
        for (int64_t i = 0; i < t.num_elements(); ++i) list->add_value(v[i]);
        return;
      }
      feature.mutable_bytes_list()->add_value(static_cast<const char*>(t.raw_data()),
                                              t.byte_size());
      return;
    case DType::kFloat32: {
      auto* list = feature.mutable_float_list();
      const float* v = t.data<float>();
      list->mutable_value()->Add(v, v + t.num_elements());
      return;
    }
    case DType::kInt32: {
      auto* list = feature.mutable_int64_list();
      const int32_t* v = t.data<int32_t>();
      for (int64_t i = 0; i < t.num_elements(); ++i) list->add_value(v[i]);
      return;
    }
    case DType::kInt64: {
      auto* list = feature.mutable_int64_list();
      const int64_t* v = t.data<int64_t>();
      list->mutable_value()->Add(v, v + t.num_elements());
      return;
    }
  }
}

nlohmann::json SpecFor(const Tensor& t, bool is_label) {
  nlohmann::json spec = {{"type", "FixedLenFeature"}, {"shape", t.shape().dims()}};
  switch (t.dtype()) {
    case DType::kUInt8:
      if (is_label) {
        spec["dtype"] = "int64";
        break;
      }
      spec["dtype"] = "string";
      spec["decode_raw"] = "uint8";
      break;
    case DType::kFloat32:
      spec["dtype"] = "float32";
      break;
    case DType::kInt32:
    case DType::kInt64:
      spec["dtype"] = "int64";
      break;
  }
  return spec;
}

}  // namespace

nlohmann::json FeatureSpecsFor(const Element& example, const ConvertOptions& options) {
  return {{options.input_key, SpecFor(example[0], false)},
          {options.label_key, SpecFor(example[1], true)}};
}

absl::StatusOr<std::vector<std::string>> WriteTFRecordShards(const Dataset& examples, int64_t count,
                                                             const ConvertOptions& options) {
  STRATUM_RETURN_IF_ERROR(examples.status());
  if (options.shards < 1 || options.out_prefix.empty() || options.input_key == options.label_key) {
    return absl::InvalidArgumentError(
        "WriteTFRecordShards: give an output prefix, at least one shard, and two different "
        "feature keys");
  }
  std::vector<std::string> files;
  auto iterator = examples.MakeIterator();
  tensorflow::Example example;
  std::string record;
  int64_t written = 0;
  for (int shard = 0; shard < options.shards; ++shard) {
    const std::string path = absl::StrFormat("%s-%05d-of-%05d%s", options.out_prefix, shard,
                                             options.shards, Suffix(options.compression));
    STRATUM_ASSIGN_OR_RETURN(auto writer, TFRecordWriter::Open(path, options.compression));
    const int64_t end = count * (shard + 1) / options.shards;
    for (; written < end; ++written) {
      STRATUM_ASSIGN_OR_RETURN(std::optional<Element> element, iterator->GetNext());
      if (!element) {
        return absl::InvalidArgumentError(absl::StrCat("WriteTFRecordShards: the data ended after ",
                                                       written, " of ", count, " examples"));
      }
      if (element->size() != 2) {
        return absl::InvalidArgumentError("WriteTFRecordShards: elements must be (x, y) pairs");
      }
      example.Clear();
      auto& features = *example.mutable_features()->mutable_feature();
      SetFeature((*element)[0], false, features[options.input_key]);
      SetFeature((*element)[1], true, features[options.label_key]);
      record.clear();
      example.SerializeToString(&record);
      STRATUM_RETURN_IF_ERROR(writer->Write(record));
    }
    STRATUM_RETURN_IF_ERROR(writer->Close());
    files.push_back(path);
  }
  return files;
}

}  // namespace stratum

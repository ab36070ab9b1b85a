// Embedding and GlobalAveragePooling1D: a table of input_dim rows of output_dim floats looked
// up by integer ids (an input of any shape [...] becomes [..., output_dim]), and the mean over
// the steps of a sequence [steps, features] -> [features], as Keras computes them.
//
// With mask_zero, id 0 is padding: it still looks up row 0 (as in Keras), and the model
// carries the mask to a GlobalAveragePooling1D after it (through Dense, Dropout and
// Activation), whose mean then leaves those steps out (model_json.cc's MaskGiven).
//
// Ids reach the layer as id words (stratum/device/device.h: an int32's bits in each float),
// unscaled. An id outside [0, input_dim) looks up zeros and moves no row (TensorFlow's
// GPU behaviour; its CPU refuses the step).
//
// The table is row-sparse (VariableSpec::row_sparse): a step may be given only the rows its
// batch reads (a parameter-server worker pulls no more), in which case the ids are first
// mapped to their positions among those rows, and the gradient covers those rows alone.
// Given whole, its gradient is dense (rows no id of the step touched are zero).
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

using keras::Dump;
using keras::Find;

class Embedding final : public Layer {
 public:
  Embedding(int64_t input_dim, int64_t output_dim, keras::Initializer initializer,
            keras::Regularizer regularizer, bool mask_zero)
      : input_dim_(input_dim),
        output_dim_(output_dim),
        initializer_(std::move(initializer)),
        regularizer_(regularizer),
        mask_zero_(mask_zero) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    ids_per_example_ = inputs[0].num_elements();
    if (!keras::CheckedProduct(input_dim_, output_dim_)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has a table of ", input_dim_, " x ", output_dim_,
                       " elements, more than the 2^31 Stratum allows per variable"));
    }
    if (!keras::CheckedProduct(ids_per_example_, output_dim_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " outputs ", ids_per_example_, " x ", output_dim_,
          " elements per example, more than the 2^31 Stratum allows: use a smaller output_dim"));
    }
    LayerBuild build;
    std::vector<int64_t> dims = inputs[0].dims();
    dims.push_back(output_dim_);
    build.output = Shape(std::move(dims));
    build.variables.push_back(keras::MakeVariable("embeddings", Shape({input_dim_, output_dim_}),
                                                  initializer_, regularizer_));
    build.variables.back().row_sparse = true;
    build.scratch_per_example = ids_per_example_;  // the ids' positions among given rows
    build.masks_zero_ids = mask_zero_;
    return build;
  }

  void Forward(const LayerForward& args) const override {
    const int64_t count = args.batch * ids_per_example_;
    const auto [ids, rows] = IdsAndRows(args.device, args.inputs[0], count, args.variable_rows,
                                        args.scratch, /*map=*/true);
    args.device->EmbeddingLookup(ids, count, args.variables[0], rows, output_dim_, args.output);
  }

  void Backward(const LayerBackward& args) const override {
    const int64_t count = args.batch * ids_per_example_;
    // The positions Forward wrote to the scratch are still there.
    const auto [ids, rows] = IdsAndRows(args.device, args.inputs[0], count, args.variable_rows,
                                        args.scratch, /*map=*/false);
    args.device->EmbeddingGrad(ids, count, args.grad_output, rows, output_dim_,
                               args.grad_variables[0]);
    // Ids have no gradient; a layer before this one (rare) gets zeros.
    if (args.grad_inputs[0] != nullptr && !args.accumulate[0]) {
      args.device->Zero(args.grad_inputs[0], args.batch * ids_per_example_);
    }
  }

 private:
  // The ids to look up and the rows of the table they index: the model's ids into the whole
  // table, or (the table given as some rows) their positions among those rows, which `map`
  // writes into `scratch`.
  std::pair<const float*, int64_t> IdsAndRows(const Device* device, const float* ids, int64_t count,
                                              std::span<const VariableRows> given, float* scratch,
                                              bool map) const {
    if (given.empty() || given[0].count < 0) return {ids, input_dim_};
    if (map) device->EmbeddingPositions(ids, count, given[0].ids, given[0].count, scratch);
    return {scratch, given[0].count};
  }

  const int64_t input_dim_;
  const int64_t output_dim_;
  const keras::Initializer initializer_;
  const keras::Regularizer regularizer_;
  const bool mask_zero_;
  int64_t ids_per_example_ = 0;
};

class GlobalAveragePooling1D final : public Layer {
 public:
  explicit GlobalAveragePooling1D(bool keepdims) : keepdims_(keepdims) {}

  // A second input, when the model gives one, is the ids of an Embedding with mask_zero
  // [steps]: the mean then leaves out the steps whose id is 0.
  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    const Shape& in = inputs[0];
    if (in.rank() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " takes sequences [steps, features], but gets ",
                       keras::ShapeWithBatch(in), ": reshape the input to rank 3 with its batch"));
    }
    steps_ = in.dim(0);
    width_ = in.dim(1);
    masked_ = inputs.size() == 2;
    if (masked_ && inputs[1].num_elements() != steps_) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is given the mask of ", inputs[1].num_elements(), " ids for sequences of ",
          steps_, " steps: give the Embedding one id per step ([steps] per example)"));
    }
    LayerBuild build;
    build.output = keepdims_ ? Shape({1, width_}) : Shape({width_});
    return build;
  }

  // The masked mean has no CUDA kernel yet.
  bool RunsOnGpu() const override { return !masked_; }

  void Forward(const LayerForward& args) const override {
    if (masked_) {
      args.device->AverageMaskedSteps(args.inputs[0], args.inputs[1], args.batch, steps_, width_,
                                      args.output);
      return;
    }
    args.device->AverageSteps(args.inputs[0], args.batch, steps_, width_, args.output);
  }

  void Backward(const LayerBackward& args) const override {
    // Ids have no gradient.
    if (masked_ && args.grad_inputs[1] != nullptr && !args.accumulate[1]) {
      args.device->Zero(args.grad_inputs[1], args.batch * steps_);
    }
    if (args.grad_inputs[0] == nullptr) return;
    if (masked_) {
      args.device->AverageMaskedStepsGrad(args.grad_output, args.inputs[1], args.batch, steps_,
                                          width_, args.grad_inputs[0], args.accumulate[0]);
      return;
    }
    args.device->AverageStepsGrad(args.grad_output, args.batch, steps_, width_, args.grad_inputs[0],
                                  args.accumulate[0]);
  }

 private:
  const bool keepdims_;
  int64_t steps_ = 0;
  int64_t width_ = 0;
  bool masked_ = false;
};

// A positive integer option below 2^31.
absl::StatusOr<int64_t> ParseSize(const std::string& where, const nlohmann::json& config,
                                  const char* key, const char* example) {
  const nlohmann::json* value = Find(config, key);
  if (value == nullptr || !value->is_number_integer() || value->get<int64_t>() <= 0 ||
      value->get<int64_t>() >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", key, " ", value ? Dump(*value) : std::string("missing"),
                     ": set it to a positive integer below 2^31 (an int32 id addresses each "
                     "row), such as ",
                     example));
  }
  return value->get<int64_t>();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeEmbedding(const nlohmann::json& config,
                                                     const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(
      where, config,
      {"input_dim", "output_dim", "embeddings_initializer", "embeddings_regularizer",
       "embeddings_constraint", "mask_zero", "input_length", "sparse", "lora_rank", "weights"}));
  STRATUM_RETURN_IF_ERROR(keras::RefuseSet(
      where, config, {"activity_regularizer", "embeddings_constraint", "lora_rank", "weights"}));
  STRATUM_RETURN_IF_ERROR(keras::RefuseFrozen(where, config));
  STRATUM_ASSIGN_OR_RETURN(const bool mask_zero,
                           keras::ParseBool(where, config, "mask_zero", false));
  STRATUM_ASSIGN_OR_RETURN(const bool sparse, keras::ParseBool(where, config, "sparse", false));
  if (sparse) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " sets sparse to true, which Stratum does not support: remove it"));
  }
  STRATUM_ASSIGN_OR_RETURN(const int64_t input_dim,
                           ParseSize(where, config, "input_dim", "the vocabulary size, 10000"));
  // Ids reach the layer as int32 id words (stratum/device/device.h), which address the
  // rows ParseSize allows; a model that takes values besides ids is held to 2^24 rows when
  // built (model_json.cc).
  STRATUM_ASSIGN_OR_RETURN(const int64_t output_dim, ParseSize(where, config, "output_dim", "64"));
  // Keras' default is "uniform": RandomUniform(-0.05, 0.05).
  STRATUM_ASSIGN_OR_RETURN(
      keras::Initializer initializer,
      keras::ParseInitializer(where, config, "embeddings_initializer", "random_uniform"));
  STRATUM_ASSIGN_OR_RETURN(keras::Regularizer regularizer,
                           keras::ParseRegularizer(where, config, "embeddings_regularizer"));
  return std::make_unique<Embedding>(input_dim, output_dim, std::move(initializer), regularizer,
                                     mask_zero);
}

absl::StatusOr<std::unique_ptr<Layer>> MakeGlobalAveragePooling1D(const nlohmann::json& config,
                                                                  const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config, {"data_format", "keepdims"}));
  if (const nlohmann::json* format = Find(config, "data_format");
      format != nullptr && *format != "channels_last") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has data_format ", Dump(*format),
                     ", which Stratum does not support: use channels_last (steps, features)"));
  }
  STRATUM_ASSIGN_OR_RETURN(const bool keepdims, keras::ParseBool(where, config, "keepdims", false));
  return std::make_unique<GlobalAveragePooling1D>(keepdims);
}

}  // namespace stratum::layers

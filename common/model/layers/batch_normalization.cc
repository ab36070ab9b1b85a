// BatchNormalization (and tf.keras' SyncBatchNormalization): normalizes each channel (the
// last axis) by the batch's mean and variance in training and by the moving statistics in
// inference, then scales by gamma and shifts by beta, as Keras does:
//   y = gamma * (x - mean) / sqrt(variance + epsilon) + beta.
// In training, the moving statistics follow the batch's:
//   moving = moving * momentum + batch statistic * (1 - momentum),
// with the variance divided by the count (Keras 3's ops.moments; PyTorch divides by count - 1).
// The moving statistics are non-trainable variables: the update is written into their
// gradient slots (VariableSpec::trainable), so every strategy carries it as it carries
// gradients. Averaged over replicas it is the update of the replicas' mean statistics,
// which is what tf.distribute's MEAN-aggregated moving statistics read.
//
// trainable: false freezes the layer as in Keras: it runs in inference mode, also in
// training, and none of its variables moves.
//
// synchronized: true computes the statistics over every replica in sync (the global batch),
// summing through CrossReplicaSum; 2 replicas of 32 then normalize as 1 of 64 does.
//
// The math is the Device's passes (Eigen on the CPU), one way for local and synchronized
// statistics. oneDNN's fused batch normalization, tried for the local case, trained
// examples/fashion_mnist_resnet.json 2-3% slower on the 2-core machine kind (2,145 and
// 2,152 examples/s against 2,175 and 2,228), and its backward pass cannot take sums made
// over replicas.
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/keras_config.h"
#include "common/model/layers/layers.h"
#include "stratum/util/status_macros.h"

namespace stratum::layers {
namespace {

using keras::Dump;
using keras::Find;

struct BatchNormOptions {
  float momentum = 0.99f;
  float epsilon = 1e-3f;
  bool center = true;
  bool scale = true;
  bool synchronized = false;
  bool frozen = false;          // trainable false: inference mode always, as in Keras
  std::optional<int64_t> axis;  // as configured; only the last is supported
  keras::Initializer gamma_initializer, beta_initializer;
  keras::Initializer moving_mean_initializer, moving_variance_initializer;
  keras::Regularizer gamma_regularizer, beta_regularizer;
};

class BatchNormalization final : public Layer {
 public:
  explicit BatchNormalization(BatchNormOptions options) : options_(std::move(options)) {}

  absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                   const std::string& where) override {
    const Shape& in = inputs[0];
    if (in.rank() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " needs inputs with a channel axis, but gets a scalar per example"));
    }
    // Keras counts the batch: the last axis of [h, w, c] inputs is 3, or -1.
    if (options_.axis && *options_.axis != -1 && *options_.axis != in.rank()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " has axis ", *options_.axis, ", but Stratum normalizes the last axis alone (",
          in.rank(), " for inputs of ", keras::ShapeWithBatch(in), "): use -1"));
    }
    channels_ = in.dim(in.rank() - 1);
    rows_per_example_ = in.num_elements() / channels_;
    LayerBuild build;
    build.output = in;
    // Keras' order of the weights: gamma, beta, moving_mean, moving_variance.
    const Shape channel({channels_});
    if (options_.scale) {
      build.variables.push_back(keras::MakeVariable("gamma", channel, options_.gamma_initializer,
                                                    options_.gamma_regularizer, !options_.frozen));
    }
    if (options_.center) {
      build.variables.push_back(keras::MakeVariable("beta", channel, options_.beta_initializer,
                                                    options_.beta_regularizer, !options_.frozen));
    }
    build.variables.push_back(
        keras::MakeVariable("moving_mean", channel, options_.moving_mean_initializer, {}, false));
    build.variables.push_back(keras::MakeVariable("moving_variance", channel,
                                                  options_.moving_variance_initializer, {}, false));
    // Per step: the batch's mean and variance, and the backward pass's two sums.
    build.scratch_per_step = 4 * channels_;
    return build;
  }

  void Forward(const LayerForward& args) const override {
    const Device& device = *args.device;
    const int64_t rows = args.batch * rows_per_example_;
    const Variables v = VariablesOf(args.variables);
    if (!args.training || options_.frozen) {
      device.BatchNorm(args.inputs[0], rows, channels_, v.moving_mean, v.moving_variance,
                       options_.epsilon, v.gamma, v.beta, args.output);
      return;
    }
    float* mean = args.scratch;  // the per-step scratch: no per-example part comes first
    float* variance = mean + channels_;
    device.SumRows(args.inputs[0], rows, channels_, mean, false);
    const int64_t count = Sum(args.replicas, mean, channels_, rows);
    device.Scale(1.0f / static_cast<float>(count), mean, mean, channels_, false);
    device.SumSquaredDeviations(args.inputs[0], mean, rows, channels_, variance);
    Sum(args.replicas, variance, channels_, rows);
    device.Scale(1.0f / static_cast<float>(count), variance, variance, channels_, false);
    device.BatchNorm(args.inputs[0], rows, channels_, mean, variance, options_.epsilon, v.gamma,
                     v.beta, args.output);
  }

  void Backward(const LayerBackward& args) const override {
    const Device& device = *args.device;
    const int64_t rows = args.batch * rows_per_example_;
    const Variables v = VariablesOf(args.variables);
    const Gradients g = GradientsOf(args.grad_variables);
    float* grad_input = args.grad_inputs[0];
    float* sums = args.scratch + 2 * channels_;
    if (!args.training || options_.frozen) {
      // The moving statistics are constants: the input's gradient is the affine map's, and
      // nothing moves (a frozen layer's gamma and beta neither).
      if (grad_input != nullptr) {
        device.BatchNormBackward(args.grad_output, args.inputs[0], rows, channels_, v.moving_mean,
                                 v.moving_variance, options_.epsilon, v.gamma, nullptr, rows,
                                 grad_input, args.accumulate[0]);
      }
      if (options_.frozen) {
        for (float* gradient : args.grad_variables) device.Zero(gradient, channels_);
      } else {
        device.BatchNormGradSums(args.grad_output, args.inputs[0], rows, channels_, v.moving_mean,
                                 v.moving_variance, options_.epsilon, sums, g.gamma, g.beta);
        device.Zero(g.moving_mean, channels_);
        device.Zero(g.moving_variance, channels_);
      }
      return;
    }
    const float* mean = args.scratch;
    const float* variance = mean + channels_;
    device.BatchNormGradSums(args.grad_output, args.inputs[0], rows, channels_, mean, variance,
                             options_.epsilon, sums, g.gamma, g.beta);
    const int64_t count = Sum(args.replicas, sums, 2 * channels_, rows);
    if (grad_input != nullptr) {
      device.BatchNormBackward(args.grad_output, args.inputs[0], rows, channels_, mean, variance,
                               options_.epsilon, v.gamma, sums, count, grad_input,
                               args.accumulate[0]);
    }
    // The moving statistics' change, times this replica's share: (1 - momentum) * (moving -
    // batch statistic), subtracted from the moving statistic.
    const float step = (1.0f - options_.momentum) * args.replica_share;
    device.Scale(step, v.moving_mean, g.moving_mean, channels_, false);
    device.Scale(-step, mean, g.moving_mean, channels_, true);
    device.Scale(step, v.moving_variance, g.moving_variance, channels_, false);
    device.Scale(-step, variance, g.moving_variance, channels_, true);
  }

  std::vector<int64_t> CrossReplicaSums(bool backward) const override {
    if (!options_.synchronized || options_.frozen) return {};
    if (backward) return {2 * channels_};
    return {channels_, channels_};
  }

  // Statistics summed over GPU replicas (NCCL inside a captured step) are not built yet.
  bool RunsOnGpu() const override { return !options_.synchronized || options_.frozen; }

 private:
  struct Variables {
    const float* gamma = nullptr;
    const float* beta = nullptr;
    const float* moving_mean = nullptr;
    const float* moving_variance = nullptr;
  };
  struct Gradients {
    float* gamma = nullptr;
    float* beta = nullptr;
    float* moving_mean = nullptr;
    float* moving_variance = nullptr;
  };

  // The layer's variables in Build's order (gamma and beta only when scale and center).
  template <typename Pointers, typename T>
  Pointers Unpack(std::span<T const> pointers) const {
    size_t i = 0;
    Pointers result;
    if (options_.scale) result.gamma = pointers[i++];
    if (options_.center) result.beta = pointers[i++];
    result.moving_mean = pointers[i++];
    result.moving_variance = pointers[i];
    return result;
  }
  Variables VariablesOf(std::span<const float* const> pointers) const {
    return Unpack<Variables>(pointers);
  }
  Gradients GradientsOf(std::span<float* const> pointers) const {
    return Unpack<Gradients>(pointers);
  }

  // Sums over the replicas in sync when synchronized; returns the rows over all of them.
  int64_t Sum(CrossReplicaSum* replicas, float* values, int64_t n, int64_t rows) const {
    if (!options_.synchronized || replicas == nullptr) return rows;
    return replicas->Sum(values, n, rows);
  }

  const BatchNormOptions options_;
  int64_t channels_ = 0;
  int64_t rows_per_example_ = 0;  // positions (pixels) per example, each with its channels
};

// A float option in [low, high).
absl::StatusOr<float> ParseFraction(const std::string& where, const nlohmann::json& config,
                                    const char* key, float default_value, bool positive) {
  const nlohmann::json* value = Find(config, key);
  if (value == nullptr) return default_value;
  const double number = value->is_number() ? value->get<double>() : -1;
  const bool valid = positive ? number > 0 && number < 1 : number >= 0 && number <= 1;
  if (!valid) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", key, " ", Dump(*value), ": use a number ",
                     positive ? "between 0 and 1, such as 0.001" : "from 0 to 1, such as 0.99"));
  }
  return static_cast<float>(number);
}

// Keras' axis, which Stratum takes as the last axis only (-1, or its index counting the
// batch, as tf.keras writes it after building: [3] for images).
absl::StatusOr<std::optional<int64_t>> ParseAxis(const std::string& where,
                                                 const nlohmann::json& config) {
  const nlohmann::json* axis = Find(config, "axis");
  if (axis == nullptr) return std::optional<int64_t>();
  const nlohmann::json* single = axis;
  if (axis->is_array() && axis->size() == 1) single = &(*axis)[0];
  if (single->is_number_integer()) return single->get<int64_t>();  // checked in Build
  return absl::InvalidArgumentError(
      absl::StrCat(where, " has axis ", Dump(*axis),
                   ", but Stratum normalizes the last axis alone (channels_last): use -1"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeBatchNormalization(const nlohmann::json& config,
                                                              const std::string& where) {
  STRATUM_RETURN_IF_ERROR(keras::RefuseUnknown(where, config,
                                               {"axis",
                                                "momentum",
                                                "epsilon",
                                                "center",
                                                "scale",
                                                "beta_initializer",
                                                "gamma_initializer",
                                                "moving_mean_initializer",
                                                "moving_variance_initializer",
                                                "beta_regularizer",
                                                "gamma_regularizer",
                                                "beta_constraint",
                                                "gamma_constraint",
                                                "synchronized",
                                                "renorm",
                                                "renorm_clipping",
                                                "renorm_momentum",
                                                "virtual_batch_size",
                                                "adjustment",
                                                "fused"}));
  STRATUM_RETURN_IF_ERROR(
      keras::RefuseSet(where, config,
                       {"beta_constraint", "gamma_constraint", "renorm_clipping", "renorm_momentum",
                        "virtual_batch_size", "adjustment"}));
  STRATUM_ASSIGN_OR_RETURN(const bool renorm, keras::ParseBool(where, config, "renorm", false));
  if (renorm) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        " sets renorm to true, which Stratum does not support: remove it (set it to false)"));
  }
  STRATUM_RETURN_IF_ERROR(keras::ParseBool(where, config, "fused", true).status());
  BatchNormOptions options;
  STRATUM_ASSIGN_OR_RETURN(options.axis, ParseAxis(where, config));
  STRATUM_ASSIGN_OR_RETURN(const bool trainable,
                           keras::ParseBool(where, config, "trainable", true));
  options.frozen = !trainable;
  STRATUM_ASSIGN_OR_RETURN(options.momentum,
                           ParseFraction(where, config, "momentum", 0.99f, false));
  STRATUM_ASSIGN_OR_RETURN(options.epsilon, ParseFraction(where, config, "epsilon", 1e-3f, true));
  STRATUM_ASSIGN_OR_RETURN(options.center, keras::ParseBool(where, config, "center", true));
  STRATUM_ASSIGN_OR_RETURN(options.scale, keras::ParseBool(where, config, "scale", true));
  STRATUM_ASSIGN_OR_RETURN(options.synchronized,
                           keras::ParseBool(where, config, "synchronized", false));
  STRATUM_ASSIGN_OR_RETURN(options.gamma_initializer,
                           keras::ParseInitializer(where, config, "gamma_initializer", "ones"));
  STRATUM_ASSIGN_OR_RETURN(options.beta_initializer,
                           keras::ParseInitializer(where, config, "beta_initializer", "zeros"));
  STRATUM_ASSIGN_OR_RETURN(
      options.moving_mean_initializer,
      keras::ParseInitializer(where, config, "moving_mean_initializer", "zeros"));
  STRATUM_ASSIGN_OR_RETURN(
      options.moving_variance_initializer,
      keras::ParseInitializer(where, config, "moving_variance_initializer", "ones"));
  STRATUM_ASSIGN_OR_RETURN(options.gamma_regularizer,
                           keras::ParseRegularizer(where, config, "gamma_regularizer"));
  STRATUM_ASSIGN_OR_RETURN(options.beta_regularizer,
                           keras::ParseRegularizer(where, config, "beta_regularizer"));
  return std::make_unique<BatchNormalization>(std::move(options));
}

absl::StatusOr<std::unique_ptr<Layer>> MakeSyncBatchNormalization(const nlohmann::json& config,
                                                                  const std::string& where) {
  if (Find(config, "synchronized") != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     " has config key \"synchronized\", which Keras' layer does not have: "
                     "SyncBatchNormalization is always synchronized; remove it"));
  }
  nlohmann::json synchronized = config;
  synchronized["synchronized"] = true;
  return MakeBatchNormalization(synchronized, where);
}

}  // namespace stratum::layers

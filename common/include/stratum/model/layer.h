// Layer: one Keras layer as a component. A layer is made from its Keras config (by the
// registry in layer_registry.h, from its class_name), then built for the shapes of its
// inputs: it checks them, names the shape of its output and declares its variables (with
// their initializers) and the scratch it needs per example. Its forward and backward passes
// run through a Device (stratum/device/device.h), on memory the model's executor owns, so
// the same layer code runs wherever a Device is implemented.
//
// Adding a Keras layer is one file (its config parsing next to its math), its test, and one
// line in layer_registry.cc.
//
// Shapes are per example, without the batch dimension; buffers hold `batch` examples one
// after another (row-major, batch first). Variables are the layer's own, in the order its
// Build declared them.
//
// Thread safety: a built Layer is immutable; Forward and Backward are const and run from
// many threads at once, each with its own buffers. Ownership: the model owns its layers.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stratum/device/device.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

// One variable of a model, in the order the model's methods take them.
struct VariableSpec {
  std::string name;         // "dense/kernel", "dense/bias", "dense_1/kernel", ...
  Shape shape;              // kernel [inputs, units]; bias [units]
  std::string initializer;  // "glorot_uniform", "zeros", ...
  // The initializer's own seed (Keras' seed=): its values are drawn from it alone, the same
  // whatever seed InitialVariables is given. nullopt (seed None): drawn from that seed.
  std::optional<uint64_t> seed;
  // Keras' kernel_regularizer / bias_regularizer: l1 * sum|w| + l2 * sum w^2 is added to
  // the loss (0, 0: none).
  double l1 = 0;
  double l2 = 0;
  // Keras' non-trainable weights (BatchNormalization's moving statistics) are false: no
  // optimizer touches them. Their gradient slot carries instead the change a step makes,
  // already scaled by the replica's share, which every update path subtracts as it is
  // (NonTrainableUpdate in optimizer.h), so that the replicas' shares, summed as gradients
  // are by every strategy and pushed as gradients are to a parameter server, make one update.
  bool trainable = true;
  // The range of initializer "random_uniform" (Keras' RandomUniform minval, maxval).
  float uniform_low = -0.05f;
  float uniform_high = 0.05f;
  // An embedding table that a step may take as only the rows its batch reads
  // (Workspace::SetVariableRows), its gradient then being those rows' alone: what the
  // parameter servers pull and update by rows. Set by the layer (Embedding); the model keeps
  // it only where every layer reading the table takes its ids straight from a model input
  // (Model::RowsRead finds them there) and no regularizer needs the whole table.
  bool row_sparse = false;
};

// The rows a step holds of a row-sparse variable: `count` sorted, unique row ids (in the
// Device's memory), the variable's buffer holding those rows in that order. count < 0: the
// whole variable.
struct VariableRows {
  const int64_t* ids = nullptr;
  int64_t count = -1;
};

// What Build found: the output's shape, the variables (names without the layer's prefix:
// "kernel", "bias") and the scratch floats that Forward and Backward share: per example, and
// per step whatever the batch (per-channel statistics).
struct LayerBuild {
  Shape output;
  std::vector<VariableSpec> variables;
  int64_t scratch_per_example = 0;
  int64_t scratch_per_step = 0;
  // The output's steps are masked where input 0's ids are 0 (Keras' mask of an Embedding
  // with mask_zero); the model carries the mask to the layer that takes it.
  bool masks_zero_ids = false;
};

// Sums small per-step values over the replicas in sync, for a layer whose statistics span
// the global batch (BatchNormalization with synchronized: true): the replicas of this
// process and of every worker of a MultiWorkerMirrored job. Every replica makes the same
// sums in the same order (CrossReplicaSums says which, for a replica without examples).
//
// A failure (a peer that died, a deadline) is kept by the implementation: later sums do
// nothing and the model's step returns it. Thread safety: one per replica thread.
class CrossReplicaSum {
 public:
  virtual ~CrossReplicaSum() = default;
  // values[0, n) (device memory of the layer's Device) <- their sum over the replicas;
  // returns the sum of `count` (rows this replica summed) over the replicas.
  virtual int64_t Sum(float* values, int64_t n, int64_t count) = 0;
};

// The buffers of one forward pass of one layer.
struct LayerForward {
  const Device* device = nullptr;
  int64_t batch = 0;
  bool training = false;
  std::span<const float* const> inputs;     // one per input, [batch, input shape]
  std::span<const float* const> variables;  // the layer's own
  // Per variable of the layer, the rows given of a row-sparse one (VariableSpec::row_sparse);
  // empty when every variable is whole.
  std::span<const VariableRows> variable_rows;
  float* output = nullptr;      // [batch, output shape]
  float* scratch = nullptr;     // [batch, scratch_per_example], then scratch_per_step floats
  RandomStream* rng = nullptr;  // draws in training mode (dropout)
  CrossReplicaSum* replicas = nullptr;  // in training; nullptr: this replica alone
};

// The buffers of one backward pass of one layer, after its forward pass on the same buffers.
struct LayerBackward {
  const Device* device = nullptr;
  int64_t batch = 0;
  bool training = false;
  std::span<const float* const> inputs;
  std::span<const float* const> variables;
  std::span<const VariableRows> variable_rows;  // as in LayerForward
  const float* output = nullptr;
  float* scratch = nullptr;
  // d(objective)/d(output); the layer may overwrite it. With fused_activation, d/d(logits)
  // of the softmax or sigmoid the layer ends in (the loss took the logits): its derivative
  // is not applied.
  float* grad_output = nullptr;
  bool fused_activation = false;
  // d(objective)/d(input i), overwritten (or added to, where accumulate[i]); nullptr where
  // no gradient is needed.
  std::span<float* const> grad_inputs;
  std::span<const bool> accumulate;
  // d(objective)/d(variable), overwritten; for a non-trainable variable, the change this
  // replica's step makes, times replica_share.
  std::span<float* const> grad_variables;
  // This replica's share of the step's per-step terms (1 / replicas in sync).
  float replica_share = 1.0f;
  CrossReplicaSum* replicas = nullptr;  // as in LayerForward
};

// `activation` when a loss may take its logits in its place (softmax, sigmoid), else kLinear.
inline ActivationKind FusableOf(ActivationKind activation) {
  return activation == ActivationKind::kSoftmax || activation == ActivationKind::kSigmoid
             ? activation
             : ActivationKind::kLinear;
}

class Layer {
 public:
  virtual ~Layer() = default;

  // Checks the input shapes and declares the output and the variables. `where` names the
  // layer for messages (model layer "dense" (Dense)).
  virtual absl::StatusOr<LayerBuild> Build(const std::vector<Shape>& inputs,
                                           const std::string& where) = 0;

  // Whether the forward pass in this mode returns input 0 unchanged (Flatten; Dropout in
  // inference): the model then passes the input's buffer on, and its gradient back, without
  // calling Forward or Backward.
  virtual bool IsIdentity(bool /*training*/) const { return false; }
  // The activation the output ends in when a loss may take its logits instead: softmax (a
  // cross-entropy) or sigmoid (binary_crossentropy), as Keras takes the logits it caches on
  // them; kLinear for none. Logits gives them after Forward.
  virtual ActivationKind FusableActivation() const { return ActivationKind::kLinear; }
  virtual const float* Logits(const LayerForward& /*args*/) const { return nullptr; }

  virtual void Forward(const LayerForward& args) const = 0;
  // Writes the gradients of the inputs in their order: a tensor given twice appears twice in
  // grad_inputs, with accumulate set for the later one.
  virtual void Backward(const LayerBackward& args) const = 0;
  // Whether Backward may be given grad_inputs[0] == grad_output (it transforms the gradient
  // elementwise, in place): the model then spares the input's gradient a buffer and a copy.
  virtual bool BackwardInPlace() const { return false; }

  // Whether the layer runs on a GPU: true when its math is the Device interface's alone,
  // which the CUDA device implements in full. A layer calling a CPU-only library overrides
  // it; a model with such a layer trains on the CPU, naming it.
  virtual bool RunsOnGpu() const { return true; }

  // The sizes (floats) of the sums a training step's Forward (backward false) or Backward
  // makes through CrossReplicaSum, in order: a replica without examples makes the same sums,
  // of zeros, so that the others do not wait for it. None for most layers.
  virtual std::vector<int64_t> CrossReplicaSums(bool /*backward*/) const { return {}; }

  // The largest magnitude of the integer tokens the layer's config names (an IntegerLookup's
  // vocabulary and mask token), 0 for none: a model whose ids travel as float32 values,
  // exact to 2^24, could not tell larger ones apart.
  virtual int64_t LargestToken() const { return 0; }
};

}  // namespace stratum

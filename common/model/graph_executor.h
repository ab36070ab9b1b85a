// GraphExecutor: runs a model's graph (model_graph.h) on one Device: the forward pass, the
// loss's hand-off (the output, or a fused softmax's logits, and where the loss writes its
// gradient) and the backward pass, which adds the gradients of a tensor that feeds several
// layers. The CPU Model (a Workspace per thread) and the GPU replica run their steps with it,
// so a graph runs with the same code on both; only the memory differs.
//
// Memory is its owner's: BufferSizes says how many floats per example each tensor's values
// and gradient and each node's scratch need (0: none), and Bind hands over buffers for
// `capacity` examples. Identity layers (Flatten, Dropout in inference) pass their input's
// buffer on, and the gradient of a tensor read once goes back in place where it can.
//
// Thread safety: one executor per thread (replica); a step allocates nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/model/model_graph.h"
#include "stratum/device/device.h"

namespace stratum {

// Floats per example, and per step whatever the batch (scratch only).
struct GraphBufferSizes {
  std::vector<int64_t> values;   // per tensor: 0 where the tensor never needs its own buffer
  std::vector<int64_t> grads;    // per tensor: 0 where no gradient reaches it
  std::vector<int64_t> scratch;  // per node
  std::vector<int64_t> scratch_per_step;  // per node

  // The floats of each buffer for `batch` examples, in GraphBuffers' fields.
  struct Floats {
    std::vector<int64_t> values, grads, scratch;
  };
  Floats ForBatch(int64_t batch) const;
};
GraphBufferSizes BufferSizes(const Model::Impl& model);

struct GraphBuffers {
  std::vector<float*> values;
  std::vector<float*> grads;
  std::vector<float*> scratch;
};

class GraphExecutor {
 public:
  GraphExecutor(const Model::Impl& model, const Device& device);
  ~GraphExecutor();
  GraphExecutor(const GraphExecutor&) = delete;
  GraphExecutor& operator=(const GraphExecutor&) = delete;

  // Buffers of BufferSizes().ForBatch(capacity) floats (device memory of `device`).
  void Bind(GraphBuffers buffers);
  // Where synchronized layers sum over the replicas in sync in training (nullptr: none).
  void set_replicas(CrossReplicaSum* replicas) { replicas_ = replicas; }

  // The forward pass of `batch` examples in x [batch, input elements] (several inputs: their
  // values side by side, split here); `variables` holds one pointer per model variable.
  // `rows`: per model variable, the rows given of a row-sparse one (empty: all whole).
  void Forward(const float* x, int64_t batch, bool training,
               std::span<const float* const> variables, RandomStream& rng,
               std::span<const VariableRows> rows = {});
  // After Forward: the output [batch, output size] (the one output), or output `i`.
  const float* Output(size_t i = 0) const;
  // After Forward: the logits of the fused softmax node `fused` (Model::Impl::
  // LogitsOutputNode), or nullptr for -1.
  const float* Logits(int fused, int64_t batch, bool training) const;

  // Clears the step's gradients and returns where the loss writes its gradient: d/d(output),
  // or d/d(logits) of `fused`. nullptr when nothing in the model is trainable.
  float* StartGradients(int fused);
  // The backward pass after StartGradients and the loss: writes every variable's gradient
  // through `gradients` (one pointer per model variable), overwriting it.
  // `replica_share` (1 / replicas in sync) scales the non-trainable variables' updates.
  void Backward(int64_t batch, bool training, int fused, std::span<float* const> gradients,
                float replica_share);
  // A training step of a replica without examples: the sums over the replicas that the
  // synchronized layers make in Forward and Backward, of zeros, so the others need not wait.
  void SyncWithoutExamples();

 private:
  struct NodeArgs;
  LayerForward ForwardArgs(int n, int64_t batch, bool training, RandomStream* rng) const;
  void PassGradient(int input, float* grad, int64_t batch);
  void PointGradInput(int n, size_t i, float* grad_output);

  const Model::Impl& model_;
  const Device& device_;
  GraphBuffers buffers_;
  std::vector<const float*> act_;  // per tensor: where its values are this step
  std::vector<float*> grad_;       // per tensor: where its gradient is this step
  std::vector<char> grad_ready_;   // per tensor: written this step (later writes add)
  std::vector<NodeArgs> args_;     // per node
  CrossReplicaSum* replicas_ = nullptr;
};

}  // namespace stratum

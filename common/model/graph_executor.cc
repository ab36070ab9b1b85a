#include "common/model/graph_executor.h"

#include <utility>

namespace stratum {

// The pointer lists one node's Forward and Backward take, kept so a step allocates nothing.
struct GraphExecutor::NodeArgs {
  std::vector<const float*> inputs;
  std::vector<const float*> variables;
  std::vector<VariableRows> rows;  // empty while every variable is whole
  std::vector<float*> grad_inputs;
  std::vector<float*> grad_variables;
  std::unique_ptr<bool[]> accumulate;
};

GraphBufferSizes BufferSizes(const Model::Impl& model) {
  GraphBufferSizes sizes;
  for (const GraphTensor& tensor : model.tensors) {
    bool own;
    if (tensor.producer < 0) {
      own = model.inputs.size() > 1;  // several inputs are split from x
    } else {
      const Layer& layer = *model.nodes[static_cast<size_t>(tensor.producer)].layer;
      own = !(layer.IsIdentity(true) && layer.IsIdentity(false));
    }
    sizes.values.push_back(own ? tensor.size : 0);
    sizes.grads.push_back(tensor.needs_grad ? tensor.size : 0);
  }
  for (const GraphNode& node : model.nodes) {
    sizes.scratch.push_back(node.scratch_per_example);
    sizes.scratch_per_step.push_back(node.scratch_per_step);
  }
  return sizes;
}

GraphBufferSizes::Floats GraphBufferSizes::ForBatch(int64_t batch) const {
  Floats floats;
  for (int64_t size : values) floats.values.push_back(batch * size);
  for (int64_t size : grads) floats.grads.push_back(batch * size);
  for (size_t n = 0; n < scratch.size(); ++n) {
    floats.scratch.push_back(batch * scratch[n] + scratch_per_step[n]);
  }
  return floats;
}

GraphExecutor::GraphExecutor(const Model::Impl& model, const Device& device)
    : model_(model),
      device_(device),
      act_(model.tensors.size()),
      grad_(model.tensors.size()),
      grad_ready_(model.tensors.size()),
      args_(model.nodes.size()) {
  for (size_t n = 0; n < model.nodes.size(); ++n) {
    const GraphNode& node = model.nodes[n];
    NodeArgs& args = args_[n];
    args.inputs.resize(node.inputs.size());
    args.variables.resize(node.variables.size());
    args.grad_inputs.resize(node.inputs.size());
    args.grad_variables.resize(node.variables.size());
    args.accumulate = std::make_unique<bool[]>(node.inputs.size());
  }
}

GraphExecutor::~GraphExecutor() = default;

void GraphExecutor::Bind(GraphBuffers buffers) { buffers_ = std::move(buffers); }

LayerForward GraphExecutor::ForwardArgs(int n, int64_t batch, bool training,
                                        RandomStream* rng) const {
  const GraphNode& node = model_.nodes[static_cast<size_t>(n)];
  const NodeArgs& args = args_[static_cast<size_t>(n)];
  return LayerForward{.device = &device_,
                      .batch = batch,
                      .training = training,
                      .inputs = args.inputs,
                      .variables = args.variables,
                      .variable_rows = args.rows,
                      .output = buffers_.values[static_cast<size_t>(node.output)],
                      .scratch = buffers_.scratch[static_cast<size_t>(n)],
                      .rng = rng,
                      .replicas = training ? replicas_ : nullptr};
}

void GraphExecutor::Forward(const float* x, int64_t batch, bool training,
                            std::span<const float* const> variables, RandomStream& rng,
                            std::span<const VariableRows> rows) {
  // The model's inputs: x itself for one input; for several, x's columns split into one
  // buffer each, in the order of the model's inputs.
  if (model_.inputs.size() == 1) {
    act_[static_cast<size_t>(model_.inputs[0])] = x;
  } else {
    const int64_t total = model_.input_shape.num_elements();
    int64_t offset = 0;
    for (int id : model_.inputs) {
      const int64_t size = model_.tensors[static_cast<size_t>(id)].size;
      float* out = buffers_.values[static_cast<size_t>(id)];
      device_.CopyBlocks(x + offset, total, out, size, batch, size, false);
      act_[static_cast<size_t>(id)] = out;
      offset += size;
    }
  }
  for (size_t n = 0; n < model_.nodes.size(); ++n) {
    const GraphNode& node = model_.nodes[n];
    const auto out = static_cast<size_t>(node.output);
    if (node.layer->IsIdentity(training)) {
      act_[out] = act_[static_cast<size_t>(node.inputs[0])];
      continue;
    }
    NodeArgs& args = args_[n];
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      args.inputs[i] = act_[static_cast<size_t>(node.inputs[i])];
    }
    for (size_t v = 0; v < node.variables.size(); ++v) {
      args.variables[v] = variables[static_cast<size_t>(node.variables[v])];
    }
    if (rows.empty()) {
      args.rows.clear();
    } else {
      args.rows.resize(node.variables.size());
      for (size_t v = 0; v < node.variables.size(); ++v) {
        args.rows[v] = rows[static_cast<size_t>(node.variables[v])];
      }
    }
    const LayerForward forward = ForwardArgs(static_cast<int>(n), batch, training, &rng);
    node.layer->Forward(forward);
    act_[out] = forward.output;
  }
}

const float* GraphExecutor::Output(size_t i) const {
  return act_[static_cast<size_t>(model_.outputs[i])];
}

const float* GraphExecutor::Logits(int fused, int64_t batch, bool training) const {
  if (fused < 0) return nullptr;
  return model_.nodes[static_cast<size_t>(fused)].layer->Logits(
      ForwardArgs(fused, batch, training, nullptr));
}

float* GraphExecutor::StartGradients(int fused) {
  for (size_t t = 0; t < model_.tensors.size(); ++t) {
    grad_[t] = buffers_.grads[t];
    grad_ready_[t] = 0;
  }
  const auto seed = static_cast<size_t>(fused >= 0 ? model_.nodes[static_cast<size_t>(fused)].output
                                                   : model_.outputs[0]);
  grad_ready_[seed] = 1;
  return grad_[seed];
}

// Hands `grad` (the gradient of a tensor read only as an identity layer's input) to `input`:
// the same buffer when nothing else writes the input's gradient, else added to it.
void GraphExecutor::PassGradient(int input, float* grad, int64_t batch) {
  const auto t = static_cast<size_t>(input);
  if (!model_.tensors[t].needs_grad) return;
  if (!grad_ready_[t] && model_.tensors[t].consumers == 1) {
    grad_[t] = grad;
  } else {
    device_.Copy(grad, grad_[t], batch * model_.tensors[t].size, grad_ready_[t] != 0);
  }
  grad_ready_[t] = 1;
}

// Where node n writes the gradient of its input i, and whether it adds to it.
void GraphExecutor::PointGradInput(int n, size_t i, float* grad_output) {
  const GraphNode& node = model_.nodes[static_cast<size_t>(n)];
  NodeArgs& args = args_[static_cast<size_t>(n)];
  const auto t = static_cast<size_t>(node.inputs[i]);
  if (!model_.tensors[t].needs_grad) {
    args.grad_inputs[i] = nullptr;
    args.accumulate[i] = false;
    return;
  }
  if (i == 0 && node.layer->BackwardInPlace() && !grad_ready_[t] &&
      model_.tensors[t].consumers == 1) {
    grad_[t] = grad_output;
  }
  args.grad_inputs[i] = grad_[t];
  args.accumulate[i] = grad_ready_[t] != 0;
  grad_ready_[t] = 1;
}

void GraphExecutor::Backward(int64_t batch, bool training, int fused,
                             std::span<float* const> gradients, float replica_share) {
  for (int n = static_cast<int>(model_.nodes.size()) - 1; n >= 0; --n) {
    const GraphNode& node = model_.nodes[static_cast<size_t>(n)];
    const auto out = static_cast<size_t>(node.output);
    if (!grad_ready_[out] || !model_.tensors[out].needs_grad) continue;
    float* grad = grad_[out];
    if (node.layer->IsIdentity(training)) {
      PassGradient(node.inputs[0], grad, batch);
      continue;
    }
    NodeArgs& args = args_[static_cast<size_t>(n)];
    for (size_t i = 0; i < node.inputs.size(); ++i) PointGradInput(n, i, grad);
    for (size_t v = 0; v < node.variables.size(); ++v) {
      args.grad_variables[v] = gradients[static_cast<size_t>(node.variables[v])];
    }
    const LayerForward forward = ForwardArgs(n, batch, training, nullptr);
    node.layer->Backward(LayerBackward{
        .device = &device_,
        .batch = batch,
        .training = training,
        .inputs = forward.inputs,
        .variables = forward.variables,
        .variable_rows = forward.variable_rows,
        .output = act_[out],
        .scratch = forward.scratch,
        .grad_output = grad,
        .fused_activation = n == fused,
        .grad_inputs = args.grad_inputs,
        .accumulate = std::span<const bool>(args.accumulate.get(), node.inputs.size()),
        .grad_variables = args.grad_variables,
        .replica_share = replica_share,
        .replicas = forward.replicas});
  }
}

void GraphExecutor::SyncWithoutExamples() {
  if (replicas_ == nullptr || !model_.synchronized) return;
  std::vector<float> zeros;
  auto sum = [&](int64_t n) {
    zeros.assign(static_cast<size_t>(n), 0.0f);
    replicas_->Sum(zeros.data(), n, 0);
  };
  for (const GraphNode& node : model_.nodes) {
    if (!node.synchronized) continue;
    for (int64_t n : node.layer->CrossReplicaSums(false)) sum(n);
  }
  for (auto node = model_.nodes.rbegin(); node != model_.nodes.rend(); ++node) {
    if (!node->synchronized) continue;
    for (int64_t n : node->layer->CrossReplicaSums(true)) sum(n);
  }
}

}  // namespace stratum

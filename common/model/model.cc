#include "stratum/model/model.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/keras_config.h"
#include "common/model/model_graph.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using keras::json;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Keras' fans: a 2-D kernel [in, out]; a vector counts as both.
std::pair<double, double> Fans(const Shape& shape) {
  if (shape.rank() == 2) return {static_cast<double>(shape.dim(0)), double(shape.dim(1))};
  const double n = static_cast<double>(shape.num_elements());
  return {n, n};
}

// Scratch floats aligned as Eigen's packets are. Eigen's vectorised sums peel a start that
// is not packet-aligned, so the rounding of a sum depends on where its buffer lies: with
// malloc's 16-byte alignment, a multi-threaded process (whose allocation addresses vary from
// run to run) trained to different bits each run.
using Floats = std::vector<float, Eigen::aligned_allocator<float>>;

// The pointer lists one node's Forward and Backward take, kept so a step allocates nothing.
struct NodeArgs {
  std::vector<const float*> inputs;
  std::vector<const float*> variables;
  std::vector<float*> grad_inputs;
  std::vector<float*> grad_variables;
  std::unique_ptr<bool[]> accumulate;
};

}  // namespace

int Model::Impl::SoftmaxOutputNode(bool training) const {
  if (outputs.size() != 1) return -1;
  int tensor = outputs[0];
  while (true) {
    const int n = tensors[static_cast<size_t>(tensor)].producer;
    if (n < 0) return -1;
    const GraphNode& node = nodes[static_cast<size_t>(n)];
    if (!node.layer->IsIdentity(training)) return node.layer->EndsInSoftmax() ? n : -1;
    tensor = node.inputs[0];
    // The loss's gradient skips the softmax only when nothing else reads the chain.
    if (training && tensors[static_cast<size_t>(tensor)].consumers != 1) return -1;
  }
}

struct Workspace::State {
  explicit State(uint64_t seed) : rng(seed) {}

  int64_t capacity = 0;
  std::vector<int64_t> signature;
  std::vector<Floats> values;       // per tensor: its own buffer, where it has one
  std::vector<const float*> act;    // per tensor: where its values are this step
  std::vector<Floats> grad_values;  // per tensor that needs a gradient
  std::vector<float*> grad;         // per tensor: where its gradient is this step
  std::vector<char> grad_ready;     // per tensor: written this step (later writes add)
  std::vector<Floats> scratch;      // per node
  std::vector<NodeArgs> args;       // per node
  RandomStream rng;
};

Workspace::Workspace(std::unique_ptr<State> state) : state_(std::move(state)) {}
Workspace::~Workspace() = default;
int64_t Workspace::capacity() const { return state_->capacity; }
void Workspace::Reseed(uint64_t seed) { state_->rng.seed(seed); }

namespace {

const Device& Cpu() { return CpuDevice(); }

void Grow(const Model::Impl& model, Workspace::State& ws, int64_t batch) {
  if (batch <= ws.capacity) return;
  for (size_t t = 0; t < model.tensors.size(); ++t) {
    const GraphTensor& tensor = model.tensors[t];
    const auto size = static_cast<size_t>(batch * tensor.size);
    const bool own =
        tensor.producer < 0
            ? model.inputs.size() > 1  // several inputs: split from x
            : !(model.nodes[static_cast<size_t>(tensor.producer)].layer->IsIdentity(true) &&
                model.nodes[static_cast<size_t>(tensor.producer)].layer->IsIdentity(false));
    if (own) ws.values[t].resize(size);
    if (tensor.needs_grad) ws.grad_values[t].resize(size);
  }
  for (size_t n = 0; n < model.nodes.size(); ++n) {
    ws.scratch[n].resize(static_cast<size_t>(batch * model.nodes[n].scratch_per_example));
  }
  ws.capacity = batch;
}

// Points the model's inputs at the batch: x itself for one input; for several, x's columns
// split into one buffer each, in the order of the model's inputs.
void FeedInputs(const Model::Impl& model, const float* x, int64_t batch, Workspace::State& ws) {
  if (model.inputs.size() == 1) {
    ws.act[static_cast<size_t>(model.inputs[0])] = x;
    return;
  }
  const int64_t total = model.input_shape.num_elements();
  int64_t offset = 0;
  for (int id : model.inputs) {
    const int64_t size = model.tensors[static_cast<size_t>(id)].size;
    float* out = ws.values[static_cast<size_t>(id)].data();
    Cpu().CopyBlocks(x + offset, total, out, size, batch, size, false);
    ws.act[static_cast<size_t>(id)] = out;
    offset += size;
  }
}

LayerForward ForwardArgs(const Model::Impl& model, int n, int64_t batch, bool training,
                         Workspace::State& ws) {
  const GraphNode& node = model.nodes[static_cast<size_t>(n)];
  NodeArgs& args = ws.args[static_cast<size_t>(n)];
  return LayerForward{.device = &Cpu(),
                      .batch = batch,
                      .training = training,
                      .inputs = args.inputs,
                      .variables = args.variables,
                      .output = ws.values[static_cast<size_t>(node.output)].data(),
                      .scratch = ws.scratch[static_cast<size_t>(n)].data(),
                      .rng = &ws.rng};
}

// The forward pass; afterwards ws.act holds every tensor.
void Forward(const Model::Impl& model, const std::vector<Tensor>& variables, const float* x,
             int64_t batch, bool training, Workspace::State& ws) {
  FeedInputs(model, x, batch, ws);
  for (size_t n = 0; n < model.nodes.size(); ++n) {
    const GraphNode& node = model.nodes[n];
    const auto out = static_cast<size_t>(node.output);
    if (node.layer->IsIdentity(training)) {
      ws.act[out] = ws.act[static_cast<size_t>(node.inputs[0])];
      continue;
    }
    NodeArgs& args = ws.args[n];
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      args.inputs[i] = ws.act[static_cast<size_t>(node.inputs[i])];
    }
    for (size_t v = 0; v < node.variables.size(); ++v) {
      args.variables[v] = variables[static_cast<size_t>(node.variables[v])].data<float>();
    }
    const LayerForward forward = ForwardArgs(model, static_cast<int>(n), batch, training, ws);
    node.layer->Forward(forward);
    ws.act[out] = forward.output;
  }
}

// Hands `grad` (the gradient of a tensor read only as an identity layer's input) to `input`:
// the same buffer when nothing else writes the input's gradient, else added to it.
void PassGradient(const Model::Impl& model, int input, float* grad, int64_t batch,
                  Workspace::State& ws) {
  const auto t = static_cast<size_t>(input);
  if (!model.tensors[t].needs_grad) return;
  if (!ws.grad_ready[t] && model.tensors[t].consumers == 1) {
    ws.grad[t] = grad;
  } else {
    Cpu().Copy(grad, ws.grad[t], batch * model.tensors[t].size, ws.grad_ready[t] != 0);
  }
  ws.grad_ready[t] = 1;
}

// Where node n writes the gradient of its input i, and whether it adds to it.
void PointGradInput(const Model::Impl& model, const GraphNode& node, size_t i, float* grad_output,
                    NodeArgs& args, Workspace::State& ws) {
  const auto t = static_cast<size_t>(node.inputs[i]);
  if (!model.tensors[t].needs_grad) {
    args.grad_inputs[i] = nullptr;
    args.accumulate[i] = false;
    return;
  }
  if (i == 0 && node.layer->BackwardInPlace() && !ws.grad_ready[t] &&
      model.tensors[t].consumers == 1) {
    ws.grad[t] = grad_output;
  }
  args.grad_inputs[i] = ws.grad[t];
  args.accumulate[i] = ws.grad_ready[t] != 0;
  ws.grad_ready[t] = 1;
}

// Clears the step's gradients, and returns the buffer the loss writes its gradient into:
// the output's, or (with `fused`) the softmax node's output's, taken as its logits'. nullptr
// when nothing in the model is trainable.
float* StartGradients(const Model::Impl& model, int fused, Workspace::State& ws) {
  for (size_t t = 0; t < model.tensors.size(); ++t) {
    ws.grad[t] = ws.grad_values[t].empty() ? nullptr : ws.grad_values[t].data();
    ws.grad_ready[t] = 0;
  }
  const auto seed = static_cast<size_t>(fused >= 0 ? model.nodes[static_cast<size_t>(fused)].output
                                                   : model.outputs[0]);
  ws.grad_ready[seed] = 1;
  return ws.grad[seed];
}

// The backward pass, after StartGradients and the loss.
void Backward(const Model::Impl& model, int64_t batch, bool training, int fused,
              Workspace::State& ws, std::vector<Tensor>& gradients) {
  for (int n = static_cast<int>(model.nodes.size()) - 1; n >= 0; --n) {
    const GraphNode& node = model.nodes[static_cast<size_t>(n)];
    const auto out = static_cast<size_t>(node.output);
    if (!ws.grad_ready[out] || !model.tensors[out].needs_grad) continue;
    float* grad = ws.grad[out];
    if (node.layer->IsIdentity(training)) {
      PassGradient(model, node.inputs[0], grad, batch, ws);
      continue;
    }
    NodeArgs& args = ws.args[static_cast<size_t>(n)];
    for (size_t i = 0; i < node.inputs.size(); ++i) PointGradInput(model, node, i, grad, args, ws);
    for (size_t v = 0; v < node.variables.size(); ++v) {
      args.grad_variables[v] = gradients[static_cast<size_t>(node.variables[v])].data<float>();
    }
    const LayerForward forward = ForwardArgs(model, n, batch, training, ws);
    node.layer->Backward(LayerBackward{
        .device = &Cpu(),
        .batch = batch,
        .training = training,
        .inputs = forward.inputs,
        .variables = forward.variables,
        .output = ws.act[out],
        .scratch = forward.scratch,
        .grad_output = grad,
        .fused_softmax = n == fused,
        .grad_inputs = args.grad_inputs,
        .accumulate = std::span<const bool>(args.accumulate.get(), node.inputs.size()),
        .grad_variables = args.grad_variables});
  }
}

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::Model(const Model& other) : impl_(std::make_unique<Impl>(*other.impl_)) {}
Model& Model::operator=(const Model& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(*other.impl_);
  return *this;
}
Model::~Model() = default;

absl::StatusOr<Model> Model::FromKerasJson(absl::string_view text) {
  absl::StatusOr<json> parsed = keras::ParseText(text);
  if (!parsed.ok()) return parsed.status();
  return FromKerasJson(*parsed);
}

absl::StatusOr<Model> Model::FromKerasJson(const std::string& text) {
  return FromKerasJson(absl::string_view(text));
}

absl::StatusOr<Model> Model::FromKerasJson(const char* text) {
  return FromKerasJson(absl::string_view(text));
}

absl::StatusOr<Model> Model::FromKerasJson(const json& input) {
  // Every access is type-checked; this is the safety net that keeps a JSON exception (or an
  // allocation failure) from crossing the component boundary.
  try {
    STRATUM_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, BuildModelGraph(input));
    return Model(std::move(impl));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model JSON has an unexpected structure (", e.what(),
                     "): pass the text of Keras' model.to_json() for a Sequential or Functional "
                     "model"));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "model JSON needs more memory than is available to load: pass a smaller model");
  }
}

const std::string& Model::name() const { return impl_->name; }
const std::vector<VariableSpec>& Model::variables() const { return impl_->variables; }
Shape Model::input_shape() const { return impl_->input_shape; }
int64_t Model::output_size() const { return impl_->output_size; }
const std::vector<std::string>& Model::input_names() const { return impl_->input_names; }
int Model::num_outputs() const { return static_cast<int>(impl_->outputs.size()); }

absl::StatusOr<std::vector<LayerInfo>> Model::LinearLayers() const {
  const Impl& model = *impl_;
  if (model.inputs.size() != 1 || model.outputs.size() != 1) {
    return absl::UnimplementedError(
        absl::StrCat("model \"", model.name, "\" has ", model.inputs.size(), " inputs and ",
                     model.outputs.size(), " outputs; the GPU path runs a single chain of layers"));
  }
  std::vector<LayerInfo> result;
  int previous = model.inputs[0];
  for (const GraphNode& node : model.nodes) {
    const std::string where = keras::Where(node.name, node.class_name);
    if (node.inputs.size() != 1 || node.inputs[0] != previous) {
      return absl::UnimplementedError(
          absl::StrCat(where,
                       " is not in a single chain of layers; the GPU path runs such chains (as a "
                       "Sequential model is)"));
    }
    std::optional<LayerInfo> info = node.layer->GpuInfo();
    if (!info) return absl::UnimplementedError(absl::StrCat(where, " has no CUDA kernel yet"));
    const Shape& in = model.tensors[static_cast<size_t>(node.inputs[0])].shape;
    const Shape& out = model.tensors[static_cast<size_t>(node.output)].shape;
    info->name = node.name;
    info->in_size = in.num_elements();
    info->out_size = out.num_elements();
    info->in_width = in.dim(in.rank() - 1);
    info->out_width = out.dim(out.rank() - 1);
    if (!node.variables.empty()) info->kernel = node.variables[0];
    if (node.variables.size() > 1) info->bias = node.variables[1];
    result.push_back(std::move(*info));
    previous = node.output;
  }
  return result;
}

int64_t Model::num_parameters() const {
  int64_t total = 0;
  for (const VariableSpec& spec : impl_->variables) total += spec.shape.num_elements();
  return total;
}

namespace {

std::string WithCommas(int64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string Pad(std::string text, size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text + " ";
}

}  // namespace

std::string Model::Summary() const {
  const Impl& model = *impl_;
  // Keras' functional summary adds the inputs and a "Connected to" column.
  const bool functional = !model.sequential;
  const size_t width = functional ? 98 : 65;
  std::ostringstream out;
  const std::string rule(width, '_');
  out << "Model: \"" << model.name << "\"\n" << rule << "\n";
  out << Pad(" Layer (type)", 28) << Pad("Output Shape", 25)
      << (functional ? Pad("Param #", 10) + "Connected to" : std::string("Param #")) << "\n";
  out << std::string(width, '=') << "\n";
  std::vector<std::string> producer_names(model.tensors.size());
  for (size_t i = 0; i < model.inputs.size(); ++i) {
    producer_names[static_cast<size_t>(model.inputs[i])] = model.input_names[i];
    if (!functional) continue;
    out << Pad(absl::StrCat(" ", model.input_names[i], " (InputLayer)"), 28)
        << Pad(keras::ShapeWithBatch(model.tensors[static_cast<size_t>(model.inputs[i])].shape), 25)
        << Pad("0", 10) << "[]\n";
  }
  for (const GraphNode& node : model.nodes) {
    producer_names[static_cast<size_t>(node.output)] = node.name;
    out << Pad(absl::StrCat(" ", node.name, " (", node.class_name, ")"), 28)
        << Pad(keras::ShapeWithBatch(model.tensors[static_cast<size_t>(node.output)].shape), 25);
    if (!functional) {
      out << WithCommas(node.parameters) << "\n";
      continue;
    }
    std::vector<std::string> inputs;
    for (int id : node.inputs)
      inputs.push_back(absl::StrCat("'", producer_names[static_cast<size_t>(id)], "[0][0]'"));
    out << Pad(WithCommas(node.parameters), 10) << "[" << absl::StrJoin(inputs, ", ") << "]\n";
  }
  out << std::string(width, '=') << "\n";
  out << "Total params: " << WithCommas(num_parameters()) << "\n";
  out << "Trainable params: " << WithCommas(num_parameters()) << "\n";
  out << "Non-trainable params: 0\n" << rule << "\n";
  return out.str();
}

std::vector<Tensor> Model::InitialVariables(uint64_t seed) const {
  std::vector<Tensor> result;
  for (size_t v = 0; v < impl_->variables.size(); ++v) {
    const VariableSpec& spec = impl_->variables[v];
    Tensor tensor(DType::kFloat32, spec.shape);
    auto flat = tensor.Flat();
    const auto [fan_in, fan_out] = Fans(spec.shape);
    double limit = 0;
    if (spec.initializer == "glorot_uniform") limit = std::sqrt(6.0 / (fan_in + fan_out));
    if (spec.initializer == "he_uniform") limit = std::sqrt(6.0 / fan_in);
    if (spec.initializer == "lecun_uniform") limit = std::sqrt(3.0 / fan_in);
    if (spec.initializer == "ones") flat.setConstant(1.0f);
    if (limit > 0) {
      // A seed of the initializer's own gives the same values in every run, as in Keras
      // (two such initializers with one seed give one another's values, as there too).
      RandomStream rng(spec.seed.has_value() ? SplitMix64(*spec.seed)
                                             : SplitMix64(seed ^ SplitMix64(v + 1)));
      const auto l = static_cast<float>(limit);
      for (Eigen::Index j = 0; j < flat.size(); ++j) flat[j] = l * (2 * Uniform01(rng) - 1);
    }
    result.push_back(std::move(tensor));
  }
  return result;
}

namespace {

// A model trains and evaluates with one output (one loss, one set of targets).
absl::Status CheckOneOutput(const Model::Impl& model) {
  if (model.outputs.size() == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model \"", model.name, "\" has ", model.outputs.size(),
      " outputs, but Stratum trains and evaluates a model with one (one loss on one set of "
      "targets): give the model a single output, such as a Concatenate of the outputs followed "
      "by a Dense layer"));
}

}  // namespace

absl::Status Model::CheckLoss(const Loss& loss) const {
  STRATUM_RETURN_IF_ERROR(CheckOneOutput(*impl_));
  if (!loss.is_crossentropy() || !loss.from_logits()) return absl::OkStatus();
  const int softmax = impl_->SoftmaxOutputNode(false);
  if (softmax < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "loss ", loss.name(), " has from_logits true, but the model's output (layer \"",
      impl_->nodes[static_cast<size_t>(softmax)].name,
      "\") is a softmax, so it gives probabilities, not logits: set from_logits to false, or "
      "make the last layer's activation linear"));
}

std::unique_ptr<Workspace> Model::NewWorkspace(uint64_t seed) const {
  const Impl& model = *impl_;
  auto state = std::make_unique<Workspace::State>(seed);
  state->signature = model.signature;
  const size_t tensors = model.tensors.size();
  state->values.resize(tensors);
  state->act.resize(tensors);
  state->grad_values.resize(tensors);
  state->grad.resize(tensors);
  state->grad_ready.resize(tensors);
  state->scratch.resize(model.nodes.size());
  state->args.resize(model.nodes.size());
  for (size_t n = 0; n < model.nodes.size(); ++n) {
    const GraphNode& node = model.nodes[n];
    NodeArgs& args = state->args[n];
    args.inputs.resize(node.inputs.size());
    args.variables.resize(node.variables.size());
    args.grad_inputs.resize(node.inputs.size());
    args.grad_variables.resize(node.variables.size());
    args.accumulate = std::make_unique<bool[]>(node.inputs.size());
  }
  return std::make_unique<Workspace>(std::move(state));
}

namespace {

absl::StatusOr<int64_t> CheckInputs(const Model::Impl& model, const std::vector<Tensor>& variables,
                                    const Tensor& x, Workspace& ws) {
  if (ws.state().signature != model.signature) {
    return absl::InvalidArgumentError(
        absl::StrCat("the workspace was made for another model than \"", model.name,
                     "\": create it with this model's NewWorkspace()"));
  }
  if (variables.size() != model.variables.size()) {
    std::vector<std::string> names;
    for (const VariableSpec& spec : model.variables) names.push_back(spec.name);
    return absl::InvalidArgumentError(absl::StrCat(
        "variables has ", variables.size(), " tensors, but model \"", model.name, "\" has ",
        model.variables.size(), " (", absl::StrJoin(names, ", "),
        "): pass the tensors of InitialVariables() or of a checkpoint, in that order"));
  }
  for (size_t i = 0; i < variables.size(); ++i) {
    const VariableSpec& spec = model.variables[i];
    if (!variables[i].valid() || variables[i].dtype() != DType::kFloat32 ||
        variables[i].shape() != spec.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", i, " (\"", spec.name, "\") is ",
                       variables[i].valid() ? variables[i].DebugString() : std::string("empty"),
                       ", but the model expects float32", spec.shape.ToString(),
                       ": pass the model's variables in the order of Model::variables()"));
    }
  }
  const Shape& in = model.input_shape;
  // Compared in place: a step must not allocate.
  bool shaped = x.valid() && x.shape().rank() == in.rank() + 1;
  for (int d = 0; shaped && d < in.rank(); ++d) shaped = x.shape().dim(d + 1) == in.dim(d);
  const bool flat = x.valid() && x.shape().rank() == 2 && x.shape().dim(1) == in.num_elements();
  if (!x.valid() || x.dtype() != DType::kFloat32 || !(shaped || flat)) {
    std::vector<int64_t> expected = {x.valid() && x.shape().rank() > 0 ? x.shape().dim(0) : 0};
    expected.insert(expected.end(), in.dims().begin(), in.dims().end());
    return absl::InvalidArgumentError(
        absl::StrCat("x is ", x.valid() ? x.DebugString() : std::string("empty"), ", but model \"",
                     model.name, "\" takes float32 inputs of shape ", Shape(expected).ToString(),
                     " (batch first): convert or reshape the batch"));
  }
  return x.shape().dim(0);
}

void EnsureGradients(const Model::Impl& model, std::vector<Tensor>& gradients) {
  if (gradients.size() != model.variables.size()) gradients.resize(model.variables.size());
  for (size_t i = 0; i < gradients.size(); ++i) {
    const Shape& shape = model.variables[i].shape;
    if (!gradients[i].valid() || gradients[i].dtype() != DType::kFloat32 ||
        gradients[i].shape() != shape) {
      gradients[i] = Tensor(DType::kFloat32, shape);
    }
  }
}

// The output's values after Forward, [batch, output size].
ConstMatrixMap OutputOf(const Model::Impl& model, const Workspace::State& ws, int64_t batch) {
  return ConstMatrixMap(ws.act[static_cast<size_t>(model.outputs[0])], batch, model.output_size);
}

// The logits of the fused softmax node after Forward, or nullptr.
const float* LogitsOf(const Model::Impl& model, int fused, int64_t batch, bool training,
                      Workspace::State& ws) {
  if (fused < 0) return nullptr;
  return model.nodes[static_cast<size_t>(fused)].layer->SoftmaxLogits(
      ForwardArgs(model, fused, batch, training, ws));
}

}  // namespace

absl::StatusOr<StepStats> Model::TrainStep(const std::vector<Tensor>& variables, const Tensor& x,
                                           const Tensor& y, const Loss& loss, float loss_scale,
                                           Workspace& ws, std::vector<Tensor>& gradients) const {
  STRATUM_RETURN_IF_ERROR(CheckOneOutput(*impl_));
  STRATUM_ASSIGN_OR_RETURN(const int64_t batch, CheckInputs(*impl_, variables, x, ws));
  STRATUM_RETURN_IF_ERROR(loss.ValidateTargets(y, batch, impl_->output_size));
  EnsureGradients(*impl_, gradients);
  if (batch == 0) {
    for (Tensor& gradient : gradients) gradient.SetZero();
    return StepStats{};
  }
  Workspace::State& state = ws.state();
  Grow(*impl_, state, batch);
  Forward(*impl_, variables, x.data<float>(), batch, true, state);
  const int fused = loss.is_crossentropy() ? impl_->SoftmaxOutputNode(true) : -1;
  float* loss_grad = StartGradients(*impl_, fused, state);
  const StepStats stats =
      loss.Compute(OutputOf(*impl_, state, batch), LogitsOf(*impl_, fused, batch, true, state), y,
                   loss_scale, loss_grad);
  if (loss_grad != nullptr) Backward(*impl_, batch, true, fused, state, gradients);
  return stats;
}

absl::StatusOr<StepStats> Model::Evaluate(const std::vector<Tensor>& variables, const Tensor& x,
                                          const Tensor& y, const Loss& loss, Workspace& ws) const {
  STRATUM_RETURN_IF_ERROR(CheckOneOutput(*impl_));
  STRATUM_ASSIGN_OR_RETURN(const int64_t batch, CheckInputs(*impl_, variables, x, ws));
  STRATUM_RETURN_IF_ERROR(loss.ValidateTargets(y, batch, impl_->output_size));
  if (batch == 0) return StepStats{};
  Workspace::State& state = ws.state();
  Grow(*impl_, state, batch);
  Forward(*impl_, variables, x.data<float>(), batch, false, state);
  const int fused = loss.is_crossentropy() ? impl_->SoftmaxOutputNode(false) : -1;
  return loss.Compute(OutputOf(*impl_, state, batch), LogitsOf(*impl_, fused, batch, false, state),
                      y, 1.0f, nullptr);
}

absl::StatusOr<Tensor> Model::Predict(const std::vector<Tensor>& variables, const Tensor& x,
                                      Workspace& ws) const {
  STRATUM_ASSIGN_OR_RETURN(const int64_t batch, CheckInputs(*impl_, variables, x, ws));
  Tensor result(DType::kFloat32, Shape({batch, impl_->output_size}));
  if (batch == 0) return result;
  Workspace::State& state = ws.state();
  Grow(*impl_, state, batch);
  Forward(*impl_, variables, x.data<float>(), batch, false, state);
  // Several outputs side by side, in the model's order.
  int64_t offset = 0;
  for (int id : impl_->outputs) {
    const int64_t size = impl_->tensors[static_cast<size_t>(id)].size;
    Cpu().CopyBlocks(state.act[static_cast<size_t>(id)], size, result.data<float>() + offset,
                     impl_->output_size, batch, size, false);
    offset += size;
  }
  return result;
}

}  // namespace stratum

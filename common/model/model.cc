#include "stratum/model/model.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/graph_executor.h"
#include "common/model/keras_config.h"
#include "common/model/model_graph.h"
#include "stratum/util/sort_unique.h"
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

// Keras' fans: a 2-D kernel [in, out]; a convolution kernel [..., in, out] times its
// receptive field (the product of the leading dimensions); a vector counts as both.
std::pair<double, double> Fans(const Shape& shape) {
  if (shape.rank() < 2) {
    const double n = static_cast<double>(shape.num_elements());
    return {n, n};
  }
  double field = 1;
  for (int d = 0; d + 2 < shape.rank(); ++d) field *= static_cast<double>(shape.dim(d));
  return {static_cast<double>(shape.dim(shape.rank() - 2)) * field,
          static_cast<double>(shape.dim(shape.rank() - 1)) * field};
}

// Scratch floats aligned as Eigen's packets are. Eigen's vectorised sums peel a start that
// is not packet-aligned, so the rounding of a sum depends on where its buffer lies: with
// malloc's 16-byte alignment, a multi-threaded process (whose allocation addresses vary from
// run to run) trained to different bits each run.
using Floats = std::vector<float, Eigen::aligned_allocator<float>>;

}  // namespace

int Model::Impl::LogitsOutputNode(bool training, ActivationKind activation) const {
  if (outputs.size() != 1) return -1;
  int tensor = outputs[0];
  while (true) {
    const int n = tensors[static_cast<size_t>(tensor)].producer;
    if (n < 0) return -1;
    const GraphNode& node = nodes[static_cast<size_t>(n)];
    if (!node.layer->IsIdentity(training)) {
      return node.layer->FusableActivation() == activation ? n : -1;
    }
    tensor = node.inputs[0];
    // The loss's gradient skips the softmax only when nothing else reads the chain.
    if (training && tensors[static_cast<size_t>(tensor)].consumers != 1) return -1;
  }
}

int Model::Impl::FusedOutputNode(bool training, const Loss& loss) const {
  const ActivationKind activation = loss.fused_activation();
  return activation == ActivationKind::kLinear ? -1 : LogitsOutputNode(training, activation);
}

namespace {

// The workspace's CrossReplicaSum: the values and the row count, as one tensor, through the
// caller's ReplicaSum. The first failure is kept; later sums do nothing.
class ReplicaSumAdapter final : public CrossReplicaSum {
 public:
  explicit ReplicaSumAdapter(Workspace::ReplicaSum sum) : sum_(std::move(sum)) {}

  int64_t Sum(float* values, int64_t n, int64_t count) override {
    if (!status_.ok()) return count;
    std::vector<Tensor>& buffer = BufferOf(n + 1);
    float* data = buffer[0].data<float>();
    std::copy(values, values + n, data);
    data[n] = static_cast<float>(count);  // exact below 2^24 rows
    status_ = sum_(buffer);
    if (!status_.ok()) return count;
    std::copy(data, data + n, values);
    return static_cast<int64_t>(std::lround(data[n]));
  }

  // The first failure since the last call, which clears it.
  absl::Status TakeStatus() { return std::exchange(status_, absl::OkStatus()); }

 private:
  // One buffer per size, kept: a step allocates nothing once it has run.
  std::vector<Tensor>& BufferOf(int64_t n) {
    for (std::vector<Tensor>& buffer : buffers_) {
      if (buffer[0].num_elements() == n) return buffer;
    }
    buffers_.push_back({Tensor(DType::kFloat32, Shape({n}))});
    return buffers_.back();
  }

  Workspace::ReplicaSum sum_;
  absl::Status status_;
  std::deque<std::vector<Tensor>> buffers_;  // a deque: references stay valid as it grows
};

}  // namespace

struct Workspace::State {
  State(const Model::Impl& model, uint64_t seed)
      : signature(model.signature),
        sizes(BufferSizes(model)),
        executor(model, CpuDevice()),
        rng(seed) {
    for (const VariableSpec& spec : model.variables) {
      table_rows.push_back(spec.row_sparse ? spec.shape.dim(0) : -1);
    }
    takes_ids = std::find(model.input_takes_ids.begin(), model.input_takes_ids.end(), true) !=
                model.input_takes_ids.end();
    input_width = model.input_shape.num_elements();
  }

  int64_t capacity = 0;
  bool takes_ids = false;
  int64_t input_width = 0;
  std::vector<int64_t> signature;
  GraphBufferSizes sizes;
  std::vector<Floats> values, grads, scratch;  // as sizes says, for `capacity` examples
  GraphExecutor executor;
  std::vector<const float*> variables;  // this step's, one pointer per model variable
  std::vector<float*> gradients;
  RandomStream rng;
  std::unique_ptr<ReplicaSumAdapter> replica_sum;  // set by SetReplicaSum
  std::vector<int64_t> table_rows;  // per variable: its rows when row-sparse, else -1
  // Set by SetVariableRows: per variable, the rows given (rows[v] is valid where
  // row_views[v].count >= 0); row_views is empty while every variable is whole.
  std::vector<std::vector<int64_t>> rows;
  std::vector<VariableRows> row_views;
  Floats id_words;  // x as the executor takes it, for float32 x of a model that takes ids
};

Workspace::Workspace(std::unique_ptr<State> state) : state_(std::move(state)) {}
Workspace::~Workspace() = default;
int64_t Workspace::capacity() const { return state_->capacity; }
void Workspace::Reseed(uint64_t seed) { state_->rng.seed(seed); }
void Workspace::SetReplicaSum(ReplicaSum sum) {
  state_->replica_sum = std::make_unique<ReplicaSumAdapter>(std::move(sum));
  state_->executor.set_replicas(state_->replica_sum.get());
}

absl::Status Workspace::SetVariableRows(int variable, std::vector<int64_t> rows) {
  State& ws = *state_;
  const auto v = static_cast<size_t>(variable);
  if (variable < 0 || v >= ws.table_rows.size() || ws.table_rows[v] < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "variable ", variable,
        " is not row-sparse (an embedding table read straight from a model input, without a "
        "regularizer): give it whole"));
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= ws.table_rows[v] || (i > 0 && rows[i] <= rows[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("the rows given of variable ", variable,
                       " are not sorted, unique and within its ", ws.table_rows[v], " rows (row ",
                       rows[i], " at position ", i, "): pass Model::RowsRead's"));
    }
  }
  ws.rows.resize(ws.table_rows.size());
  ws.row_views.resize(ws.table_rows.size());
  ws.rows[v] = std::move(rows);
  ws.row_views[v] = {ws.rows[v].data(), static_cast<int64_t>(ws.rows[v].size())};
  return absl::OkStatus();
}

absl::Status Workspace::SetVariableRows(const std::vector<int>& variables,
                                        const std::vector<std::vector<int64_t>>& rows) {
  for (size_t i = 0; i < variables.size() && i < rows.size(); ++i) {
    STRATUM_RETURN_IF_ERROR(SetVariableRows(variables[i], rows[i]));
  }
  return absl::OkStatus();
}

void Workspace::ClearVariableRows() {
  state_->rows.clear();
  state_->row_views.clear();
}

namespace {

const Device& Cpu() { return CpuDevice(); }

// Buffers of `floats` each; nullptr where a size is 0.
std::vector<float*> Allocate(const std::vector<int64_t>& floats, std::vector<Floats>& storage) {
  storage.resize(floats.size());
  std::vector<float*> pointers;
  for (size_t i = 0; i < floats.size(); ++i) {
    storage[i].resize(static_cast<size_t>(floats[i]));
    pointers.push_back(floats[i] > 0 ? storage[i].data() : nullptr);
  }
  return pointers;
}

void Grow(Workspace::State& ws, int64_t batch) {
  if (batch <= ws.capacity) return;
  const GraphBufferSizes::Floats floats = ws.sizes.ForBatch(batch);
  ws.executor.Bind(GraphBuffers{.values = Allocate(floats.values, ws.values),
                                .grads = Allocate(floats.grads, ws.grads),
                                .scratch = Allocate(floats.scratch, ws.scratch)});
  if (ws.takes_ids) ws.id_words.resize(static_cast<size_t>(batch * ws.input_width));
  ws.capacity = batch;
}

// The failure of a synchronized layer's sum over the replicas during the step, if any.
absl::Status ReplicaSumStatus(Workspace::State& ws) {
  return ws.replica_sum != nullptr ? ws.replica_sum->TakeStatus() : absl::OkStatus();
}

// Calls `f(offset, size)` for the columns of each input that takes ids, offset and size in
// floats within an example of x.
template <typename F>
void ForIdColumns(const Model::Impl& model, F f) {
  int64_t offset = 0;
  for (size_t i = 0; i < model.inputs.size(); ++i) {
    const int64_t size = model.tensors[static_cast<size_t>(model.inputs[i])].size;
    if (model.input_takes_ids[i]) f(offset, size);
    offset += size;
  }
}

// x as the executor takes it: the ids of the inputs that take them as id words (IdWord).
// int32 x (a model that takes only ids) is that already; float32 x holds ids as values,
// which are turned into words in the workspace.
const float* ExecutorInput(const Model::Impl& model, const Tensor& x, int64_t batch,
                           Workspace::State& ws) {
  if (x.dtype() == DType::kInt32) return reinterpret_cast<const float*>(x.data<int32_t>());
  if (!ws.takes_ids) return x.data<float>();
  const int64_t width = ws.input_width;
  float* words = ws.id_words.data();
  std::copy_n(x.data<float>(), batch * width, words);
  ForIdColumns(model, [&](int64_t offset, int64_t size) {
    for (int64_t b = 0; b < batch; ++b) {
      float* ids = words + b * width + offset;
      for (int64_t k = 0; k < size; ++k) ids[k] = IdWordOfValue(ids[k]);
    }
  });
  return words;
}

void Forward(const Model::Impl& model, const std::vector<Tensor>& variables, const Tensor& x,
             int64_t batch, bool training, Workspace::State& ws) {
  for (size_t v = 0; v < variables.size(); ++v) ws.variables[v] = variables[v].data<float>();
  ws.executor.Forward(ExecutorInput(model, x, batch, ws), batch, training, ws.variables, ws.rng,
                      ws.row_views);
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

const std::vector<std::string>& Model::input_keys() const {
  return impl_->input_keys.empty() ? impl_->input_names : impl_->input_keys;
}

std::vector<Shape> Model::input_shapes() const {
  std::vector<Shape> shapes;
  for (int tensor : impl_->inputs)
    shapes.push_back(impl_->tensors[static_cast<size_t>(tensor)].shape);
  return shapes;
}
int Model::num_outputs() const { return static_cast<int>(impl_->outputs.size()); }

const char* DtypePolicyName(DtypePolicy policy) {
  switch (policy) {
    case DtypePolicy::kMixedBfloat16:
      return "mixed_bfloat16";
    case DtypePolicy::kMixedFloat16:
      return "mixed_float16";
    default:
      return "float32";
  }
}

std::string CpuPrecisionNote(DtypePolicy policy) {
  if (policy == DtypePolicy::kFloat32) return "";
  return absl::StrCat("dtype policy ", DtypePolicyName(policy),
                      ": the CPU computes the model in float32 (half precision runs on GPUs)");
}

DtypePolicy Model::dtype_policy() const { return impl_->dtype_policy; }

bool Model::takes_ids() const {
  return std::find(impl_->input_takes_ids.begin(), impl_->input_takes_ids.end(), true) !=
         impl_->input_takes_ids.end();
}

bool Model::takes_only_ids() const {
  return std::find(impl_->input_takes_ids.begin(), impl_->input_takes_ids.end(), false) ==
         impl_->input_takes_ids.end();
}

absl::Status Model::CheckRunsOnGpu() const {
  if (takes_ids() && !takes_only_ids()) {
    return absl::UnimplementedError(
        "the model takes ids on some inputs and values on others, which the GPU path does not "
        "gather yet (it gathers all ids or all values)");
  }
  for (const VariableSpec& spec : impl_->variables) {
    if (spec.l1 == 0 && spec.l2 == 0) continue;
    return absl::UnimplementedError(absl::StrCat(
        "variable \"", spec.name, "\" has a regularizer, which has no CUDA kernel yet"));
  }
  for (const GraphNode& node : impl_->nodes) {
    if (node.layer->RunsOnGpu()) continue;
    return absl::UnimplementedError(
        absl::StrCat(keras::Where(node.name, node.class_name), " has no CUDA kernel yet"));
  }
  return absl::OkStatus();
}

int64_t Model::num_parameters() const {
  int64_t total = 0;
  for (const VariableSpec& spec : impl_->variables) total += spec.shape.num_elements();
  return total;
}

absl::StatusOr<std::vector<int64_t>> Model::RowsRead(const std::vector<const Tensor*>& xs,
                                                     int variable) const {
  const auto v = static_cast<size_t>(variable);
  if (variable < 0 || v >= impl_->variables.size() || !impl_->variables[v].row_sparse) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable ", variable, " of model \"", impl_->name,
                     "\" is not row-sparse (an embedding table read straight from a model input, "
                     "without a regularizer): it has no rows read by a batch"));
  }
  const int64_t table_rows = impl_->variables[v].shape.dim(0);
  const int64_t width = impl_->input_shape.num_elements();
  std::vector<int64_t> rows;
  for (const Tensor* x : xs) {
    if ((x->dtype() != DType::kFloat32 && (x->dtype() != DType::kInt32 || !takes_only_ids())) ||
        x->shape().rank() == 0 || x->num_elements() != x->rows() * width) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a batch of ", x->DebugString(), " is not one of model \"", impl_->name,
          "\", which takes ", takes_only_ids() ? "int32 (or float32) ids" : "float32 examples",
          " of ", width, " values: pass the batch TrainStep takes"));
    }
    const bool words = x->dtype() == DType::kInt32;
    const float* data =
        words ? reinterpret_cast<const float*>(x->data<int32_t>()) : x->data<float>();
    for (int64_t b = 0; b < x->rows(); ++b) {
      for (const Impl::Columns& columns : impl_->row_columns[v]) {
        const float* ids = data + b * width + columns.offset;
        for (int64_t k = 0; k < columns.size; ++k) {
          const int64_t row = EmbeddingRow(words ? ids[k] : IdWordOfValue(ids[k]), table_rows);
          if (row >= 0) rows.push_back(row);
        }
      }
    }
  }
  SortUnique(rows, table_rows);
  return rows;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> Model::RowsRead(
    const std::vector<const Tensor*>& xs, const std::vector<int>& variables) const {
  std::vector<std::vector<int64_t>> rows;
  for (int variable : variables) {
    STRATUM_ASSIGN_OR_RETURN(std::vector<int64_t> read, RowsRead(xs, variable));
    rows.push_back(std::move(read));
  }
  return rows;
}

int64_t Model::WorkspaceFloats(int64_t batch) const {
  const GraphBufferSizes::Floats floats = BufferSizes(*impl_).ForBatch(batch);
  int64_t total = 0;
  for (const std::vector<int64_t>* part : {&floats.values, &floats.grads, &floats.scratch}) {
    for (int64_t n : *part) total += n;
  }
  if (takes_ids()) total += batch * impl_->input_shape.num_elements();  // a float32 x's id words
  return total;
}

int64_t Model::num_non_trainable_parameters() const {
  int64_t total = 0;
  for (const VariableSpec& spec : impl_->variables) {
    if (!spec.trainable) total += spec.shape.num_elements();
  }
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
  const int64_t frozen = num_non_trainable_parameters();
  out << "Trainable params: " << WithCommas(num_parameters() - frozen) << "\n";
  out << "Non-trainable params: " << WithCommas(frozen) << "\n" << rule << "\n";
  return out.str();
}

std::vector<InitialFill> Model::InitialFills(uint64_t seed) const {
  std::vector<InitialFill> fills;
  for (size_t v = 0; v < impl_->variables.size(); ++v) {
    const VariableSpec& spec = impl_->variables[v];
    InitialFill fill;
    const auto [fan_in, fan_out] = Fans(spec.shape);
    double limit = 0;
    if (spec.initializer == "glorot_uniform") limit = std::sqrt(6.0 / (fan_in + fan_out));
    if (spec.initializer == "he_uniform") limit = std::sqrt(6.0 / fan_in);
    if (spec.initializer == "lecun_uniform") limit = std::sqrt(3.0 / fan_in);
    if (spec.initializer == "ones") fill.kind = InitialFill::Kind::kOnes;
    if (spec.initializer == "random_uniform") {
      fill.kind = InitialFill::Kind::kUniform;
      fill.low = spec.uniform_low;
      fill.span = spec.uniform_high - spec.uniform_low;
    } else if (limit > 0) {
      fill.kind = InitialFill::Kind::kSymmetric;
      fill.limit = static_cast<float>(limit);
    }
    // A seed of the initializer's own gives the same values in every run, as in Keras (two
    // such initializers with one seed give one another's values, as there too).
    fill.stream_seed =
        spec.seed.has_value() ? SplitMix64(*spec.seed) : SplitMix64(seed ^ SplitMix64(v + 1));
    fill.counter = spec.row_sparse;
    fills.push_back(fill);
  }
  return fills;
}

std::vector<Tensor> Model::InitialVariables(uint64_t seed) const {
  const std::vector<InitialFill> fills = InitialFills(seed);
  std::vector<Tensor> result;
  for (size_t v = 0; v < fills.size(); ++v) {
    Tensor tensor(DType::kFloat32, impl_->variables[v].shape);
    FillInitialValues(fills[v], 0, tensor.num_elements(), tensor.data<float>());
    result.push_back(std::move(tensor));
  }
  return result;
}

namespace {

// A model trains and evaluates with one output (one loss, one set of targets).
absl::Status CheckOneOutput(const Model::Impl& model) {
  if (model.outputs.size() == 1 && !model.output_ids.empty() && model.output_ids[0]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model \"", model.name,
        "\" outputs ids (an IntegerLookup's indices), which no loss trains on: end the model in "
        "a layer that makes values, such as an Embedding or a Dense"));
  }
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
  const bool binary = loss.kind() == Loss::Kind::kBinaryCrossentropy;
  const int output =
      impl_->LogitsOutputNode(false, binary ? ActivationKind::kSigmoid : ActivationKind::kSoftmax);
  if (output < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "loss ", loss.name(), " has from_logits true, but the model's output (layer \"",
      impl_->nodes[static_cast<size_t>(output)].name, "\") is a ", binary ? "sigmoid" : "softmax",
      ", so it gives probabilities, not logits: set from_logits to false, or make the last "
      "layer's activation linear"));
}

std::unique_ptr<Workspace> Model::NewWorkspace(uint64_t seed) const {
  auto state = std::make_unique<Workspace::State>(*impl_, seed);
  state->variables.resize(impl_->variables.size());
  state->gradients.resize(impl_->variables.size());
  return std::make_unique<Workspace>(std::move(state));
}

namespace {

// The rows `variable` is given as in this workspace's steps, or -1 when it is whole.
int64_t GivenRows(const Workspace::State& ws, size_t variable) {
  return variable < ws.row_views.size() ? ws.row_views[variable].count : -1;
}

// Whether `tensor` is float32 of `shape`, or of `shape` with `given` rows when given >= 0;
// compared in place: a step must not allocate.
bool IsVariableShaped(const Tensor& tensor, const Shape& shape, int64_t given) {
  if (!tensor.valid() || tensor.dtype() != DType::kFloat32) return false;
  if (given < 0) return tensor.shape() == shape;
  const Shape& actual = tensor.shape();
  if (actual.rank() != shape.rank() || actual.rank() == 0 || actual.dim(0) != given) return false;
  for (int d = 1; d < shape.rank(); ++d) {
    if (actual.dim(d) != shape.dim(d)) return false;
  }
  return true;
}

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
    const int64_t given = GivenRows(ws.state(), i);
    if (!IsVariableShaped(variables[i], spec.shape, given)) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", i, " (\"", spec.name, "\") is ",
                       variables[i].valid() ? variables[i].DebugString() : std::string("empty"),
                       ", but the model expects float32",
                       given < 0 ? spec.shape.ToString()
                                 : absl::StrCat(spec.shape.WithFirstDim(given).ToString(),
                                                " (the rows the workspace was given)"),
                       ": pass the model's variables in the order of Model::variables()"));
    }
  }
  const Shape& in = model.input_shape;
  // Compared in place: a step must not allocate.
  bool shaped = x.valid() && x.shape().rank() == in.rank() + 1;
  for (int d = 0; shaped && d < in.rank(); ++d) shaped = x.shape().dim(d + 1) == in.dim(d);
  const bool flat = x.valid() && x.shape().rank() == 2 && x.shape().dim(1) == in.num_elements();
  const bool only_ids = std::find(model.input_takes_ids.begin(), model.input_takes_ids.end(),
                                  false) == model.input_takes_ids.end();
  const bool typed =
      x.valid() && (x.dtype() == DType::kFloat32 || (only_ids && x.dtype() == DType::kInt32));
  if (!typed || !(shaped || flat)) {
    std::vector<int64_t> expected = {x.valid() && x.shape().rank() > 0 ? x.shape().dim(0) : 0};
    expected.insert(expected.end(), in.dims().begin(), in.dims().end());
    return absl::InvalidArgumentError(absl::StrCat(
        "x is ", x.valid() ? x.DebugString() : std::string("empty"), ", but model \"", model.name,
        "\" takes ", only_ids ? "int32 (or float32) ids" : "float32 inputs", " of shape ",
        Shape(expected).ToString(), " (batch first): convert or reshape the batch"));
  }
  return x.shape().dim(0);
}

void EnsureGradients(const Model::Impl& model, const Workspace::State& ws,
                     std::vector<Tensor>& gradients) {
  if (gradients.size() != model.variables.size()) gradients.resize(model.variables.size());
  for (size_t i = 0; i < gradients.size(); ++i) {
    const int64_t given = GivenRows(ws, i);
    if (IsVariableShaped(gradients[i], model.variables[i].shape, given)) continue;
    const Shape shape =
        given < 0 ? model.variables[i].shape : model.variables[i].shape.WithFirstDim(given);
    gradients[i] = Tensor(DType::kFloat32, shape);
  }
}

// The output's values after Forward, [batch, output size].
ConstMatrixMap OutputOf(const Model::Impl& model, const Workspace::State& ws, int64_t batch) {
  return ConstMatrixMap(ws.executor.Output(), batch, model.output_size);
}

}  // namespace

double Model::RegularizationLoss(const std::vector<Tensor>& variables) const {
  double total = 0;
  for (size_t v = 0; v < impl_->variables.size() && v < variables.size(); ++v) {
    const VariableSpec& spec = impl_->variables[v];
    if (spec.l1 == 0 && spec.l2 == 0) continue;
    const auto w = variables[v].Flat();
    if (spec.l1 != 0) total += spec.l1 * static_cast<double>(w.abs().sum());
    if (spec.l2 != 0) total += spec.l2 * static_cast<double>(w.square().sum());
  }
  return total;
}

void Model::AddRegularizationGradients(const std::vector<Tensor>& variables,
                                       float regularization_scale,
                                       std::vector<Tensor>& gradients) const {
  for (size_t v = 0; v < impl_->variables.size() && v < variables.size(); ++v) {
    const VariableSpec& spec = impl_->variables[v];
    if (spec.l1 == 0 && spec.l2 == 0) continue;
    const auto w = variables[v].Flat();
    auto g = gradients[v].Flat();
    const auto l1 = static_cast<float>(spec.l1 * regularization_scale);
    const auto l2 = static_cast<float>(2 * spec.l2 * regularization_scale);
    if (l1 != 0) g += l1 * w.sign();
    if (l2 != 0) g += l2 * w;
  }
}

absl::StatusOr<StepStats> Model::TrainStep(const std::vector<Tensor>& variables, const Tensor& x,
                                           const Tensor& y, const Loss& loss, float loss_scale,
                                           Workspace& ws, std::vector<Tensor>& gradients,
                                           float replica_share) const {
  STRATUM_RETURN_IF_ERROR(CheckOneOutput(*impl_));
  STRATUM_ASSIGN_OR_RETURN(const int64_t batch, CheckInputs(*impl_, variables, x, ws));
  STRATUM_RETURN_IF_ERROR(loss.ValidateTargets(y, batch, impl_->output_size));
  EnsureGradients(*impl_, ws.state(), gradients);
  Workspace::State& state = ws.state();
  if (batch == 0) {
    for (Tensor& gradient : gradients) gradient.SetZero();
    if (impl_->regularized) AddRegularizationGradients(variables, replica_share, gradients);
    state.executor.SyncWithoutExamples();
    STRATUM_RETURN_IF_ERROR(ReplicaSumStatus(state));
    return StepStats{};
  }
  Grow(state, batch);
  Forward(*impl_, variables, x, batch, true, state);
  const int fused = impl_->FusedOutputNode(true, loss);
  float* loss_grad = state.executor.StartGradients(fused);
  const StepStats stats =
      loss.Compute(OutputOf(*impl_, state, batch), state.executor.Logits(fused, batch, true), y,
                   loss_scale, loss_grad);
  if (loss_grad != nullptr) {
    for (size_t v = 0; v < gradients.size(); ++v) state.gradients[v] = gradients[v].data<float>();
    state.executor.Backward(batch, true, fused, state.gradients, replica_share);
  }
  STRATUM_RETURN_IF_ERROR(ReplicaSumStatus(state));
  if (!impl_->regularized) return stats;
  AddRegularizationGradients(variables, replica_share, gradients);
  StepStats regularized = stats;
  regularized.loss_sum += RegularizationLoss(variables) * static_cast<double>(stats.examples);
  return regularized;
}

absl::StatusOr<StepStats> Model::Evaluate(const std::vector<Tensor>& variables, const Tensor& x,
                                          const Tensor& y, const Loss& loss, Workspace& ws) const {
  STRATUM_RETURN_IF_ERROR(CheckOneOutput(*impl_));
  STRATUM_ASSIGN_OR_RETURN(const int64_t batch, CheckInputs(*impl_, variables, x, ws));
  STRATUM_RETURN_IF_ERROR(loss.ValidateTargets(y, batch, impl_->output_size));
  if (batch == 0) return StepStats{};
  Workspace::State& state = ws.state();
  Grow(state, batch);
  Forward(*impl_, variables, x, batch, false, state);
  const int fused = impl_->FusedOutputNode(false, loss);
  StepStats stats = loss.Compute(OutputOf(*impl_, state, batch),
                                 state.executor.Logits(fused, batch, false), y, 1.0f, nullptr);
  if (impl_->regularized) {
    stats.loss_sum += RegularizationLoss(variables) * static_cast<double>(stats.examples);
  }
  return stats;
}

absl::StatusOr<Tensor> Model::Predict(const std::vector<Tensor>& variables, const Tensor& x,
                                      Workspace& ws) const {
  STRATUM_ASSIGN_OR_RETURN(const int64_t batch, CheckInputs(*impl_, variables, x, ws));
  Tensor result(DType::kFloat32, Shape({batch, impl_->output_size}));
  if (batch == 0) return result;
  Workspace::State& state = ws.state();
  Grow(state, batch);
  Forward(*impl_, variables, x, batch, false, state);
  // Several outputs side by side, in the model's order.
  int64_t offset = 0;
  for (size_t i = 0; i < impl_->outputs.size(); ++i) {
    const int64_t size = impl_->tensors[static_cast<size_t>(impl_->outputs[i])].size;
    Cpu().CopyBlocks(state.executor.Output(i), size, result.data<float>() + offset,
                     impl_->output_size, batch, size, false);
    if (i < impl_->output_ids.size() && impl_->output_ids[i]) {  // id words to the ids' values
      for (int64_t b = 0; b < batch; ++b) {
        float* ids = result.data<float>() + b * impl_->output_size + offset;
        for (int64_t k = 0; k < size; ++k) ids[k] = static_cast<float>(IdOfWord(ids[k]));
      }
    }
    offset += size;
  }
  return result;
}

}  // namespace stratum

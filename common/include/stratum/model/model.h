// Model: a Keras model built from Keras' own model.to_json() text, Sequential or Functional
// (several named inputs and outputs, merge layers such as a residual Add), as one graph of
// layers (stratum/model/layer.h, made by the registry of layer_registry.h), with the forward
// pass, loss and backward pass that one replica runs per step. Backward walks the graph in
// reverse and adds the gradients of a tensor that feeds several layers.
//
// A model with several inputs takes each example as their values side by side: the
// example's features, flattened, are split over the inputs in the model's input order (an
// image of 784 values feeds inputs of 392 and 392 with its top and bottom halves).
//
// The model holds the architecture only. Variables live outside it, in tensors the caller
// owns (one copy per replica, or shards on parameter servers), and per-thread scratch lives
// in a Workspace, so that many replicas can share one Model.
//
// Thread safety: a Model is immutable after creation; its const methods may run from many
// threads at once, each with its own Workspace, variables and gradients. A Workspace is used
// by one thread at a time. Ownership: NewWorkspace returns a unique_ptr the caller owns.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stratum/model/initial_fill.h"
#include "stratum/model/layer.h"
#include "stratum/model/loss.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

// Per-thread scratch for a Model's steps: activations, dropout masks, the dropout random
// stream and gradient buffers. Buffers are sized for the largest batch seen so far, so a
// step allocates nothing once a workspace has seen its batch size.
class Workspace {
 public:
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // The largest batch the buffers hold now.
  int64_t capacity() const;
  // Restarts the dropout random stream from `seed`. Fit reseeds it before every step from
  // (seed, step, replica), so a run resumed from a checkpoint draws the same masks.
  void Reseed(uint64_t seed);

  // Sums `values` in place over the replicas in sync (ReplicaContext::AllReduce with SUM):
  // the statistics of a synchronized BatchNormalization go through it. Unset, every replica
  // normalizes by its own batch's statistics. Set it once, before the workspace's first step.
  using ReplicaSum = std::function<absl::Status(std::vector<Tensor>& values)>;
  void SetReplicaSum(ReplicaSum sum);

  // Gives row-sparse variable `variable` (VariableSpec::row_sparse: an embedding table) as
  // some of its rows: until cleared, this workspace's steps take it as a tensor of those
  // rows ([rows.size(), ...], `rows` sorted and unique, such as Model::RowsRead returns),
  // and its gradient comes back for those rows alone. Ids the step reads outside `rows` look
  // up zeros. INVALID_ARGUMENT for a variable that is not row-sparse or rows that are not
  // sorted, unique and in the table.
  absl::Status SetVariableRows(int variable, std::vector<int64_t> rows);
  // The same for each of `variables`, with rows[i] the rows of variables[i].
  absl::Status SetVariableRows(const std::vector<int>& variables,
                               const std::vector<std::vector<int64_t>>& rows);
  // Every variable whole again.
  void ClearVariableRows();

  // Opaque; defined next to the Model's implementation.
  struct State;
  explicit Workspace(std::unique_ptr<State> state);
  State& state() { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

// Keras' dtype policies: float32, or mixed precision (variables float32, the layers computed
// in bfloat16 or float16; mixed_float16 trains with dynamic loss scaling). Mixed precision
// computes in half precision on GPUs; the CPU computes such a model in float32.
enum class DtypePolicy { kFloat32, kMixedBfloat16, kMixedFloat16 };
// "float32", "mixed_bfloat16", "mixed_float16".
const char* DtypePolicyName(DtypePolicy policy);
// What a job says when the CPU trains a model of `policy`: empty for float32, else that the
// CPU computes it in float32.
std::string CpuPrecisionNote(DtypePolicy policy);

class Model {
 public:
  // Keras' model.to_json() output for a Sequential or Functional model, in the tf.keras
  // (Keras 2) or the Keras 3 form; also the file Keras writes with json.dump(model.to_json()),
  // where the whole text is a JSON string. Unsupported layers and options are refused by name.
  static absl::StatusOr<Model> FromKerasJson(absl::string_view text);
  // The same for std::string and C strings (which would otherwise be ambiguous between the
  // text and the JSON-value overloads).
  static absl::StatusOr<Model> FromKerasJson(const std::string& text);
  static absl::StatusOr<Model> FromKerasJson(const char* text);
  // The same, already parsed (a JSON string holding the model text is unwrapped).
  static absl::StatusOr<Model> FromKerasJson(const nlohmann::json& json);

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  Model(const Model&);
  Model& operator=(const Model&);
  ~Model();

  const std::string& name() const;
  const std::vector<VariableSpec>& variables() const;
  // The shape of one example, without the batch dimension ([28, 28]); with several inputs,
  // [the elements of all of them].
  Shape input_shape() const;
  // The model's inputs (its InputLayers), in the order their values are taken.
  const std::vector<std::string>& input_names() const;
  // What a caller names them by, in the same order: a Functional model's dict keys
  // (keras.Model({"features": input}, ...)), else the InputLayers' names.
  const std::vector<std::string>& input_keys() const;
  // Each input's shape per example, in the same order.
  std::vector<Shape> input_shapes() const;
  // Outputs per example (classes for a classifier); with several outputs, of all of them.
  int64_t output_size() const;
  int num_outputs() const;
  // Whether an input takes ids (an InputLayer of dtype int32 or int64, or one an Embedding
  // reads as it is), whose data is not rescaled; whether every input does (such a model
  // takes int32 batches too, and its input pipeline gives them: MakeBatches).
  bool takes_ids() const;
  bool takes_only_ids() const;
  int64_t num_parameters() const;
  // The rows of row-sparse variable `variable` that steps on the batches `xs` (each as
  // TrainStep takes x) read, sorted and unique, ids outside the table left out: what a
  // parameter-server worker pulls of an embedding table. INVALID_ARGUMENT for a variable that
  // is not row-sparse or a batch of the wrong shape.
  absl::StatusOr<std::vector<int64_t>> RowsRead(const std::vector<const Tensor*>& xs,
                                                int variable) const;
  // RowsRead for each of `variables`, in their order.
  absl::StatusOr<std::vector<std::vector<int64_t>>> RowsRead(
      const std::vector<const Tensor*>& xs, const std::vector<int>& variables) const;
  // The floats one Workspace holds for steps of `batch` examples (activations, gradients,
  // scratch): what training takes per replica besides the variables.
  int64_t WorkspaceFloats(int64_t batch) const;
  // Of them, those no optimizer updates (BatchNormalization's moving statistics).
  int64_t num_non_trainable_parameters() const;
  // The layers' policy: mixed when they name one (a layer without variables, or a
  // BatchNormalization, may say float32 in such a model, as Keras' output layers do).
  DtypePolicy dtype_policy() const;
  // OK when every layer runs on a GPU; else UNIMPLEMENTED naming the first that does not.
  absl::Status CheckRunsOnGpu() const;
  // A table in the shape of Keras' model.summary(): layer, output shape, parameters.
  std::string Summary() const;

  // Variables initialized as the layers' initializers say; the same seed gives the same
  // values, bit for bit. An initializer with a seed of its own ignores `seed`.
  std::vector<Tensor> InitialVariables(uint64_t seed) const;
  // How InitialVariables makes each variable's values, apart from them (a parameter server
  // makes its shards' values from these).
  std::vector<InitialFill> InitialFills(uint64_t seed) const;
  // Whether `loss` reads this model's output as what it is, and the model has the one output
  // a loss trains. INVALID_ARGUMENT, with the fix,
  // for a cross-entropy with from_logits true on a softmax output: that output holds
  // probabilities, not logits (Keras warns and takes them as logits; TrainStep would fuse
  // the softmax and train as from_logits false). Jobs are checked with it before training.
  absl::Status CheckLoss(const Loss& loss) const;
  // Scratch for one thread; `seed` drives its dropout masks.
  std::unique_ptr<Workspace> NewWorkspace(uint64_t seed) const;

  // One training step of one replica: forward pass in training mode (dropout active), loss,
  // backward pass. x is float32 [B, ...input_shape] (or [B, input elements]), or int32 for
  // a model that takes only ids (float32 values hold ids exactly to 2^24 only; int32 ids,
  // as the input pipeline gives such a model, to 2^31); y holds class
  // ids [B] (int32, int64 or uint8) for a sparse loss, float32 [B, C] otherwise. The
  // minimised objective is loss_scale * (sum over the batch of per-example losses): pass
  // 1 / global batch size, as tf.distribute does, and summed replica gradients are right.
  // `gradients` receives d(objective)/d(variable) for every variable (overwritten, not
  // accumulated); tensors of the wrong shape, or missing, are allocated.
  //
  // `replica_share` is this replica's share of what a step adds once, not per example: pass
  // 1 / replicas in sync, and summed replica gradients carry each once.
  // - Regularizers (a layer's kernel_regularizer / bias_regularizer) add their loss to the
  //   objective times replica_share, as tf.distribute's scale_regularization_loss does. The
  //   returned loss_sum includes the full regularization loss once per example, so loss_sum
  //   / examples is Keras' loss (the mean example loss plus the regularization loss).
  // - A non-trainable variable's gradient is the change the step makes to it (its moving
  //   average's step) times replica_share: subtract it (Optimizer::Apply does).
  // A replica with an empty batch still takes part in synchronized layers' sums, but makes
  // no step of the moving statistics (its gradients are zeros but for the regularization).
  absl::StatusOr<StepStats> TrainStep(const std::vector<Tensor>& variables, const Tensor& x,
                                      const Tensor& y, const Loss& loss, float loss_scale,
                                      Workspace& ws, std::vector<Tensor>& gradients,
                                      float replica_share = 1.0f) const;
  // Adds regularization_scale * d(regularization loss)/d(variable) to `gradients` (a
  // replica's share when it had no examples this step, so the shares still add up).
  void AddRegularizationGradients(const std::vector<Tensor>& variables, float regularization_scale,
                                  std::vector<Tensor>& gradients) const;
  // The regularization loss of `variables` (0 without regularizers).
  double RegularizationLoss(const std::vector<Tensor>& variables) const;
  // Loss and accuracy in inference mode (dropout off); loss_sum includes the regularization
  // loss once per example, as Keras' evaluate reports it.
  absl::StatusOr<StepStats> Evaluate(const std::vector<Tensor>& variables, const Tensor& x,
                                     const Tensor& y, const Loss& loss, Workspace& ws) const;
  // The model's outputs, float32 [B, output_size()], in inference mode (several outputs side
  // by side, in the model's order). TrainStep and Evaluate take a model with one output.
  absl::StatusOr<Tensor> Predict(const std::vector<Tensor>& variables, const Tensor& x,
                                 Workspace& ws) const;

  // Opaque; defined in common/model/model_graph.h. The graph, for the executors of
  // common/ (the CPU workspace's and the GPU replica's GraphExecutor).
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  const Impl& graph() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace stratum

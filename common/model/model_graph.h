// The model's graph: its layers as nodes in an order that runs every node after its
// inputs, the tensors between them (shapes per example), the model's inputs and outputs,
// and the variables of all layers in one list. Built from Keras' JSON by model_json.cc;
// run by model.cc. Internal to common/model/.
//
// Thread safety: immutable once built; the layers are shared by copies of a Model.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "stratum/model/layer.h"
#include "stratum/model/model.h"

namespace stratum {

// A tensor of the graph: a model input or a layer's output.
struct GraphTensor {
  Shape shape;              // per example
  int64_t size = 0;         // elements per example
  int producer = -1;        // the node that computes it; -1 for a model input
  int consumers = 0;        // inputs of nodes that read it (a node reading it twice counts twice)
  bool needs_grad = false;  // a trainable variable lies upstream: backward reaches it
};

// A layer applied once, to its input tensors.
struct GraphNode {
  std::string name;
  std::string class_name;
  std::shared_ptr<const Layer> layer;
  std::vector<int> inputs;     // tensor ids
  int output = -1;             // tensor id
  std::vector<int> variables;  // indices into the model's variables, in the layer's order
  int64_t scratch_per_example = 0;
  int64_t scratch_per_step = 0;
  int64_t parameters = 0;
  bool synchronized = false;  // sums over the replicas in sync (Layer::CrossReplicaSums)
};

struct Model::Impl {
  std::string name;
  bool sequential = true;  // a Sequential model (else Functional), for Summary
  std::vector<std::string> input_names;
  // What the model's caller names each input by: a Functional model's dict keys
  // (keras.Model({"features": input}, ...)), else the InputLayers' names; empty for a
  // Sequential model (input_names then).
  std::vector<std::string> input_keys;
  std::vector<int> inputs;   // tensor ids, in the model's input order
  std::vector<int> outputs;  // tensor ids, in the model's output order
  std::vector<GraphNode> nodes;
  std::vector<GraphTensor> tensors;
  std::vector<VariableSpec> variables;
  Shape input_shape;                 // the one input's shape, or [elements of all inputs]
  bool regularized = false;          // some variable has a regularizer
  bool synchronized = false;         // some node sums over the replicas in sync
  std::set<std::string> int_inputs;  // the InputLayers of dtype int32 or int64, by name
  DtypePolicy dtype_policy = DtypePolicy::kFloat32;  // Model::dtype_policy
  std::vector<bool> input_takes_ids;  // per input: int, or read by an Embedding as it is
  std::vector<bool> output_ids;       // per output: ids (an IntegerLookup's), as id words
  // Per variable: where in an example's values (x's columns) the ids a row-sparse one is
  // read by lie, one [offset, offset + size) per model input that layers read it by; empty
  // for the others.
  struct Columns {
    int64_t offset = 0;
    int64_t size = 0;
  };
  std::vector<std::vector<Columns>> row_columns;
  int64_t output_size = 0;
  // Per-tensor sizes; a workspace made for another model does not match.
  std::vector<int64_t> signature;

  // The node whose `activation` (softmax or sigmoid) output the model returns (through
  // layers that are the identity in this mode), whose logits a cross-entropy then takes; -1
  // when there is none. In training, only a chain that nothing else reads fuses.
  int LogitsOutputNode(bool training, ActivationKind activation) const;
  // That node for `loss` (Loss::fused_activation), or -1.
  int FusedOutputNode(bool training, const Loss& loss) const;
};

// The graph of Keras' model.to_json() (Sequential or Functional), unwrapped and checked.
absl::StatusOr<std::unique_ptr<Model::Impl>> BuildModelGraph(const nlohmann::json& input);

}  // namespace stratum

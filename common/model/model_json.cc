// Builds a model's graph from Keras' model.to_json(): a Sequential model's layer list, or a
// Functional model's layers with their inbound_nodes (tf.keras 2 and Keras 3 forms), named
// inputs and outputs. Layers come from the registry; every refusal names the layer and the fix.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/keras_config.h"
#include "common/model/model_graph.h"
#include "stratum/model/layer_registry.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using keras::Dump;
using keras::Find;
using keras::FindString;
using keras::json;
using keras::Where;

// A layer as the JSON gives it: made from its config, not yet built.
struct LayerSpec {
  std::string name;
  std::string class_name;
  std::unique_ptr<Layer> layer;
  DtypePolicy policy = DtypePolicy::kFloat32;
  std::vector<std::string> inbound;  // Functional: the layers whose outputs it takes, in order
};

absl::StatusOr<LayerSpec> MakeLayer(const json& spec, size_t index,
                                    std::map<std::string, int>& default_names) {
  const std::optional<std::string> class_name = FindString(spec, "class_name");
  if (!class_name) {
    return absl::InvalidArgumentError(
        absl::StrCat("model layer ", index, " is ", Dump(spec),
                     ", which is not a Keras layer object: give it \"class_name\" and \"config\""));
  }
  LayerSpec layer;
  layer.class_name = *class_name;
  static const json* const kEmptyConfig = new json(json::object());
  const json* found_config = Find(spec, "config");
  const json& config = found_config ? *found_config : *kEmptyConfig;
  if (!config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model layer ", index, " (", layer.class_name, ") has config ", Dump(config),
                     ", which is not an object: give the layer a config object such as {\"name\": "
                     "\"dense\", ...}"));
  }
  if (const std::optional<std::string> name = FindString(config, "name")) {
    layer.name = *name;
  } else if (const std::optional<std::string> outer = FindString(spec, "name")) {
    layer.name = *outer;
  } else {
    const std::string base = keras::SnakeCase(layer.class_name);
    const int count = default_names[base]++;
    layer.name = count == 0 ? base : absl::StrCat(base, "_", count);
  }
  const std::string where = Where(layer.name, layer.class_name);
  STRATUM_ASSIGN_OR_RETURN(layer.policy, keras::ParseDtypePolicy(where, config));
  const LayerFactory make = FindLayerFactory(layer.class_name);
  if (layer.class_name == "StringLookup" || layer.class_name == "TextVectorization") {
    const std::string feature = layer.class_name == "StringLookup" ? "features" : "line";
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        " takes strings, which Stratum's model tensors do not hold: apply it to the data "
        "instead, as the ParameterServerStrategy tutorial's dataset.map does, with the layer "
        "in the data source's \"preprocess\" (e.g. \"preprocess\": {\"",
        feature, "\": {\"class_name\": \"", layer.class_name,
        "\", \"config\": {...}}}), and give the model an int64 input for the ids"));
  }
  if (make == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("model layer \"", layer.name, "\" has class \"", layer.class_name,
                     "\", which Stratum does not support: ", SupportedLayersHint()));
  }
  STRATUM_RETURN_IF_ERROR(keras::RefuseSet(where, config, {"activity_regularizer"}));
  STRATUM_ASSIGN_OR_RETURN(layer.layer, make(config, where));
  return layer;
}

// A boolean InputLayer option; absent or null is false.
absl::StatusOr<bool> InputFlag(const json& config, const char* key) {
  const json* value = Find(config, key);
  if (value == nullptr) return false;
  if (!value->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat("model InputLayer has ", key, " ", Dump(*value),
                                                   ", which is not a boolean: use false"));
  }
  return value->get<bool>();
}

// The InputLayer's dtype (float32, or int32 / int64 for ids, which the model then takes
// unscaled: Model::takes_ids), sparse and ragged options. `name` is the input's.
absl::Status CheckInputLayer(const json& config, const std::string& name, Model::Impl& impl) {
  const json* dtype = Find(config, "dtype");
  if (dtype != nullptr && dtype->is_string() && (*dtype == "int32" || *dtype == "int64")) {
    impl.int_inputs.insert(name);
  } else if (dtype != nullptr && !(dtype->is_string() && *dtype == "float32")) {
    // keras::CheckDtype's message, with the id types an input may have besides.
    if (absl::Status status = keras::CheckDtype(Where(name, "InputLayer"), config); !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(status.message(), ", or int32 / int64 for ids (Embedding)"));
    }
  }
  STRATUM_ASSIGN_OR_RETURN(const bool sparse, InputFlag(config, "sparse"));
  STRATUM_ASSIGN_OR_RETURN(const bool ragged, InputFlag(config, "ragged"));
  if (sparse || ragged) {
    return absl::InvalidArgumentError(
        "model InputLayer is sparse or ragged, which Stratum does not support: use a dense "
        "input");
  }
  return absl::OkStatus();
}

// Adds inputs and layers to a model's graph, checking each as it comes.
class GraphBuilder {
 public:
  // Keras' mask of a tensor, as far as Stratum carries one (MaskGiven): the tensor of the
  // ids whose zeros mask its steps, and the layer that made the mask.
  struct Mask {
    int ids = -1;
    std::string maker;
  };

  explicit GraphBuilder(Model::Impl& impl) : impl_(impl) {}

  int AddInput(const std::string& name, const Shape& shape) {
    const int id = NewTensor(shape, -1);
    tensor_of_[name] = id;
    impl_.inputs.push_back(id);
    impl_.input_names.push_back(name);
    return id;
  }

  bool Has(const std::string& name) const { return tensor_of_.count(name) > 0; }
  int TensorOf(const std::string& name) const { return tensor_of_.at(name); }

  // Builds `spec` on `inputs` (tensor ids); its output is then known by its name.
  absl::Status AddNode(LayerSpec spec, const std::vector<int>& inputs) {
    const std::string where = Where(spec.name, spec.class_name);
    if (!names_.insert(spec.name).second || Has(spec.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " repeats a layer name: give every layer a distinct name"));
    }
    STRATUM_ASSIGN_OR_RETURN(const std::optional<Mask> mask, MaskGiven(spec, where, inputs));
    // GlobalAveragePooling1D takes the mask as a second input: the ids.
    std::vector<int> node_inputs = inputs;
    if (mask.has_value() && spec.class_name == "GlobalAveragePooling1D") {
      node_inputs.push_back(mask->ids);
    }
    std::vector<Shape> shapes;
    for (int id : node_inputs) shapes.push_back(impl_.tensors[static_cast<size_t>(id)].shape);
    STRATUM_ASSIGN_OR_RETURN(LayerBuild build, spec.layer->Build(shapes, where));
    GraphNode node;
    node.name = spec.name;
    node.class_name = spec.class_name;
    node.inputs = node_inputs;
    node.scratch_per_example = build.scratch_per_example;
    node.scratch_per_step = build.scratch_per_step;
    node.synchronized =
        !spec.layer->CrossReplicaSums(false).empty() || !spec.layer->CrossReplicaSums(true).empty();
    impl_.synchronized = impl_.synchronized || node.synchronized;
    for (VariableSpec& variable : build.variables) {
      node.parameters += variable.shape.num_elements();
      variable.name = absl::StrCat(spec.name, "/", variable.name);
      node.variables.push_back(static_cast<int>(impl_.variables.size()));
      impl_.regularized = impl_.regularized || variable.l1 != 0 || variable.l2 != 0;
      impl_.variables.push_back(std::move(variable));
    }
    if (total_parameters_ + node.parameters > keras::kMaxElements) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " brings the model to ", total_parameters_ + node.parameters,
                       " parameters, more than the 2^31 Stratum allows: use fewer or smaller "
                       "layers"));
    }
    total_parameters_ += node.parameters;
    const int node_id = static_cast<int>(impl_.nodes.size());
    node.output = NewTensor(std::move(build.output), node_id);
    if (build.masks_zero_ids) {
      mask_of_[node.output] = {inputs[0], where};
    } else if (mask.has_value() && spec.class_name != "GlobalAveragePooling1D") {
      mask_of_[node.output] = *mask;
    }
    bool needs_grad = !node.variables.empty();
    for (int id : node_inputs) {
      GraphTensor& input = impl_.tensors[static_cast<size_t>(id)];
      ++input.consumers;
      needs_grad = needs_grad || input.needs_grad;
    }
    impl_.tensors[static_cast<size_t>(node.output)].needs_grad = needs_grad;
    tensor_of_[spec.name] = node.output;
    STRATUM_RETURN_IF_ERROR(AddPolicy(spec, where, !node.variables.empty()));
    node.layer = std::shared_ptr<const Layer>(std::move(spec.layer));
    impl_.nodes.push_back(std::move(node));
    return absl::OkStatus();
  }

  // The mask `inputs` carry to the layer `spec` (none: nullopt). An Embedding with mask_zero
  // masks the steps whose id is 0; Dense, Dropout and Activation, which work step by step,
  // pass it on; GlobalAveragePooling1D takes it (its mean leaves those steps out). Any other
  // layer given one is refused, as Keras refuses a layer that does not support masking.
  absl::StatusOr<std::optional<Mask>> MaskGiven(const LayerSpec& spec, const std::string& where,
                                                const std::vector<int>& inputs) const {
    std::optional<Mask> mask;
    for (int id : inputs) {
      if (auto found = mask_of_.find(id); found != mask_of_.end()) mask = found->second;
    }
    if (!mask.has_value()) return mask;
    static const std::set<std::string> kTakesMasks = {"GlobalAveragePooling1D", "Dense", "Dropout",
                                                      "Activation"};
    if (inputs.size() != 1 || kTakesMasks.count(spec.class_name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is given the mask of ", mask->maker,
          " (mask_zero), which Stratum carries only through Dense, Dropout and Activation to "
          "GlobalAveragePooling1D: average the steps there, or set mask_zero to false"));
    }
    return mask;
  }

  // One policy for the model: a layer's mixed policy is the model's, and a float32 layer in
  // a mixed model is one whose float32 Stratum keeps or whose rounding changes nothing that
  // follows (one without variables: an output's softmax, a reshape), since every other layer
  // computes in the model's half precision (BatchNormalization's statistics in float32).
  absl::Status AddPolicy(const LayerSpec& spec, const std::string& where, bool has_variables) {
    if (spec.policy == DtypePolicy::kFloat32) {
      if (has_variables && spec.class_name != "BatchNormalization" && float32_layer_.empty()) {
        float32_layer_ = where;
      }
    } else if (impl_.dtype_policy == DtypePolicy::kFloat32) {
      impl_.dtype_policy = spec.policy;
      mixed_layer_ = where;
    } else if (impl_.dtype_policy != spec.policy) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " has dtype policy ", DtypePolicyName(spec.policy), ", but ", mixed_layer_,
          " has ", DtypePolicyName(impl_.dtype_policy), ": give every layer the same policy"));
    }
    if (impl_.dtype_policy != DtypePolicy::kFloat32 && !float32_layer_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          float32_layer_, " has dtype float32 in a model of policy ",
          DtypePolicyName(impl_.dtype_policy), " (", mixed_layer_,
          "): Stratum computes such a model's layers with variables in one precision; give it "
          "the model's policy (only layers without variables, such as an output Activation, "
          "and BatchNormalization may say float32)"));
    }
    return absl::OkStatus();
  }

  // A row-sparse table stays one where every node reading it takes its ids straight from a
  // model input (whose columns Model::RowsRead then reads) and no regularizer needs all of it.
  void FindRowSparseColumns() {
    std::vector<int64_t> offsets;  // per model input, where its values start in an example
    int64_t offset = 0;
    for (int id : impl_.inputs) {
      offsets.push_back(offset);
      offset += impl_.tensors[static_cast<size_t>(id)].size;
    }
    impl_.row_columns.assign(impl_.variables.size(), {});
    for (size_t v = 0; v < impl_.variables.size(); ++v) {
      VariableSpec& spec = impl_.variables[v];
      if (!spec.row_sparse) continue;
      spec.row_sparse = spec.l1 == 0 && spec.l2 == 0;
      std::vector<Model::Impl::Columns> columns;
      for (const GraphNode& node : impl_.nodes) {
        if (std::find(node.variables.begin(), node.variables.end(), static_cast<int>(v)) ==
            node.variables.end()) {
          continue;
        }
        const auto input = std::find(impl_.inputs.begin(), impl_.inputs.end(), node.inputs[0]);
        if (input == impl_.inputs.end()) {
          spec.row_sparse = false;
          continue;
        }
        const size_t i = static_cast<size_t>(input - impl_.inputs.begin());
        const Model::Impl::Columns read{offsets[i],
                                        impl_.tensors[static_cast<size_t>(*input)].size};
        if (std::none_of(columns.begin(), columns.end(),
                         [&](const Model::Impl::Columns& c) { return c.offset == read.offset; })) {
          columns.push_back(read);
        }
      }
      if (spec.row_sparse) impl_.row_columns[v] = std::move(columns);
    }
  }

  // Ids travel between layers as id words (stratum/device/device.h), which only the layers
  // that take ids read: an Embedding, an IntegerLookup, a mask's ids, and layers that pass
  // their input on (Flatten). A model that takes values besides ids gets them as float32
  // values, exact to 2^24 only, so its tables are held to that.
  absl::Status CheckIdsStayIds() {
    std::vector<std::string> carries(impl_.tensors.size());  // what made a tensor ids, or ""
    for (size_t i = 0; i < impl_.inputs.size(); ++i) {
      if (impl_.input_takes_ids[i]) {
        carries[static_cast<size_t>(impl_.inputs[i])] =
            absl::StrCat("model input \"", impl_.input_names[i], "\"");
      }
    }
    const bool only_ids = std::find(impl_.input_takes_ids.begin(), impl_.input_takes_ids.end(),
                                    false) == impl_.input_takes_ids.end();
    for (const GraphNode& node : impl_.nodes) {
      const std::string where = Where(node.name, node.class_name);
      const bool takes_ids = node.class_name == "Embedding" || node.class_name == "IntegerLookup";
      if (node.class_name == "IntegerLookup") {
        carries[static_cast<size_t>(node.output)] = where;
      }
      if (takes_ids && carries[static_cast<size_t>(node.inputs[0])].empty()) {
        const int producer = impl_.tensors[static_cast<size_t>(node.inputs[0])].producer;
        return absl::InvalidArgumentError(absl::StrCat(
            where, " reads the values of ",
            producer < 0 ? std::string("a model input")
                         : Where(impl_.nodes[static_cast<size_t>(producer)].name,
                                 impl_.nodes[static_cast<size_t>(producer)].class_name),
            " as ids, which Stratum does not convert: give it ids from a model input (as it is, "
            "or through Flatten) or from an IntegerLookup"));
      }
      for (size_t k = 0; k < node.inputs.size(); ++k) {
        const std::string& ids = carries[static_cast<size_t>(node.inputs[k])];
        if (ids.empty()) continue;
        if (node.layer->IsIdentity(true) && node.layer->IsIdentity(false)) {
          carries[static_cast<size_t>(node.output)] = ids;
        } else if (!(takes_ids && k == 0) &&
                   !(k > 0 && node.class_name == "GlobalAveragePooling1D")) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, " reads the ids of ", ids,
              " as values, which Stratum does not convert (ids stay ids, exact to 2^31): give "
              "the values on an input of their own, of dtype float32"));
        }
      }
      if (!only_ids && node.layer->LargestToken() > (int64_t{1} << 24)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " has the token ", node.layer->LargestToken(),
            ", but the model takes values besides ids, so its tokens travel as float32 values, "
            "exact to 2^24 = 16777216: use smaller tokens, or give the model ids alone (an int32 "
            "token travels exactly)"));
      }
      if (node.class_name == "Embedding" && !only_ids && !node.variables.empty() &&
          impl_.variables[static_cast<size_t>(node.variables[0])].shape.dim(0) >
              (int64_t{1} << 24)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " has ", impl_.variables[static_cast<size_t>(node.variables[0])].shape.dim(0),
            " rows, but the model takes values besides ids, so its ids travel as float32 values, "
            "exact to 2^24 = 16777216 rows: hash the ids into fewer rows, or give the model ids "
            "alone (an int32 id travels exactly to 2^31)"));
      }
    }
    impl_.output_ids.clear();
    for (int id : impl_.outputs)
      impl_.output_ids.push_back(!carries[static_cast<size_t>(id)].empty());
    return absl::OkStatus();
  }

  // Sets the outputs, checks that every layer and input leads to one, and derives the
  // model's input shape and output size.
  absl::Status Finish(const std::vector<int>& outputs) {
    for (int id : outputs) {
      if (auto mask = mask_of_.find(id); mask != mask_of_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a model output carries the mask of ", mask->second.maker,
            " (mask_zero), with which Keras would leave masked steps out of the loss, which "
            "Stratum does not: average the steps with GlobalAveragePooling1D before the output"));
      }
    }
    impl_.outputs = outputs;
    // An input takes ids when declared int, or when an Embedding or IntegerLookup reads it as
    // it is, or through layers that pass it on (Keras casts a float32 input's values to ids
    // there, never scaling them).
    impl_.input_takes_ids.assign(impl_.inputs.size(), false);
    for (size_t i = 0; i < impl_.inputs.size(); ++i) {
      bool ids = impl_.int_inputs.count(impl_.input_names[i]) > 0;
      std::vector<bool> passed(impl_.tensors.size(), false);  // the input, passed on
      passed[static_cast<size_t>(impl_.inputs[i])] = true;
      for (const GraphNode& node : impl_.nodes) {
        if (node.inputs.empty() || !passed[static_cast<size_t>(node.inputs[0])]) continue;
        if (node.class_name == "Embedding" || node.class_name == "IntegerLookup") ids = true;
        if (node.layer->IsIdentity(true) && node.layer->IsIdentity(false)) {
          passed[static_cast<size_t>(node.output)] = true;
        }
      }
      impl_.input_takes_ids[i] = ids;
    }
    STRATUM_RETURN_IF_ERROR(CheckIdsStayIds());
    FindRowSparseColumns();
    std::vector<bool> used(impl_.tensors.size(), false);
    for (int id : outputs) used[static_cast<size_t>(id)] = true;
    for (int n = static_cast<int>(impl_.nodes.size()) - 1; n >= 0; --n) {
      const GraphNode& node = impl_.nodes[static_cast<size_t>(n)];
      if (!used[static_cast<size_t>(node.output)]) {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(node.name, node.class_name),
                         " leads to none of the model's outputs: remove it, or make it an output "
                         "(output_layers)"));
      }
      for (int id : node.inputs) used[static_cast<size_t>(id)] = true;
    }
    for (size_t i = 0; i < impl_.inputs.size(); ++i) {
      if (!used[static_cast<size_t>(impl_.inputs[i])]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model input \"", impl_.input_names[i],
            "\" leads to none of the model's outputs: remove it, or connect it to a layer"));
      }
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Shape& shape = impl_.tensors[static_cast<size_t>(outputs[i])].shape;
      if (shape.rank() != 1) {
        const std::string which =
            outputs.size() == 1 ? std::string("model output") : absl::StrCat("model output ", i);
        return absl::InvalidArgumentError(absl::StrCat(
            which, " has shape ", keras::ShapeWithBatch(shape),
            ", but Stratum's losses take (None, classes): add a Flatten layer before the last "
            "Dense layer"));
      }
      impl_.output_size += shape.dim(0);
    }
    if (impl_.inputs.size() == 1) {
      impl_.input_shape = impl_.tensors[static_cast<size_t>(impl_.inputs[0])].shape;
    } else {
      int64_t elements = 0;
      for (int id : impl_.inputs) elements += impl_.tensors[static_cast<size_t>(id)].size;
      impl_.input_shape = Shape({elements});
    }
    for (const GraphTensor& tensor : impl_.tensors) impl_.signature.push_back(tensor.size);
    return absl::OkStatus();
  }

 private:
  int NewTensor(Shape shape, int producer) {
    GraphTensor tensor;
    tensor.size = shape.num_elements();
    tensor.shape = std::move(shape);
    tensor.producer = producer;
    impl_.tensors.push_back(std::move(tensor));
    return static_cast<int>(impl_.tensors.size()) - 1;
  }

  Model::Impl& impl_;
  std::string mixed_layer_;               // the first layer with a mixed policy
  std::string float32_layer_;             // the first float32 layer with variables (not BN)
  std::map<std::string, int> tensor_of_;  // layer or input name -> its output tensor
  std::set<std::string> names_;
  int64_t total_parameters_ = 0;
  std::map<int, Mask> mask_of_;  // per masked tensor (AddNode)
};

// ---- Sequential -------------------------------------------------------------------------

// The layers of a Sequential config: the "layers" list, or (old tf.keras) the whole config.
absl::StatusOr<const json*> SequentialLayerList(const json& config) {
  if (config.is_array()) return &config;
  if (!config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config is ", Dump(config),
                     ", which is not an object: pass the text of Keras' model.to_json() for a "
                     "Sequential model"));
  }
  const json* layers = Find(config, "layers");
  if (layers == nullptr || !layers->is_array() || layers->empty()) {
    return absl::InvalidArgumentError(
        "model config has no layers: pass a Sequential model with at least one layer");
  }
  return layers;
}

absl::Status BuildSequential(const json& spec, Model::Impl& impl) {
  const json* found_config = Find(spec, "config");
  if (found_config == nullptr) {
    return absl::InvalidArgumentError(
        "model config has no layers: pass a Sequential model with at least one layer");
  }
  const json& config = *found_config;
  STRATUM_ASSIGN_OR_RETURN(const json* layer_list, SequentialLayerList(config));
  const json& layers_json = *layer_list;
  if (layers_json.empty()) {
    return absl::InvalidArgumentError(
        "model config has no layers: pass a Sequential model with at least one layer");
  }
  impl.name = FindString(config, "name").value_or("sequential");
  impl.sequential = true;

  std::optional<Shape> input_shape;
  std::string input_name = "input_layer";
  std::vector<LayerSpec> layers;
  std::map<std::string, int> default_names;
  for (size_t i = 0; i < layers_json.size(); ++i) {
    const json& layer_json = layers_json[i];
    const std::optional<std::string> layer_class = FindString(layer_json, "class_name");
    const bool is_input = layer_class == "InputLayer";
    if (!layers.empty() && is_input) {
      return absl::InvalidArgumentError(
          absl::StrCat("model layer ", i, " is an InputLayer after other layers: put it first"));
    }
    const json* layer_config = Find(layer_json, "config");
    if (is_input && layer_config != nullptr && !layer_config->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model layer ", i, " (InputLayer) has config ", Dump(*layer_config),
                       ", which is not an object: give it {\"batch_shape\": [null, ...]}"));
    }
    if ((is_input || layers.empty()) && !input_shape && layer_class && layer_config != nullptr &&
        layer_config->is_object()) {
      const std::string name = FindString(*layer_config, "name").value_or(absl::StrCat("#", i));
      STRATUM_ASSIGN_OR_RETURN(input_shape,
                               keras::DeclaredInputShape(Where(name, *layer_class), *layer_config));
    }
    if (is_input) {
      if (layer_config != nullptr) {
        input_name = FindString(*layer_config, "name").value_or(input_name);
        STRATUM_RETURN_IF_ERROR(CheckInputLayer(*layer_config, input_name, impl));
      }
      continue;
    }
    STRATUM_ASSIGN_OR_RETURN(LayerSpec layer, MakeLayer(layer_json, i, default_names));
    layers.push_back(std::move(layer));
  }
  if (const json* build_shape = Find(config, "build_input_shape"); !input_shape && build_shape) {
    STRATUM_ASSIGN_OR_RETURN(Shape shape,
                             keras::ParseShape(*build_shape, true, "model build_input_shape"));
    input_shape = shape;
  }
  if (!input_shape) {
    return absl::InvalidArgumentError(
        "model has no input shape: start the Sequential model with keras.Input(shape=(...)) or "
        "give its first layer input_shape=(...)");
  }
  if (layers.empty()) {
    return absl::InvalidArgumentError(
        "model has only an InputLayer: add the layers to train (Flatten, Dense, ...)");
  }
  GraphBuilder graph(impl);
  int previous = graph.AddInput(input_name, *input_shape);
  for (LayerSpec& layer : layers) {
    STRATUM_RETURN_IF_ERROR(graph.AddNode(std::move(layer), {previous}));
    previous = impl.nodes.back().output;
  }
  return graph.Finish({previous});
}

// ---- Functional -------------------------------------------------------------------------

// One of Keras' tensor references: [layer name, node index, tensor index(, kwargs)].
absl::StatusOr<std::string> RefLayer(const json& ref, const std::string& what) {
  if (!ref.is_array() || ref.size() < 3 || !ref[0].is_string() || !ref[1].is_number_integer() ||
      !ref[2].is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " refers to ", Dump(ref),
                     ", which is not a Keras tensor reference [layer name, node index, tensor "
                     "index]: pass the text of Keras' model.to_json()"));
  }
  const std::string layer = ref[0].get<std::string>();
  if (ref[1].get<int64_t>() != 0 || ref[2].get<int64_t>() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " takes output ", Dump(ref[2]), " of call ", Dump(ref[1]), " of layer \"", layer,
        "\", but Stratum's layers are called once and have one output: give each call its own "
        "layer"));
  }
  if (ref.size() > 3 && ref[3].is_object()) {
    for (const auto& [key, value] : ref[3].items()) {
      if (!value.is_null()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, " calls \"", layer, "\" with ", key, "=", Dump(value),
                         ", which Stratum does not support: call the layer with its inputs only"));
      }
    }
  }
  return layer;
}

// Keras 3's call arguments: keras tensors ({"class_name": "__keras_tensor__", "config":
// {"keras_history": [...]}}), possibly in lists (a merge layer's one argument).
absl::Status CollectKerasTensors(const json& value, const std::string& what,
                                 std::vector<std::string>& layers) {
  if (value.is_array()) {
    for (const json& item : value) STRATUM_RETURN_IF_ERROR(CollectKerasTensors(item, what, layers));
    return absl::OkStatus();
  }
  if (FindString(value, "class_name") == "__keras_tensor__") {
    const json* config = Find(value, "config");
    const json* history = config ? Find(*config, "keras_history") : nullptr;
    STRATUM_ASSIGN_OR_RETURN(std::string layer, RefLayer(history ? *history : json(), what));
    layers.push_back(std::move(layer));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " is called with ", Dump(value),
                   ", which is not a Keras tensor: Stratum's layers take only tensors"));
}

// The layers whose outputs a Functional model's layer takes, from its inbound_nodes.
absl::StatusOr<std::vector<std::string>> InboundLayers(const json& layer_json,
                                                       const std::string& where) {
  const json* nodes = Find(layer_json, "inbound_nodes");
  if (nodes == nullptr || !nodes->is_array() || nodes->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     " has no inbound_nodes, so nothing calls it: remove it, or pass the text of "
                     "Keras' model.to_json() of a model that uses it"));
  }
  if (nodes->size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is called ", nodes->size(),
                     " times (a shared layer), which Stratum does not support: give each call "
                     "its own layer"));
  }
  const json& node = (*nodes)[0];
  std::vector<std::string> layers;
  if (node.is_array()) {  // tf.keras 2: [[name, node, tensor, kwargs], ...]
    for (const json& ref : node) {
      STRATUM_ASSIGN_OR_RETURN(std::string layer, RefLayer(ref, where));
      layers.push_back(std::move(layer));
    }
  } else {  // Keras 3: {"args": [...], "kwargs": {...}}
    const json* args = Find(node, "args");
    if (args == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, " has inbound node ", Dump(node),
                                                     ", which has no args: pass the text of "
                                                     "Keras' model.to_json()"));
    }
    STRATUM_RETURN_IF_ERROR(CollectKerasTensors(*args, where, layers));
    if (const json* kwargs = Find(node, "kwargs"); kwargs != nullptr && kwargs->is_object()) {
      for (const auto& [key, value] : kwargs->items()) {
        if (!value.is_null()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, " is called with ", key, "=", Dump(value),
              ", which Stratum does not support: call the layer with its inputs only"));
        }
      }
    }
  }
  if (layers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where,
                                                   " is called without inputs: pass the "
                                                   "text of Keras' model.to_json()"));
  }
  return layers;
}

// input_layers / output_layers: one reference, a list of them, or (Keras 3, named) an
// object of them.
// `keys` (when given) receives the names the model's caller passes them by: an object's keys
// (Keras' dict of inputs), else the layers' own names.
absl::StatusOr<std::vector<std::string>> EndpointLayers(const json& config, const char* key,
                                                        std::vector<std::string>* keys = nullptr) {
  const json* value = Find(config, key);
  const std::string what = absl::StrCat("model ", key);
  if (value == nullptr || !(value->is_array() || value->is_object()) || value->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", value ? Dump(*value) : std::string("missing"),
        ": pass the text of Keras' model.to_json() of a model built as keras.Model(inputs, "
        "outputs)"));
  }
  std::vector<std::string> layers;
  if (value->is_array() && !value->empty() && (*value)[0].is_string()) {
    STRATUM_ASSIGN_OR_RETURN(std::string layer, RefLayer(*value, what));
    layers.push_back(std::move(layer));
    if (keys != nullptr) *keys = layers;
    return layers;
  }
  for (const json& ref : value->is_object() ? [&] {
         json refs = json::array();
         for (const auto& [name, item] : value->items()) refs.push_back(item);
         return refs;
       }()
                                            : *value) {
    STRATUM_ASSIGN_OR_RETURN(std::string layer, RefLayer(ref, what));
    layers.push_back(std::move(layer));
  }
  if (keys != nullptr) {
    keys->clear();
    if (value->is_object()) {
      for (const auto& [name, item] : value->items()) keys->push_back(name);
    } else {
      *keys = layers;
    }
  }
  return layers;
}

// Adds the layers, each once the layers it takes are in the graph (Keras lists them in such
// an order; a list written by hand need not be).
absl::Status AddInOrder(GraphBuilder& graph, std::vector<LayerSpec>& pending) {
  std::set<std::string> names;
  for (const LayerSpec& layer : pending) names.insert(layer.name);
  while (!pending.empty()) {
    bool progress = false;
    for (size_t i = 0; i < pending.size();) {
      const LayerSpec& layer = pending[i];
      if (!std::all_of(layer.inbound.begin(), layer.inbound.end(),
                       [&](const std::string& name) { return graph.Has(name); })) {
        ++i;
        continue;
      }
      std::vector<int> inputs;
      for (const std::string& name : layer.inbound) inputs.push_back(graph.TensorOf(name));
      STRATUM_RETURN_IF_ERROR(graph.AddNode(std::move(pending[i]), inputs));
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      progress = true;
    }
    if (progress) continue;
    const LayerSpec& stuck = pending.front();
    const std::string where = Where(stuck.name, stuck.class_name);
    for (const std::string& name : stuck.inbound) {
      if (!graph.Has(name) && names.count(name) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " takes the output of \"", name,
            "\", which the model does not have: pass the text of Keras' model.to_json()"));
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        " takes, through other layers, its own output (a cycle): a Keras model's layers "
        "form a graph without cycles"));
  }
  return absl::OkStatus();
}

absl::Status BuildFunctional(const json& spec, Model::Impl& impl) {
  const json* config = Find(spec, "config");
  const json* layers_json = config ? Find(*config, "layers") : nullptr;
  if (layers_json == nullptr || !layers_json->is_array() || layers_json->empty()) {
    return absl::InvalidArgumentError(
        "model config has no layers: pass the text of Keras' model.to_json() of a model built as "
        "keras.Model(inputs, outputs)");
  }
  impl.name = FindString(*config, "name").value_or("model");
  impl.sequential = false;
  STRATUM_ASSIGN_OR_RETURN(const std::vector<std::string> input_layers,
                           EndpointLayers(*config, "input_layers", &impl.input_keys));
  STRATUM_ASSIGN_OR_RETURN(const std::vector<std::string> output_layers,
                           EndpointLayers(*config, "output_layers"));

  // Inputs, in the order input_layers gives; then the layers, each once its inputs exist.
  std::map<std::string, Shape> input_shapes;
  std::vector<LayerSpec> pending;
  std::map<std::string, int> default_names;
  for (size_t i = 0; i < layers_json->size(); ++i) {
    const json& layer_json = (*layers_json)[i];
    if (FindString(layer_json, "class_name") == "InputLayer") {
      const json* layer_config = Find(layer_json, "config");
      if (layer_config == nullptr || !layer_config->is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat("model layer ", i, " (InputLayer) has config ",
                         layer_config ? Dump(*layer_config) : std::string("missing"),
                         ", which is not an object: give it {\"batch_shape\": [null, ...]}"));
      }
      const std::string name = FindString(*layer_config, "name")
                                   .value_or(FindString(layer_json, "name").value_or("input"));
      const std::string where = Where(name, "InputLayer");
      STRATUM_RETURN_IF_ERROR(CheckInputLayer(*layer_config, name, impl));
      STRATUM_ASSIGN_OR_RETURN(std::optional<Shape> shape,
                               keras::DeclaredInputShape(where, *layer_config));
      if (!shape) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " has no shape: create it with keras.Input(shape=(...))"));
      }
      input_shapes[name] = *shape;
      continue;
    }
    STRATUM_ASSIGN_OR_RETURN(LayerSpec layer, MakeLayer(layer_json, i, default_names));
    STRATUM_ASSIGN_OR_RETURN(layer.inbound,
                             InboundLayers(layer_json, Where(layer.name, layer.class_name)));
    pending.push_back(std::move(layer));
  }
  GraphBuilder graph(impl);
  for (const std::string& name : input_layers) {
    const auto shape = input_shapes.find(name);
    if (shape == input_shapes.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model input_layers names \"", name,
          "\", which is not an InputLayer of the model: list the model's keras.Input layers"));
    }
    if (graph.Has(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model input_layers names \"", name, "\" twice: list each input once"));
    }
    graph.AddInput(name, shape->second);
  }
  for (const auto& [name, shape] : input_shapes) {
    if (!graph.Has(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model InputLayer \"", name,
                       "\" is not among the model's input_layers: remove it, or make it an input"));
    }
  }
  STRATUM_RETURN_IF_ERROR(AddInOrder(graph, pending));
  std::vector<int> outputs;
  for (const std::string& name : output_layers) {
    if (!graph.Has(name)) {
      return absl::InvalidArgumentError(absl::StrCat("model output_layers names \"", name,
                                                     "\", which the model does not have: list the "
                                                     "layers whose outputs are the model's"));
    }
    outputs.push_back(graph.TensorOf(name));
  }
  return graph.Finish(outputs);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model::Impl>> BuildModelGraph(const json& input) {
  json storage;
  STRATUM_ASSIGN_OR_RETURN(const json* unwrapped, keras::Unwrap(input, storage));
  const json& spec = *unwrapped;
  const std::optional<std::string> model_class = FindString(spec, "class_name");
  if (!model_class) {
    return absl::InvalidArgumentError(
        "model JSON has no \"class_name\": pass the text of Keras' model.to_json() for a "
        "Sequential or Functional model");
  }
  auto impl = std::make_unique<Model::Impl>();
  if (*model_class == "Sequential") {
    STRATUM_RETURN_IF_ERROR(BuildSequential(spec, *impl));
  } else if (*model_class == "Functional" || *model_class == "Model") {
    STRATUM_RETURN_IF_ERROR(BuildFunctional(spec, *impl));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "model has class \"", *model_class,
        "\", which Stratum does not support: build the model as keras.Sequential([...]) or with "
        "the functional API (keras.Model(inputs, outputs)) and save its to_json()"));
  }
  return impl;
}

}  // namespace stratum

// Test helpers: Keras' model.to_json() of Functional models, in the tf.keras 2 and the Keras 3
// forms, written from a short description of the graph.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace stratum::testing {

// One layer call: the layer ({"class_name", "config"}, its config naming it) and the layers
// (or inputs) whose outputs it takes.
struct Call {
  nlohmann::json layer;
  std::vector<std::string> inbound;
};

struct Graph {
  std::vector<std::pair<std::string, std::vector<int64_t>>> inputs;  // name, shape
  std::vector<Call> calls;
  std::vector<std::string> outputs;
};

inline nlohmann::json Layer(const std::string& class_name, const std::string& name,
                            nlohmann::json config = nlohmann::json::object()) {
  config["name"] = name;
  return {{"class_name", class_name}, {"config", config}};
}

inline nlohmann::json BatchShape(const std::vector<int64_t>& shape) {
  nlohmann::json dims = nlohmann::json::array({nullptr});
  for (int64_t dim : shape) dims.push_back(dim);
  return dims;
}

// tf.keras 2: inbound_nodes [[[name, 0, 0, {}], ...]], endpoints [[name, 0, 0], ...].
inline nlohmann::json Keras2Functional(const Graph& graph) {
  using nlohmann::json;
  json layers = json::array();
  json inputs = json::array();
  for (const auto& [name, shape] : graph.inputs) {
    layers.push_back({{"class_name", "InputLayer"},
                      {"name", name},
                      {"config",
                       {{"batch_input_shape", BatchShape(shape)},
                        {"dtype", "float32"},
                        {"sparse", false},
                        {"ragged", false},
                        {"name", name}}},
                      {"inbound_nodes", json::array()}});
    inputs.push_back({name, 0, 0});
  }
  for (const Call& call : graph.calls) {
    json node = json::array();
    for (const std::string& from : call.inbound) node.push_back({from, 0, 0, json::object()});
    json layer = call.layer;
    layer["name"] = call.layer["config"]["name"];
    layer["inbound_nodes"] = json::array({node});
    layers.push_back(layer);
  }
  json outputs = json::array();
  for (const std::string& name : graph.outputs) outputs.push_back({name, 0, 0});
  return {{"class_name", "Functional"},
          {"config",
           {{"name", "model"},
            {"layers", layers},
            {"input_layers", inputs},
            {"output_layers", outputs}}},
          {"keras_version", "2.15.0"},
          {"backend", "tensorflow"}};
}

// Keras 3: inbound_nodes [{"args": [keras tensor or [tensors...]], "kwargs": {}}], a single
// endpoint written as one reference.
inline nlohmann::json Keras3Functional(const Graph& graph) {
  using nlohmann::json;
  auto tensor = [](const std::string& from) {
    return json{
        {"class_name", "__keras_tensor__"},
        {"config",
         {{"shape", json::array()}, {"dtype", "float32"}, {"keras_history", {from, 0, 0}}}}};
  };
  json layers = json::array();
  json inputs = json::array();
  for (const auto& [name, shape] : graph.inputs) {
    layers.push_back({{"module", "keras.layers"},
                      {"class_name", "InputLayer"},
                      {"config",
                       {{"batch_shape", BatchShape(shape)},
                        {"dtype", "float32"},
                        {"sparse", false},
                        {"name", name}}},
                      {"registered_name", nullptr},
                      {"name", name},
                      {"inbound_nodes", json::array()}});
    inputs.push_back({name, 0, 0});
  }
  for (const Call& call : graph.calls) {
    json args = json::array();
    if (call.inbound.size() == 1) {
      args.push_back(tensor(call.inbound[0]));
    } else {
      json list = json::array();
      for (const std::string& from : call.inbound) list.push_back(tensor(from));
      args.push_back(list);
    }
    json layer = call.layer;
    layer["module"] = "keras.layers";
    layer["registered_name"] = nullptr;
    layer["name"] = call.layer["config"]["name"];
    layer["inbound_nodes"] = json::array({{{"args", args}, {"kwargs", json::object()}}});
    layers.push_back(layer);
  }
  json outputs = json::array();
  for (const std::string& name : graph.outputs) outputs.push_back({name, 0, 0});
  return {{"module", "keras"},
          {"class_name", "Functional"},
          {"config",
           {{"name", "functional"},
            {"trainable", true},
            {"layers", layers},
            {"input_layers", inputs.size() == 1 ? inputs[0] : inputs},
            {"output_layers", outputs.size() == 1 ? outputs[0] : outputs}}},
          {"registered_name", "Functional"}};
}

// Two inputs of 392 values (the top and bottom halves of a 28x28 image), a Dense branch
// each, a residual Add of one branch onto a hidden layer that feeds two layers, and a
// softmax classifier: the functional model the integration tests train on every strategy.
inline Graph TwoInputResidualGraph(int hidden = 32, int classes = 10) {
  using nlohmann::json;
  return Graph{
      .inputs = {{"top", {392}}, {"bottom", {392}}},
      .calls = {{Layer("Dense", "top_dense", {{"units", hidden}, {"activation", "relu"}}), {"top"}},
                {Layer("Dense", "bottom_dense", {{"units", hidden}, {"activation", "relu"}}),
                 {"bottom"}},
                {Layer("Dense", "mix", {{"units", hidden}, {"activation", "tanh"}}), {"top_dense"}},
                {Layer("Add", "residual"), {"mix", "top_dense", "bottom_dense"}},
                {Layer("Dense", "classes", {{"units", classes}, {"activation", "softmax"}}),
                 {"residual"}}},
      .outputs = {"classes"}};
}

}  // namespace stratum::testing

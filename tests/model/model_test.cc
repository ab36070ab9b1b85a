// Model: Keras JSON parsing (Keras 2 and 3, the string-wrapped file), refusals, initial
// variables, dropout, loss scaling, input validation, and a throughput print-out.
#include "stratum/model/model.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stratum/model/optimizer.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

// tf.keras 2.x: model.to_json() of Sequential([Flatten(input_shape=(28, 28)),
// Dense(128, activation="relu"), Dense(10, activation="softmax")]).
const char kKeras2Json[] =
    R"({"class_name": "Sequential", "config": {"name": "sequential", "layers": [)"
    R"({"class_name": "InputLayer", "config": {"batch_input_shape": [null, 28, 28], "dtype": "float32", "sparse": false, "ragged": false, "name": "flatten_input"}}, )"
    R"({"class_name": "Flatten", "config": {"name": "flatten", "trainable": true, "dtype": "float32", "batch_input_shape": [null, 28, 28], "data_format": "channels_last"}}, )"
    R"({"class_name": "Dense", "config": {"name": "dense", "trainable": true, "dtype": "float32", "units": 128, "activation": "relu", "use_bias": true, "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}}, "bias_initializer": {"class_name": "Zeros", "config": {}}, "kernel_regularizer": null, "bias_regularizer": null, "activity_regularizer": null, "kernel_constraint": null, "bias_constraint": null}}, )"
    R"({"class_name": "Dense", "config": {"name": "dense_1", "trainable": true, "dtype": "float32", "units": 10, "activation": "softmax", "use_bias": true, "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}}, "bias_initializer": {"class_name": "Zeros", "config": {}}, "kernel_regularizer": null, "bias_regularizer": null, "activity_regularizer": null, "kernel_constraint": null, "bias_constraint": null}}]}, )"
    R"("keras_version": "2.15.0", "backend": "tensorflow"})";

// Keras 3.x: model.to_json() of Sequential([Input((28, 28)), Flatten(), Dense(128, "relu"),
// Dense(10, "softmax")]).
const char kKeras3Json[] =
    R"({"module": "keras", "class_name": "Sequential", "config": {"name": "sequential", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "layers": [)"
    R"({"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": [null, 28, 28], "dtype": "float32", "sparse": false, "name": "input_layer"}, "registered_name": null}, )"
    R"({"module": "keras.layers", "class_name": "Flatten", "config": {"name": "flatten", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "data_format": "channels_last"}, "registered_name": null, "build_config": {"input_shape": [null, 28, 28]}}, )"
    R"({"module": "keras.layers", "class_name": "Dense", "config": {"name": "dense", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "units": 128, "activation": "relu", "use_bias": true, "kernel_initializer": {"module": "keras.initializers", "class_name": "GlorotUniform", "config": {"seed": null}, "registered_name": null}, "bias_initializer": {"module": "keras.initializers", "class_name": "Zeros", "config": {}, "registered_name": null}, "kernel_regularizer": null, "bias_regularizer": null, "kernel_constraint": null, "bias_constraint": null}, "registered_name": null, "build_config": {"input_shape": [null, 784]}}, )"
    R"({"module": "keras.layers", "class_name": "Dense", "config": {"name": "dense_1", "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}, "units": 10, "activation": "softmax", "use_bias": true, "kernel_initializer": {"module": "keras.initializers", "class_name": "GlorotUniform", "config": {"seed": null}, "registered_name": null}, "bias_initializer": {"module": "keras.initializers", "class_name": "Zeros", "config": {}, "registered_name": null}, "kernel_regularizer": null, "bias_regularizer": null, "kernel_constraint": null, "bias_constraint": null}, "registered_name": null, "build_config": {"input_shape": [null, 128]}}], )"
    R"("build_input_shape": [null, 28, 28]}, "registered_name": null, "build_config": {"input_shape": [null, 28, 28]}})";

Model MustParse(absl::string_view text) {
  auto model = Model::FromKerasJson(text);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

void ExpectReferenceModel(const Model& model) {
  EXPECT_EQ(model.input_shape(), Shape({28, 28}));
  EXPECT_EQ(model.output_size(), 10);
  ASSERT_EQ(model.variables().size(), 4u);
  EXPECT_EQ(model.variables()[0].name, "dense/kernel");
  EXPECT_EQ(model.variables()[0].shape, Shape({784, 128}));
  EXPECT_EQ(model.variables()[0].initializer, "glorot_uniform");
  EXPECT_EQ(model.variables()[1].name, "dense/bias");
  EXPECT_EQ(model.variables()[1].shape, Shape({128}));
  EXPECT_EQ(model.variables()[1].initializer, "zeros");
  EXPECT_EQ(model.variables()[2].name, "dense_1/kernel");
  EXPECT_EQ(model.variables()[2].shape, Shape({128, 10}));
  EXPECT_EQ(model.variables()[3].name, "dense_1/bias");
  EXPECT_EQ(model.num_parameters(), 101770);
}

TEST(ModelJsonTest, ParsesKeras2ToJson) { ExpectReferenceModel(MustParse(kKeras2Json)); }

TEST(ModelJsonTest, ParsesKeras3ToJson) { ExpectReferenceModel(MustParse(kKeras3Json)); }

TEST(ModelJsonTest, UnwrapsTheJsonStringKerasWritesToAFile) {
  // json.dump(model.to_json(), f): the model text as one JSON string.
  ExpectReferenceModel(MustParse(json(std::string(kKeras3Json)).dump()));
  ExpectReferenceModel(MustParse(json(std::string(kKeras2Json)).dump()));
  auto from_json = Model::FromKerasJson(json(std::string(kKeras2Json)));
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  ExpectReferenceModel(*from_json);
}

TEST(ModelJsonTest, InputShapeFromFirstLayerOrBuildShape) {
  // The design document's job-spec form: input_shape on the first layer, no InputLayer.
  const Model model = MustParse(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "Flatten", "config": {"input_shape": [28, 28]}},
      {"class_name": "Dense", "config": {"units": 128, "activation": "relu"}},
      {"class_name": "Dense", "config": {"units": 10, "activation": "softmax"}}]}})");
  ExpectReferenceModel(model);
  const Model batch_shape = MustParse(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "Dense", "config": {"units": 3, "batch_shape": [null, 5]}}]}})");
  EXPECT_EQ(batch_shape.input_shape(), Shape({5}));
  const Model built = MustParse(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "Dense", "config": {"units": 3}}], "build_input_shape": [null, 7]}})");
  EXPECT_EQ(built.input_shape(), Shape({7}));
}

TEST(ModelJsonTest, SummaryLooksLikeKeras) {
  const std::string summary = MustParse(kKeras3Json).Summary();
  EXPECT_THAT(summary, HasSubstr("Model: \"sequential\""));
  EXPECT_THAT(summary, HasSubstr(" flatten (Flatten)           (None, 784)               0\n"));
  EXPECT_THAT(summary,
              HasSubstr(" dense (Dense)               (None, 128)               100,480\n"));
  EXPECT_THAT(summary, HasSubstr(" dense_1 (Dense)             (None, 10)                1,290\n"));
  EXPECT_THAT(summary, HasSubstr("Total params: 101,770"));
}

std::string Refusal(const std::string& text) {
  auto model = Model::FromKerasJson(text);
  EXPECT_FALSE(model.ok()) << text;
  return model.ok() ? "" : std::string(model.status().message());
}

// A Sequential model with an InputLayer of shape [4] and one extra layer.
std::string WithLayer(const std::string& layer) {
  return R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 4]}}, )" +
         layer + "]}}";
}

// Keras' mixed precision policies in each form to_json() writes them (Keras 3.0's string,
// Keras 2's Policy object, Keras 3.4's DTypePolicy object): the model's policy; an output
// Activation and a BatchNormalization may stay float32, as Keras' guide has them.
TEST(ModelJsonTest, ReadsKerasMixedPrecisionPolicies) {
  auto model_with = [](const std::string& dtype) {
    return absl::StrCat(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "InputLayer", "config": {"batch_shape": [null, 4], "dtype": "float32"}},
      {"class_name": "Dense", "config": {"name": "d", "units": 3, "dtype": )",
                        dtype, R"(}},
      {"class_name": "BatchNormalization", "config": {"name": "bn", "dtype": "float32"}},
      {"class_name": "Dense", "config": {"name": "e", "units": 2, "dtype": )",
                        dtype, R"(}},
      {"class_name": "Activation", "config": {"name": "out", "activation": "softmax",
        "dtype": "float32"}}]}})");
  };
  const std::pair<std::string, DtypePolicy> forms[] = {
      {R"("mixed_bfloat16")", DtypePolicy::kMixedBfloat16},
      {R"({"module": "keras.mixed_precision", "class_name": "Policy",
          "config": {"name": "mixed_float16"}, "registered_name": null})",
       DtypePolicy::kMixedFloat16},
      {R"({"module": "keras", "class_name": "DTypePolicy",
          "config": {"name": "mixed_bfloat16"}, "registered_name": null})",
       DtypePolicy::kMixedBfloat16},
      {R"("float32")", DtypePolicy::kFloat32}};
  for (const auto& [form, policy] : forms) {
    absl::StatusOr<Model> model = Model::FromKerasJson(model_with(form));
    ASSERT_OK(model.status()) << form;
    EXPECT_EQ(model->dtype_policy(), policy) << form;
  }
  EXPECT_STREQ(DtypePolicyName(DtypePolicy::kMixedBfloat16), "mixed_bfloat16");
  // A float32 layer with variables (other than BatchNormalization) in a mixed model, and two
  // mixed policies in one model, are refused by name.
  EXPECT_EQ(Refusal(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "InputLayer", "config": {"batch_shape": [null, 4]}},
      {"class_name": "Dense", "config": {"name": "d", "units": 3, "dtype": "float32"}},
      {"class_name": "Dense", "config": {"name": "e", "units": 2,
        "dtype": "mixed_bfloat16"}}]}})"),
            "model layer \"d\" (Dense) has dtype float32 in a model of policy mixed_bfloat16 "
            "(model layer \"e\" (Dense)): Stratum computes such a model's layers with variables "
            "in one precision; give it the model's policy (only layers without variables, such "
            "as an output Activation, and BatchNormalization may say float32)");
  EXPECT_EQ(Refusal(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "InputLayer", "config": {"batch_shape": [null, 4]}},
      {"class_name": "Dense", "config": {"name": "d", "units": 3, "dtype": "mixed_float16"}},
      {"class_name": "Dense", "config": {"name": "e", "units": 2,
        "dtype": "mixed_bfloat16"}}]}})"),
            "model layer \"e\" (Dense) has dtype policy mixed_bfloat16, but model layer \"d\" "
            "(Dense) has mixed_float16: give every layer the same policy");
}

TEST(ModelJsonTest, RefusesUnsupportedModelsByName) {
  EXPECT_EQ(Refusal(WithLayer(R"({"class_name": "Conv3D", "config": {"name": "conv3d"}})")),
            "model layer \"conv3d\" has class \"Conv3D\", which Stratum does not support: use "
            "InputLayer, Activation, Add, Average, AveragePooling2D, BatchNormalization, "
            "Concatenate, Conv2D, Dense, Dropout, Embedding, Flatten, GlobalAveragePooling1D, "
            "GlobalAveragePooling2D, "
            "GlobalMaxPooling2D, IntegerLookup, MaxPooling2D, Multiply, ReLU, Reshape, "
            "SyncBatchNormalization or ZeroPadding2D");
  EXPECT_EQ(Refusal(WithLayer(R"({"class_name": "Dense", "config": {"name": "d", "units": 2,
                "activation": "elu"}})")),
            "model layer \"d\" (Dense) has activation \"elu\", which Stratum does not support: "
            "use relu, softmax, sigmoid, tanh or linear");
  EXPECT_THAT(Refusal(WithLayer(R"({"class_name": "Activation", "config": {"activation":
                "swish"}})")),
              HasSubstr("has activation \"swish\""));
  // A misspelt option is not ignored (the layer would be built without it).
  EXPECT_EQ(Refusal(WithLayer(R"({"class_name": "Dense", "config": {"name": "d", "units": 2,
                "activaton": "relu"}})")),
            "model layer \"d\" (Dense) has config key \"activaton\", which Keras' layer does not "
            "have: check its spelling (this layer takes units, activation, use_bias, "
            "kernel_initializer, bias_initializer, kernel_regularizer, bias_regularizer, "
            "kernel_constraint, bias_constraint, lora_rank, lora_alpha, quantization_config) or "
            "remove it");
  EXPECT_THAT(Refusal(WithLayer(R"({"class_name": "Dropout", "config": {"rate": 0.1,
                "rte": 0.5}})")),
              HasSubstr("has config key \"rte\""));
  // (kernel_regularizer and bias_regularizer are supported: ModelRegularizerTest.)
  for (const char* key : {"activity_regularizer", "kernel_constraint", "bias_constraint"}) {
    EXPECT_EQ(Refusal(WithLayer(std::string(R"({"class_name": "Dense", "config": {"name": "d",
                "units": 2, ")") +
                                key + R"(": {"class_name": "L2", "config": {"l2": 0.01}}}})")),
              std::string("model layer \"d\" (Dense) sets ") + key +
                  " to {\"class_name\":\"L2\",\"config\":{\"l2\":0.01}}, which Stratum does not "
                  "support: remove it (set it to None)");
  }
  EXPECT_EQ(Refusal(WithLayer(R"({"class_name": "Dense", "config": {"name": "d", "units": 2,
                "kernel_initializer": {"class_name": "RandomNormal", "config": {}}}})")),
            "model layer \"d\" (Dense) has kernel_initializer \"RandomNormal\", which Stratum "
            "does not support: use glorot_uniform, zeros, ones, he_uniform, lecun_uniform or "
            "random_uniform");
  EXPECT_THAT(Refusal(WithLayer(R"({"class_name": "Dense", "config": {"name": "d", "units": 2,
                "bias_initializer": "orthogonal"}})")),
              HasSubstr("bias_initializer \"orthogonal\""));
  EXPECT_EQ(Refusal(R"({"class_name": "MyModel", "config": {"layers": []}})"),
            "model has class \"MyModel\", which Stratum does not support: build the model as "
            "keras.Sequential([...]) or with the functional API (keras.Model(inputs, outputs)) "
            "and save its to_json()");
  EXPECT_THAT(Refusal(R"({"class_name": "Functional", "config": {"layers": []}})"),
              HasSubstr("model config has no layers"));
  EXPECT_EQ(Refusal(R"({"class_name": "Sequential", "config": {"layers": [
                {"class_name": "Dense", "config": {"units": 2}}]}})"),
            "model has no input shape: start the Sequential model with keras.Input(shape=(...)) "
            "or give its first layer input_shape=(...)");
  EXPECT_EQ(Refusal(WithLayer(R"({"class_name": "Dense", "config": {"name": "d", "units": 2,
                "dtype": {"module": "keras", "class_name": "DTypePolicy",
                "config": {"name": "float16"}}}})")),
            "model layer \"d\" (Dense) has dtype \"float16\", which Stratum does not support: "
            "use float32, or a mixed precision policy (mixed_bfloat16, mixed_float16: variables "
            "in float32, computed in half precision on GPUs)");
  EXPECT_THAT(Refusal(WithLayer(R"({"class_name": "Dropout", "config": {"name": "do",
                "rate": 1.0}})")),
              HasSubstr("model layer \"do\" (Dropout) has rate 1.0: set rate to a number in "
                        "[0, 1)"));
  EXPECT_THAT(Refusal(WithLayer(R"({"class_name": "Dropout", "config": {"rate": 0.5,
                "noise_shape": [null, 1]}})")),
              HasSubstr("sets noise_shape"));
  EXPECT_THAT(Refusal(WithLayer(R"({"class_name": "Dense", "config": {"name": "d"}})")),
              HasSubstr("model layer \"d\" (Dense) has units missing: set units to a positive "
                        "integer"));
  EXPECT_THAT(Refusal(WithLayer(R"({"class_name": "Dense", "config": {"units": 2,
                "trainable": false}})")),
              HasSubstr("has trainable false"));
  EXPECT_THAT(Refusal(R"({"class_name": "Sequential", "config": {"layers": [
                {"class_name": "InputLayer", "config": {"batch_shape": [null, null, 3]}},
                {"class_name": "Flatten", "config": {}}]}})"),
              HasSubstr("whose dimension 1 is null"));
  EXPECT_THAT(Refusal(R"({"class_name": "Sequential", "config": {"layers": [
                {"class_name": "InputLayer", "config": {"batch_shape": [null, 4, 3]}},
                {"class_name": "Dense", "config": {"units": 2}}]}})"),
              HasSubstr("model output has shape (None, 4, 2), but Stratum's losses take (None, "
                        "classes): add a Flatten layer before the last Dense layer"));
  EXPECT_THAT(Refusal(R"({"class_name": "Sequential", "config": {"layers": [
                {"class_name": "InputLayer", "config": {"batch_shape": [null, 4, 3]}},
                {"class_name": "Flatten", "config": {"data_format": "channels_first"}}]}})"),
              HasSubstr("data_format channels_first"));
  EXPECT_THAT(Refusal("{not json"), HasSubstr("model JSON is not valid JSON"));
  EXPECT_THAT(Refusal(R"({"class_name": "Sequential", "config": {"layers": []}})"),
              HasSubstr("model config has no layers"));
}

// Malformed JSON of the right syntax must give INVALID_ARGUMENT, never an exception or a
// read of a missing key.
TEST(ModelJsonTest, MalformedFieldsAreInvalidArgumentNotExceptions) {
  const std::string inputs[] = {
      R"({"class_name": "Sequential", "config": 1})",
      R"({"class_name": "Sequential", "config": "layers"})",
      R"({"class_name": "Sequential", "config": {"layers": 7}})",
      R"({"class_name": "Sequential", "config": {"name": 3, "layers": [1, null, "x"]}})",
      WithLayer(R"({"class_name": "Flatten", "config": []})"),
      WithLayer(R"({"class_name": "Flatten", "config": 5})"),
      WithLayer(R"({"class_name": "Dropout", "config": []})"),
      WithLayer(R"({"class_name": "Dropout", "config": {"rate": "0.5"}})"),
      WithLayer(R"({"class_name": "Dense", "config": []})"),
      WithLayer(R"({"class_name": "Dense", "config": {"units": 2, "activation": 7}})"),
      WithLayer(R"({"class_name": "Dense", "config": {"units": 2.5}})"),
      WithLayer(R"({"class_name": "Activation", "config": {"activation": []}})"),
      WithLayer(R"({"class_name": "Dense", "config": {"units": 2, "trainable": "no"}})"),
      WithLayer(R"({"class_name": "Flatten", "config": {"data_format": 1}})"),
      R"({"class_name": "Sequential", "config": {"layers": [
          {"class_name": "InputLayer", "config": {"batch_shape": [null, 4], "ragged": "yes"}},
          {"class_name": "Dense", "config": {"units": 2}}]}})",
      R"({"class_name": "Sequential", "config": {"layers": [
          {"class_name": "InputLayer", "config": {"batch_shape": [null, 4], "dtype": 5}},
          {"class_name": "Dense", "config": {"units": 2}}]}})",
      R"({"class_name": "Sequential", "config": {"layers": [
          {"config": {"batch_input_shape": [null, 784]}}]}})",
      R"({"class_name": "Sequential", "config": {"layers": [
          {"class_name": 5, "config": {"batch_input_shape": [null, 784]}}]}})",
      R"({"class_name": "Sequential", "config": {"layers": [
          {"class_name": "Dense", "config": {"units": 2, "batch_shape": {"a": 1}}}]}})",
      R"({"class_name": "Sequential", "config": {"layers": [
          {"class_name": "Dense", "config": {"units": 2}}], "build_input_shape": 3}})",
      R"({"class_name": "Sequential", "config": {"layers": [
          {"class_name": "Dense", "config": {"units": 2, "batch_shape": [null, 18446744073709551615]}}]}})",
      R"({"class_name": "Sequential", "config": {"layers": [
          {"class_name": "Dense", "config": {"units": 2, "input_shape": [-1.5]}}]}})",
  };
  for (const std::string& text : inputs) {
    absl::StatusOr<Model> model = absl::InternalError("not run");
    EXPECT_NO_THROW(model = Model::FromKerasJson(text)) << text;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument)
        << text << " -> " << model.status();
    EXPECT_NO_THROW(model = Model::FromKerasJson(json::parse(text))) << text;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument)
        << text << " -> " << model.status();
  }
  EXPECT_THAT(Refusal(WithLayer(R"({"class_name": "Dropout", "config": []})")),
              HasSubstr("model layer 1 (Dropout) has config [], which is not an object"));
  // A name that is not a string falls back to Keras' default name; a null flag is false.
  absl::StatusOr<Model> named = absl::InternalError("not run");
  EXPECT_NO_THROW(named = Model::FromKerasJson(R"({"class_name": "Sequential", "config": {
      "layers": [{"class_name": "InputLayer", "config": {"batch_shape": [null, 4], "name": 5,
                  "sparse": null, "ragged": null}},
                 {"class_name": "Dense", "config": {"units": 2, "name": 5}}]}})"));
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->variables()[0].name, "dense/kernel");
}

TEST(ModelJsonTest, DeeplyNestedJsonIsRefusedWithoutCrashing) {
  std::string text = R"({"class_name": "Sequential", "config": {"layers": [)";
  const int depth = 5000;
  for (int i = 0; i < depth; ++i) text += "[";
  for (int i = 0; i < depth; ++i) text += "]";
  text += "]}}";
  EXPECT_EQ(Model::FromKerasJson(text).status().code(), absl::StatusCode::kInvalidArgument);
}

// Sizes that would allocate terabytes or overflow int64 element counts are refused at
// parse time, naming the layer.
TEST(ModelJsonTest, RefusesLayersTooLargeToAllocate) {
  EXPECT_THAT(Refusal(R"({"class_name": "Sequential", "config": {"layers": [
                {"class_name": "InputLayer", "config": {"batch_shape": [null, 784]}},
                {"class_name": "Dense", "config": {"name": "huge", "units": 1000000000}}]}})"),
              AllOf(HasSubstr("model layer \"huge\" (Dense)"), HasSubstr("784 x 1000000000"),
                    HasSubstr("2^31")));
  EXPECT_THAT(Refusal(R"({"class_name": "Sequential", "config": {"layers": [
                {"class_name": "InputLayer", "config": {"batch_shape": [null, 4]}},
                {"class_name": "Dense", "config": {"name": "wide", "units": 9223372036854775807}}]}})"),
              HasSubstr("model layer \"wide\" (Dense)"));
  EXPECT_THAT(Refusal(R"({"class_name": "Sequential", "config": {"layers": [
                {"class_name": "InputLayer", "config": {"batch_shape": [null, 4294967296, 4294967296]}},
                {"class_name": "Flatten", "config": {}}]}})"),
              HasSubstr("2^31"));
  EXPECT_THAT(Refusal(R"({"class_name": "Sequential", "config": {"layers": [
                {"class_name": "InputLayer", "config": {"batch_shape": [null, 65536, 65536]}},
                {"class_name": "Flatten", "config": {}}]}})"),
              HasSubstr("2^31"));
  // Each variable under the limit, but the total over it.
  std::string many = R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "InputLayer", "config": {"batch_shape": [null, 40000]}})";
  for (int i = 0; i < 4; ++i) {
    many += R"(, {"class_name": "Dense", "config": {"units": 40000}})";
  }
  many += "]}}";
  EXPECT_THAT(Refusal(many), AllOf(HasSubstr("model layer \"dense_1\" (Dense)"),
                                   HasSubstr("parameters"), HasSubstr("2^31")));
}

TEST(ModelInitTest, GlorotLimitsAndDeterminism) {
  const Model model = MustParse(kKeras3Json);
  const std::vector<Tensor> a = model.InitialVariables(42);
  const std::vector<Tensor> b = model.InitialVariables(42);
  const std::vector<Tensor> c = model.InitialVariables(43);
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].BitwiseEqual(b[i])) << i;
  EXPECT_FALSE(a[0].BitwiseEqual(c[0]));
  // Keras' glorot_uniform: U(-limit, limit), limit = sqrt(6 / (fan_in + fan_out)).
  const float limit0 = std::sqrt(6.0f / (784 + 128));
  const float limit2 = std::sqrt(6.0f / (128 + 10));
  EXPECT_LE(a[0].Flat().abs().maxCoeff(), limit0);
  EXPECT_GT(a[0].Flat().abs().maxCoeff(), 0.99f * limit0);
  EXPECT_NEAR(a[0].Flat().mean(), 0.0f, 0.01f * limit0);
  // The variance of U(-l, l) is l^2 / 3.
  EXPECT_NEAR(a[0].Flat().square().mean(), limit0 * limit0 / 3, 0.02f * limit0 * limit0);
  EXPECT_LE(a[2].Flat().abs().maxCoeff(), limit2);
  EXPECT_GT(a[2].Flat().abs().maxCoeff(), 0.9f * limit2);
  EXPECT_EQ(a[1].Flat().abs().maxCoeff(), 0.0f);  // zeros
  EXPECT_EQ(a[3].Flat().abs().maxCoeff(), 0.0f);
}

// An input of 4 and Dense(3) with this kernel_initializer.
Model DenseWithKernelInitializer(const std::string& initializer) {
  return MustParse(WithLayer(
      R"({"class_name": "Dense", "config": {"name": "d", "units": 3, "kernel_initializer": )" +
      initializer + "}}"));
}

// As in Keras, an initializer's own integer seed gives the same values in every run, whatever
// seed the run draws the others from (fit.seed); a null seed draws from the run's.
TEST(ModelInitTest, AnInitializerSeedGivesTheSameValuesWhateverTheRunSeed) {
  const Model seeded =
      DenseWithKernelInitializer(R"({"class_name": "GlorotUniform", "config": {"seed": 7}})");
  const Tensor kernel = seeded.InitialVariables(1)[0];
  EXPECT_TRUE(kernel.BitwiseEqual(seeded.InitialVariables(2)[0]));
  EXPECT_GT(kernel.Flat().abs().maxCoeff(), 0.0f);
  EXPECT_LE(kernel.Flat().abs().maxCoeff(), std::sqrt(6.0f / (4 + 3)));  // still glorot_uniform
  // The Keras 3 form of the same initializer gives the same values; another seed others.
  EXPECT_TRUE(DenseWithKernelInitializer(
                  R"({"module": "keras.initializers", "class_name": "GlorotUniform",
                      "config": {"seed": 7}, "registered_name": null})")
                  .InitialVariables(5)[0]
                  .BitwiseEqual(kernel));
  EXPECT_FALSE(
      DenseWithKernelInitializer(R"({"class_name": "GlorotUniform", "config": {"seed": 8}})")
          .InitialVariables(1)[0]
          .BitwiseEqual(kernel));
  const Model he =
      DenseWithKernelInitializer(R"({"class_name": "HeUniform", "config": {"seed": 7}})");
  EXPECT_TRUE(he.InitialVariables(1)[0].BitwiseEqual(he.InitialVariables(2)[0]));
  // seed null draws from the run's seed, as a plain "glorot_uniform" does.
  const Model unseeded =
      DenseWithKernelInitializer(R"({"class_name": "GlorotUniform", "config": {"seed": null}})");
  EXPECT_FALSE(unseeded.InitialVariables(1)[0].BitwiseEqual(unseeded.InitialVariables(2)[0]));
  EXPECT_TRUE(unseeded.InitialVariables(1)[0].BitwiseEqual(
      DenseWithKernelInitializer(R"("glorot_uniform")").InitialVariables(1)[0]));
}

// A misspelt initializer option ("sead") is refused by name, as a layer's are, not ignored.
TEST(ModelJsonTest, RefusesUnknownInitializerConfigKeysByName) {
  auto refusal = [](const std::string& initializer) {
    return Refusal(WithLayer(
        R"({"class_name": "Dense", "config": {"name": "d", "units": 3, "kernel_initializer": )" +
        initializer + "}}"));
  };
  EXPECT_EQ(refusal(R"({"class_name": "GlorotUniform", "config": {"sead": 7, "scale": 3}})"),
            "model layer \"d\" (Dense) has kernel_initializer GlorotUniform with config keys "
            "\"scale\", \"sead\", which Keras' GlorotUniform does not have: check their spelling "
            "(GlorotUniform takes seed) or remove them");
  EXPECT_EQ(refusal(R"({"class_name": "Zeros", "config": {"seed": 7}})"),
            "model layer \"d\" (Dense) has kernel_initializer Zeros with config key \"seed\", "
            "which Keras' Zeros does not have: remove it (Zeros takes no options)");
  EXPECT_EQ(refusal(R"({"class_name": "HeUniform", "config": {"seed": "7"}})"),
            "model layer \"d\" (Dense) has kernel_initializer HeUniform with seed \"7\", which is "
            "not an integer: write an integer, or null to draw from the run's seed (fit.seed)");
  EXPECT_EQ(refusal(R"({"class_name": "LecunUniform", "config": [7]})"),
            "model layer \"d\" (Dense) has kernel_initializer LecunUniform with config [7], "
            "which is not an object: write it as {\"seed\": null}");
  EXPECT_THAT(refusal(R"({"class_name": "GlorotUniform", "config": {"seed": 1.5}})"),
              HasSubstr("with seed 1.5, which is not an integer"));
}

// A model with an input of 8, Dense(8, linear, ones kernel, no bias), Dropout(rate).
Model DropoutModel(double rate) {
  return MustParse(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 1000]}},
      {"class_name": "Dropout", "config": {"name": "dropout", "rate": )" +
                   std::to_string(rate) + R"(}}]}})");
}

TEST(ModelDropoutTest, InvertedDropoutInTrainingIdentityInInference) {
  const Model model = DropoutModel(0.25);
  EXPECT_TRUE(model.variables().empty());
  auto ws = model.NewWorkspace(1);
  Tensor x(DType::kFloat32, Shape({2, 1000}));
  x.Flat().setConstant(2.0f);
  auto predicted = model.Predict({}, x, *ws);
  ASSERT_TRUE(predicted.ok()) << predicted.status();
  EXPECT_TRUE(predicted->BitwiseEqual(x));  // inference: identity
  // Training: MSE against zero targets with scale 1/2 gives d/dx... the loss sums
  // mean(out^2) per example; out is 0 or 2 / (1 - 0.25).
  Tensor y(DType::kFloat32, Shape({2, 1000}));
  std::vector<Tensor> grads;
  auto stats = model.TrainStep({}, x, y, Loss::MeanSquaredError(), 1.0f, *ws, grads);
  ASSERT_TRUE(stats.ok()) << stats.status();
  const double kept = 2.0 / 0.75;
  // Each example: mean over 1000 of out^2 = fraction_kept * kept^2.
  const double fraction_kept = stats->loss_sum / 2 / (kept * kept);
  EXPECT_NEAR(fraction_kept, 0.75, 0.03);
  // Evaluate is inference: out == x, loss = 4 per example.
  auto eval = model.Evaluate({}, x, y, Loss::MeanSquaredError(), *ws);
  ASSERT_OK(eval);
  EXPECT_DOUBLE_EQ(eval->loss_sum, 8.0);
  // Masks differ from step to step, and between workspaces with different seeds.
  auto again = model.TrainStep({}, x, y, Loss::MeanSquaredError(), 1.0f, *ws, grads);
  EXPECT_NE(again->loss_sum, stats->loss_sum);
}

struct Batch {
  Tensor x, y;
};

Batch RandomBatch(int64_t batch, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Batch b{Tensor(DType::kFloat32, Shape({batch, 28, 28})), Tensor(DType::kInt32, Shape({batch}))};
  for (int64_t i = 0; i < b.x.num_elements(); ++i) b.x.data<float>()[i] = pixel(rng);
  for (int64_t i = 0; i < batch; ++i) b.y.data<int32_t>()[i] = static_cast<int32_t>(rng() % 10);
  return b;
}

TEST(ModelStepTest, LossScaleScalesGradientsNotTheLossSum) {
  const Model model = MustParse(kKeras2Json);
  const std::vector<Tensor> vars = model.InitialVariables(1);
  const Batch b = RandomBatch(16, 2);
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto ws = model.NewWorkspace(0);
  std::vector<Tensor> g_local, g_global;
  auto s1 = model.TrainStep(vars, b.x, b.y, loss, 1.0f / 16, *ws, g_local);
  auto s2 = model.TrainStep(vars, b.x, b.y, loss, 1.0f / 64, *ws, g_global);
  ASSERT_OK(s1);
  ASSERT_OK(s2);
  EXPECT_EQ(s1->loss_sum, s2->loss_sum);
  EXPECT_EQ(s1->examples, 16);
  EXPECT_GT(s1->loss_sum / 16, 1.5);  // about log(10) at initialization
  for (size_t i = 0; i < g_local.size(); ++i) {
    EXPECT_TRUE(g_local[i].Flat().isApprox(4.0f * g_global[i].Flat(), 1e-5f)) << i;
  }
  // Two replicas with half a batch each, scaled by the global batch, sum to the whole.
  std::vector<Tensor> g_a, g_b;
  ASSERT_TRUE(
      model.TrainStep(vars, b.x.SliceRows(0, 8), b.y.SliceRows(0, 8), loss, 1.0f / 16, *ws, g_a)
          .ok());
  ASSERT_TRUE(
      model.TrainStep(vars, b.x.SliceRows(8, 16), b.y.SliceRows(8, 16), loss, 1.0f / 16, *ws, g_b)
          .ok());
  for (size_t i = 0; i < g_local.size(); ++i) {
    EXPECT_TRUE((g_a[i].Flat() + g_b[i].Flat()).isApprox(g_local[i].Flat(), 1e-4f)) << i;
  }
}

TEST(ModelStepTest, EvaluateAndPredictAgree) {
  const Model model = MustParse(kKeras3Json);
  const std::vector<Tensor> vars = model.InitialVariables(1);
  const Batch b = RandomBatch(8, 3);
  auto ws = model.NewWorkspace(0);
  auto predicted = model.Predict(vars, b.x, *ws);
  ASSERT_OK(predicted);
  EXPECT_EQ(predicted->shape(), Shape({8, 10}));
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t i = 0; i < 8; ++i) {
    auto row = predicted->Matrix().row(i);
    EXPECT_NEAR(row.sum(), 1.0f, 1e-5f);
    loss_sum -= std::log(row(b.y.data<int32_t>()[i]));
    Eigen::Index arg;
    row.maxCoeff(&arg);
    correct += arg == b.y.data<int32_t>()[i];
  }
  auto stats = model.Evaluate(vars, b.x, b.y, Loss::SparseCategoricalCrossentropy(), *ws);
  ASSERT_OK(stats);
  EXPECT_NEAR(stats->loss_sum, loss_sum, 1e-4);
  EXPECT_EQ(stats->correct, correct);
  // Flattened inputs are accepted too.
  auto flat = model.Predict(vars, *b.x.Reshape(Shape({8, 784})), *ws);
  ASSERT_OK(flat);
  EXPECT_TRUE(flat->BitwiseEqual(*predicted));
}

TEST(ModelStepTest, TrainingReducesTheLoss) {
  const Model model = MustParse(kKeras3Json);
  std::vector<Tensor> vars = model.InitialVariables(7);
  auto adam = Optimizer::FromKeras("adam");
  ASSERT_OK(adam);
  const Batch b = RandomBatch(32, 4);
  auto ws = model.NewWorkspace(0);
  std::vector<Tensor> grads;
  std::vector<std::vector<Tensor>> slots;
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  double first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    auto stats = model.TrainStep(vars, b.x, b.y, loss, 1.0f / 32, *ws, grads);
    ASSERT_OK(stats);
    (*adam)->Apply(vars, grads, slots, step);
    if (step == 0) first = stats->loss_sum;
    last = stats->loss_sum;
  }
  EXPECT_LT(last, 0.2 * first);
}

TEST(ModelStepTest, ValidatesInputsWithClearErrors) {
  const Model model = MustParse(kKeras3Json);
  const std::vector<Tensor> vars = model.InitialVariables(1);
  const Batch b = RandomBatch(4, 5);
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto ws = model.NewWorkspace(0);
  std::vector<Tensor> grads;
  auto message = [](const absl::StatusOr<StepStats>& s) {
    return s.ok() ? std::string() : std::string(s.status().message());
  };
  EXPECT_EQ(message(model.TrainStep(vars, Tensor(DType::kFloat32, Shape({4, 28, 27})), b.y, loss, 1,
                                    *ws, grads)),
            "x is float32[4, 28, 27], but model \"sequential\" takes float32 inputs of shape "
            "[4, 28, 28] (batch first): convert or reshape the batch");
  EXPECT_EQ(message(model.TrainStep({vars[0], vars[1], vars[2]}, b.x, b.y, loss, 1, *ws, grads)),
            "variables has 3 tensors, but model \"sequential\" has 4 (dense/kernel, dense/bias, "
            "dense_1/kernel, dense_1/bias): pass the tensors of InitialVariables() or of a "
            "checkpoint, in that order");
  std::vector<Tensor> wrong = vars;
  wrong[2] = Tensor(DType::kFloat32, Shape({128, 9}));
  EXPECT_EQ(message(model.TrainStep(wrong, b.x, b.y, loss, 1, *ws, grads)),
            "variable 2 (\"dense_1/kernel\") is float32[128, 9], but the model expects "
            "float32[128, 10]: pass the model's variables in the order of Model::variables()");
  Tensor bad_labels = b.y.Clone();
  bad_labels.data<int32_t>()[2] = 12;
  EXPECT_EQ(message(model.TrainStep(vars, b.x, bad_labels, loss, 1, *ws, grads)),
            "y[2] is 12, outside the 10 classes of the model's output (0..9): check the labels, "
            "or the units of the model's last Dense layer");
  EXPECT_THAT(
      message(model.TrainStep(vars, b.x, Tensor(DType::kFloat32, Shape({4})), loss, 1, *ws, grads)),
      HasSubstr("takes integer class ids"));
  const Model other = MustParse(WithLayer(R"({"class_name": "Dense", "config": {"units": 2}})"));
  auto other_ws = other.NewWorkspace(0);
  EXPECT_THAT(message(model.TrainStep(vars, b.x, b.y, loss, 1, *other_ws, grads)),
              HasSubstr("the workspace was made for another model"));
}

TEST(ModelStepTest, WorkspaceGrowsOnlyWhenTheBatchGrows) {
  const Model model = MustParse(kKeras3Json);
  const std::vector<Tensor> vars = model.InitialVariables(1);
  auto ws = model.NewWorkspace(0);
  std::vector<Tensor> grads;
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  const Batch big = RandomBatch(64, 1), small = RandomBatch(10, 2);
  ASSERT_OK(model.TrainStep(vars, small.x, small.y, loss, 1, *ws, grads));
  EXPECT_EQ(ws->capacity(), 10);
  const void* grad_buffer = grads[0].raw_data();
  ASSERT_OK(model.TrainStep(vars, big.x, big.y, loss, 1, *ws, grads));
  ASSERT_OK(model.TrainStep(vars, small.x, small.y, loss, 1, *ws, grads));
  EXPECT_EQ(ws->capacity(), 64);
  EXPECT_EQ(grads[0].raw_data(), grad_buffer);  // gradients are reused, not reallocated
}

// Prints the throughput of the reference model (TrainStep + Adam ApplyDense, batch 64, one
// thread); asserts nothing about time.
TEST(ModelThroughputTest, ReferenceModelTrainStepPlusAdam) {
  const Model model = MustParse(kKeras3Json);
  std::vector<Tensor> vars = model.InitialVariables(1);
  auto adam = Optimizer::FromKeras("adam");
  ASSERT_OK(adam);
  std::vector<std::vector<Tensor>> slots;
  for (const Tensor& v : vars) slots.push_back((*adam)->NewSlots(v));
  const Batch b = RandomBatch(64, 9);
  const Loss loss = Loss::SparseCategoricalCrossentropy();
  auto ws = model.NewWorkspace(0);
  std::vector<Tensor> grads;
  auto step = [&](int64_t iteration) {
    auto stats = model.TrainStep(vars, b.x, b.y, loss, 1.0f / 64, *ws, grads);
    for (size_t i = 0; i < vars.size(); ++i) {
      (*adam)->ApplyDense(vars[i], grads[i], slots[i], iteration);
    }
    return stats.ok();
  };
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(step(i));
  constexpr int kSteps = 2000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSteps; ++i) step(50 + i);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "{\"name\": \"reference_model_train_step_adam\", \"examples_per_sec\": %.0f, "
      "\"steps_per_sec\": %.0f, \"batch\": 64, \"threads\": 1, \"goal_examples_per_sec\": "
      "52000}\n",
      kSteps * 64 / seconds, kSteps / seconds);
}

}  // namespace
}  // namespace stratum

namespace stratum {
namespace {

// A Dense layer "d" of 3 units on inputs of 4, with these regularizers (null: none).
std::string RegularizedJson(const json& kernel_regularizer, const json& bias_regularizer) {
  json dense = {{"name", "d"}, {"units", 3}, {"activation", "tanh"}};
  if (!kernel_regularizer.is_null()) dense["kernel_regularizer"] = kernel_regularizer;
  if (!bias_regularizer.is_null()) dense["bias_regularizer"] = bias_regularizer;
  return json{{"class_name", "Sequential"},
              {"config",
               {{"layers",
                 {{{"class_name", "InputLayer"}, {"config", {{"batch_input_shape", {nullptr, 4}}}}},
                  {{"class_name", "Dense"}, {"config", dense}}}}}}}
      .dump();
}

Model RegularizedModel(const json& kernel_regularizer, const json& bias_regularizer) {
  return MustParse(RegularizedJson(kernel_regularizer, bias_regularizer));
}

// Keras' forms of a regularizer, and what they add to the loss and the gradients: the full
// regularization loss once per example in the reported loss, and regularization_scale
// times its gradient (tf.distribute's scale_regularization_loss) in the gradients.
TEST(ModelRegularizerTest, AddsKerasRegularizationToLossAndGradients) {
  const Model plain = RegularizedModel(nullptr, nullptr);
  const Model regularized = RegularizedModel({{"module", "keras.regularizers"},
                                              {"class_name", "L2"},
                                              {"config", {{"l2", 0.1}}},
                                              {"registered_name", nullptr}},
                                             "l1");  // Keras' default factor, 0.01
  EXPECT_EQ(regularized.variables()[0].l2, 0.1);
  EXPECT_EQ(regularized.variables()[1].l1, 0.01);
  std::vector<Tensor> vars = plain.InitialVariables(3);
  for (int64_t i = 0; i < 3; ++i) vars[1].data<float>()[i] = i == 1 ? -0.5f : 0.25f;
  const Tensor x = Tensor::FromVector<float>(Shape({2, 4}), {1, 2, 3, 4, -1, 0, 1, 2});
  const Tensor y = Tensor::FromVector<float>(Shape({2, 3}), {0.1f, 0.2f, 0.3f, 0, 0, 1});
  const Loss loss = Loss::MeanSquaredError();
  auto ws_plain = plain.NewWorkspace(0);
  auto ws_reg = regularized.NewWorkspace(0);
  std::vector<Tensor> g_plain, g_reg;
  auto s_plain = plain.TrainStep(vars, x, y, loss, 0.5f, *ws_plain, g_plain, 0.25f);
  auto s_reg = regularized.TrainStep(vars, x, y, loss, 0.5f, *ws_reg, g_reg, 0.25f);
  ASSERT_OK(s_plain);
  ASSERT_OK(s_reg);
  const double reg = 0.1 * vars[0].Flat().square().sum() + 0.01 * vars[1].Flat().abs().sum();
  EXPECT_NEAR(regularized.RegularizationLoss(vars), reg, 1e-6);
  EXPECT_NEAR(s_reg->loss_sum - s_plain->loss_sum, 2 * reg, 1e-5);
  for (int64_t i = 0; i < vars[0].num_elements(); ++i) {
    EXPECT_NEAR(g_reg[0].data<float>()[i] - g_plain[0].data<float>()[i],
                0.25f * 2 * 0.1f * vars[0].data<float>()[i], 1e-6);
  }
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(g_reg[1].data<float>()[i] - g_plain[1].data<float>()[i],
                0.25f * 0.01f * (i == 1 ? -1 : 1), 1e-7);
  }
  auto e_plain = plain.Evaluate(vars, x, y, loss, *ws_plain);
  auto e_reg = regularized.Evaluate(vars, x, y, loss, *ws_reg);
  EXPECT_NEAR(e_reg->loss_sum - e_plain->loss_sum, 2 * reg, 1e-5);
  // A replica without examples still carries its share.
  std::vector<Tensor> g_empty;
  ASSERT_TRUE(regularized
                  .TrainStep(vars, Tensor(DType::kFloat32, Shape({0, 4})),
                             Tensor(DType::kFloat32, Shape({0, 3})), loss, 0.5f, *ws_reg, g_empty,
                             0.25f)
                  .ok());
  EXPECT_NEAR(g_empty[0].data<float>()[0], 0.25f * 2 * 0.1f * vars[0].data<float>()[0], 1e-7);
  // The GPU path has no kernel for it yet: such a model trains on the CPU, saying why.
  EXPECT_THAT(regularized.CheckRunsOnGpu().message(), HasSubstr("\"d/kernel\" has a regularizer"));

  const Model both = RegularizedModel({{"class_name", "L1L2"}, {"config", {{"l1", 0.2}}}}, "l1_l2");
  EXPECT_EQ(both.variables()[0].l1, 0.2);
  EXPECT_EQ(both.variables()[0].l2, 0.0);  // L1L2's own default
  EXPECT_EQ(both.variables()[1].l1, 0.01);
  EXPECT_EQ(both.variables()[1].l2, 0.01);

  // Conv2D's bias_regularizer counts as Dense's does.
  auto conv = Model::FromKerasJson(json{
      {"class_name", "Sequential"},
      {"config",
       {{"layers",
         {{{"class_name", "InputLayer"}, {"config", {{"batch_input_shape", {nullptr, 4, 4, 1}}}}},
          {{"class_name", "Conv2D"},
           {"config",
            {{"name", "c"}, {"filters", 2}, {"kernel_size", 3}, {"bias_regularizer", "l2"}}}},
          {{"class_name", "Flatten"}, {"config", json::object()}}}}}}});
  ASSERT_TRUE(conv.ok()) << conv.status();
  EXPECT_EQ(conv->variables()[1].l2, 0.01);
}

TEST(ModelRegularizerTest, RefusesOtherRegularizersByName) {
  auto refusal = [](const json& regularizer) {
    return Refusal(RegularizedJson(regularizer, nullptr));
  };

  EXPECT_EQ(refusal({{"class_name", "OrthogonalRegularizer"}, {"config", json::object()}}),
            "model layer \"d\" (Dense) has kernel_regularizer \"OrthogonalRegularizer\", which "
            "Stratum does not support: use L1, L2 or L1L2");
  EXPECT_THAT(refusal({{"class_name", "L2"}, {"config", {{"l1", 0.1}}}}),
              HasSubstr("with config key \"l1\", which Keras' L2 does not have"));
  EXPECT_THAT(refusal({{"class_name", "L2"}, {"config", {{"l2", -1}}}}),
              HasSubstr("use a non-negative number"));
}

}  // namespace
}  // namespace stratum

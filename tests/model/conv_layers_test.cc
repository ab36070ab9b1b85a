// The convolutional layers' values against Keras' definitions written out as plain loops:
// Conv2D (kernel layout [kh, kw, in, out], "same" padding with the extra row at the
// bottom, strides, dilation), the poolings (padding never counts) and ZeroPadding2D.
#include <cmath>
#include <random>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stratum/model/model.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using nlohmann::json;

Model Build(std::vector<int64_t> input, std::vector<json> layers) {
  json input_shape = json::array({nullptr});
  for (int64_t dim : input) input_shape.push_back(dim);
  json list = json::array(
      {{{"class_name", "InputLayer"}, {"config", {{"batch_input_shape", input_shape}}}}});
  for (json& layer : layers) list.push_back(std::move(layer));
  list.push_back({{"class_name", "Flatten"}, {"config", json::object()}});
  auto model = Model::FromKerasJson(
      json{{"class_name", "Sequential"}, {"config", {{"name", "m"}, {"layers", list}}}});
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

Tensor Random(Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor t(DType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

std::vector<float> Predict(const Model& model, const std::vector<Tensor>& variables,
                           const Tensor& x) {
  auto ws = model.NewWorkspace(0);
  auto out = model.Predict(variables, x, *ws);
  EXPECT_TRUE(out.ok()) << out.status();
  return std::vector<float>(out->data<float>(), out->data<float>() + out->num_elements());
}

// Keras' "same": out = ceil(in / stride), the padding split with the extra one after.
TEST(ConvLayersTest, Conv2DComputesKerasConvolution) {
  struct Case {
    int64_t h, w, c, filters, kh, kw, stride, dilation;
    bool same;
  };
  for (const Case& k : {Case{5, 6, 2, 3, 3, 2, 1, 1, false}, Case{6, 5, 2, 2, 3, 3, 2, 1, true},
                        Case{7, 7, 1, 2, 2, 3, 1, 2, true}, Case{4, 5, 3, 1, 2, 2, 3, 1, true}}) {
    SCOPED_TRACE(::testing::Message() << "case " << k.h << "x" << k.w << " stride " << k.stride);
    const Model model = Build({k.h, k.w, k.c}, {{{"class_name", "Conv2D"},
                                                 {"config",
                                                  {{"filters", k.filters},
                                                   {"kernel_size", {k.kh, k.kw}},
                                                   {"strides", k.stride},
                                                   {"dilation_rate", k.dilation},
                                                   {"padding", k.same ? "same" : "valid"}}}}});
    std::vector<Tensor> vars = {Random(Shape({k.kh, k.kw, k.c, k.filters}), 1),
                                Random(Shape({k.filters}), 2)};
    const int64_t batch = 2;
    const Tensor x = Random(Shape({batch, k.h, k.w, k.c}), 3);
    const int64_t eh = (k.kh - 1) * k.dilation + 1, ew = (k.kw - 1) * k.dilation + 1;
    const int64_t oh = k.same ? (k.h + k.stride - 1) / k.stride : (k.h - eh) / k.stride + 1;
    const int64_t ow = k.same ? (k.w + k.stride - 1) / k.stride : (k.w - ew) / k.stride + 1;
    const int64_t pt = k.same ? std::max<int64_t>((oh - 1) * k.stride + eh - k.h, 0) / 2 : 0;
    const int64_t pl = k.same ? std::max<int64_t>((ow - 1) * k.stride + ew - k.w, 0) / 2 : 0;
    std::vector<float> expected;
    const float* xv = x.data<float>();
    const float* kv = vars[0].data<float>();
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          for (int64_t f = 0; f < k.filters; ++f) {
            double sum = vars[1].data<float>()[f];
            for (int64_t a = 0; a < k.kh; ++a) {
              for (int64_t b = 0; b < k.kw; ++b) {
                const int64_t y = i * k.stride + a * k.dilation - pt;
                const int64_t z = j * k.stride + b * k.dilation - pl;
                if (y < 0 || y >= k.h || z < 0 || z >= k.w) continue;
                for (int64_t c = 0; c < k.c; ++c) {
                  sum += double(xv[((n * k.h + y) * k.w + z) * k.c + c]) *
                         kv[((a * k.kw + b) * k.c + c) * k.filters + f];
                }
              }
            }
            expected.push_back(static_cast<float>(sum));
          }
        }
      }
    }
    const std::vector<float> got = Predict(model, vars, x);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-4) << i;
  }
}

TEST(ConvLayersTest, PoolingsIgnoreThePadding) {
  // One 3x3 image, one channel: 1..9. A 2x2 window, stride 2, "same": windows {1,2,4,5},
  // {3,6}, {7,8}, {9}.
  const Tensor x = Tensor::FromVector<float>(Shape({1, 3, 3, 1}), {1, 2, 3, 4, 5, 6, 7, 8, 9});
  auto pool = [](const char* kind) {
    return json{{"class_name", kind},
                {"config", {{"pool_size", 2}, {"strides", 2}, {"padding", "same"}}}};
  };
  EXPECT_EQ(Predict(Build({3, 3, 1}, {pool("MaxPooling2D")}), {}, x),
            (std::vector<float>{5, 6, 8, 9}));
  EXPECT_EQ(Predict(Build({3, 3, 1}, {pool("AveragePooling2D")}), {}, x),
            (std::vector<float>{3, 4.5f, 7.5f, 9}));
  EXPECT_EQ(Predict(Build({3, 3, 1},
                          {{{"class_name", "GlobalAveragePooling2D"}, {"config", json::object()}}}),
                    {}, x),
            (std::vector<float>{5}));
  EXPECT_EQ(Predict(Build({3, 3, 1},
                          {{{"class_name", "GlobalMaxPooling2D"}, {"config", json::object()}}}),
                    {}, x),
            (std::vector<float>{9}));
}

// A window whose maximum is held twice sends its gradient to the first of them, in the
// window's order, as TensorFlow does: the 1x1 convolution's kernel gradient shows which
// input pixel got it.
TEST(ConvLayersTest, MaxPoolingRoutesATiedGradientToTheFirstMaximum) {
  const Model model =
      Build({1, 2, 2}, {{{"class_name", "Conv2D"},
                         {"config",
                          {{"filters", 1},
                           {"kernel_size", 1},
                           {"use_bias", false},
                           {"kernel_initializer", "ones"}}}},
                        {{"class_name", "MaxPooling2D"}, {"config", {{"pool_size", {1, 2}}}}}});
  // Pixels (1, 2) and (2, 1): both convolve to 3.
  const Tensor x = Tensor::FromVector<float>(Shape({1, 1, 2, 2}), {1, 2, 2, 1});
  const Tensor y = Tensor::FromVector<float>(Shape({1, 1}), {0});
  auto ws = model.NewWorkspace(0);
  std::vector<Tensor> grads;
  const std::vector<Tensor> vars = model.InitialVariables(1);
  ASSERT_OK(model.TrainStep(vars, x, y, Loss::MeanSquaredError(), 1.0f, *ws, grads));
  // d/d(out) = 2 * 3; the first pixel's (1, 2) times it.
  EXPECT_FLOAT_EQ(grads[0].data<float>()[0], 6.0f);
  EXPECT_FLOAT_EQ(grads[0].data<float>()[1], 12.0f);
}

TEST(ConvLayersTest, ZeroPaddingPutsZerosWhereKerasDoes) {
  const Tensor x = Tensor::FromVector<float>(Shape({1, 2, 2, 1}), {1, 2, 3, 4});
  const Model model = Build(
      {2, 2, 1}, {{{"class_name", "ZeroPadding2D"}, {"config", {{"padding", {{1, 0}, {0, 1}}}}}}});
  EXPECT_EQ(Predict(model, {}, x), (std::vector<float>{0, 0, 0, 1, 2, 0, 3, 4, 0}));
}

TEST(ConvLayersTest, RefusesWhatStratumDoesNotImplementByName) {
  auto refusal = [](json layer, std::vector<int64_t> input = {4, 4, 1}) {
    json input_shape = json::array({nullptr});
    for (int64_t dim : input) input_shape.push_back(dim);
    auto model = Model::FromKerasJson(
        json{{"class_name", "Sequential"},
             {"config",
              {{"layers",
                {{{"class_name", "InputLayer"}, {"config", {{"batch_input_shape", input_shape}}}},
                 layer}}}}});
    return model.ok() ? std::string() : std::string(model.status().message());
  };
  auto conv = [](json extra) {
    json config = {{"name", "c"}, {"filters", 2}, {"kernel_size", 3}};
    if (extra.is_object()) config.update(extra);
    return json{{"class_name", "Conv2D"}, {"config", config}};
  };
  EXPECT_THAT(refusal(conv({{"data_format", "channels_first"}})),
              ::testing::HasSubstr("model layer \"c\" (Conv2D) has data_format "
                                   "\"channels_first\", which Stratum does not support"));
  EXPECT_THAT(refusal(conv({{"groups", 2}})), ::testing::HasSubstr("has groups 2"));
  EXPECT_THAT(refusal(conv({{"padding", "causal"}})), ::testing::HasSubstr("has padding"));
  EXPECT_THAT(refusal(conv({{"kernel_size", 5}})),
              ::testing::HasSubstr("has a window of 5 x 5 on an input of 4 x 4"));
  EXPECT_THAT(refusal(conv({}), {16}),
              ::testing::HasSubstr("takes images of shape (None, height, width, channels)"));
  EXPECT_THAT(refusal(conv({{"kernel_constraint", {{"class_name", "NonNeg"}}}})),
              ::testing::HasSubstr("sets kernel_constraint"));
  EXPECT_THAT(refusal(json{{"class_name", "Reshape"},
                           {"config", {{"name", "r"}, {"target_shape", {5, -1}}}}}),
              ::testing::HasSubstr("model layer \"r\" (Reshape) has target_shape"));
}

}  // namespace
}  // namespace stratum

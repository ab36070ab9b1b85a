// Optimizer updates against Keras' formulas evaluated by hand (in double), defaults, and the
// refusal of options Stratum does not implement.
#include "stratum/model/optimizer.h"
#include "stratum/testing/status_matchers.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stratum {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Optimizer> Make(const json& spec) {
  auto optimizer = Optimizer::FromKeras(spec);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  return optimizer.ok() ? *std::move(optimizer) : nullptr;
}

std::string Refusal(const json& spec) {
  auto optimizer = Optimizer::FromKeras(spec);
  EXPECT_FALSE(optimizer.ok()) << spec.dump();
  return optimizer.ok() ? "" : std::string(optimizer.status().message());
}

const std::vector<double> kStart = {0.5, -1.25, 2.0, 0.0};
// Gradients of three steps.
const std::vector<std::vector<double>> kGrads = {
    {0.1, -0.2, 0.3, 0.0}, {-0.4, 0.05, 0.2, 1.0}, {0.3, 0.3, -0.1, -2.0}};

// Runs three ApplyDense steps and compares with `reference`, which updates one element
// (var, grad, state[], step) in double.
void ExpectMatches(const Optimizer& optimizer,
                   const std::function<void(double&, double, std::vector<double>&, int)>& reference,
                   int num_state, double initial_state = 0) {
  Tensor var = Tensor::FromVector<float>(Shape({4}), {0.5f, -1.25f, 2.0f, 0.0f});
  std::vector<Tensor> slots = optimizer.NewSlots(var);
  std::vector<double> expected = kStart;
  std::vector<std::vector<double>> state(4, std::vector<double>(num_state, initial_state));
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g(kGrads[step].begin(), kGrads[step].end());
    optimizer.ApplyDense(var, Tensor::FromVector<float>(Shape({4}), g), slots, step);
    for (int i = 0; i < 4; ++i) reference(expected[i], kGrads[step][i], state[i], step);
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(var.data<float>()[i], expected[i], 1e-5 + 1e-5 * std::abs(expected[i]))
          << optimizer.name() << " step " << step << " element " << i;
    }
  }
}

TEST(OptimizerTest, DefaultsFollowKeras) {
  auto adam = Make("adam");
  EXPECT_EQ(adam->name(), "Adam");
  EXPECT_FLOAT_EQ(adam->learning_rate(), 0.001f);
  EXPECT_FLOAT_EQ(adam->config()["beta_1"].get<float>(), 0.9f);
  EXPECT_FLOAT_EQ(adam->config()["beta_2"].get<float>(), 0.999f);
  EXPECT_FLOAT_EQ(adam->config()["epsilon"].get<float>(), 1e-7f);
  EXPECT_THAT(adam->SlotNames(), ElementsAre("m", "v"));
  auto sgd = Make("sgd");
  EXPECT_EQ(sgd->name(), "SGD");
  EXPECT_FLOAT_EQ(sgd->learning_rate(), 0.01f);
  EXPECT_TRUE(sgd->SlotNames().empty());
  auto adagrad = Make("Adagrad");
  EXPECT_FLOAT_EQ(adagrad->learning_rate(), 0.001f);
  EXPECT_FLOAT_EQ(adagrad->config()["initial_accumulator_value"].get<float>(), 0.1f);
  auto rmsprop = Make("rmsprop");
  EXPECT_EQ(rmsprop->name(), "RMSprop");
  EXPECT_FLOAT_EQ(rmsprop->config()["rho"].get<float>(), 0.9f);
  EXPECT_THAT(rmsprop->SlotNames(), ElementsAre("velocity"));
  EXPECT_THAT(
      Make(json{{"class_name", "RMSprop"}, {"config", {{"momentum", 0.5}, {"centered", true}}}})
          ->SlotNames(),
      ElementsAre("velocity", "momentum", "average_gradient"));
}

TEST(OptimizerTest, ParsesKeras3AndTfKerasConfigs) {
  const char* keras3 = R"({"module": "keras.optimizers", "class_name": "Adam", "config": {
      "name": "adam", "learning_rate": 0.0020000000949949026, "weight_decay": null,
      "clipnorm": null, "global_clipnorm": null, "clipvalue": null, "use_ema": false,
      "ema_momentum": 0.99, "ema_overwrite_frequency": null, "loss_scale_factor": null,
      "gradient_accumulation_steps": null, "beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-07,
      "amsgrad": false}, "registered_name": null})";
  auto adam = Make(json::parse(keras3));
  EXPECT_FLOAT_EQ(adam->learning_rate(), 0.002f);
  EXPECT_FLOAT_EQ(adam->config()["beta_1"].get<float>(), 0.8f);
  const char* tf_keras = R"({"class_name": "SGD", "config": {"name": "SGD",
      "weight_decay": null, "clipnorm": null, "global_clipnorm": null, "clipvalue": null,
      "use_ema": false, "ema_momentum": 0.99, "ema_overwrite_frequency": null,
      "jit_compile": true, "is_legacy_optimizer": false, "learning_rate": 0.05,
      "momentum": 0.9, "nesterov": true}})";
  auto sgd = Make(json::parse(tf_keras));
  EXPECT_FLOAT_EQ(sgd->learning_rate(), 0.05f);
  EXPECT_TRUE(sgd->config()["nesterov"].get<bool>());
  EXPECT_THAT(sgd->SlotNames(), ElementsAre("momentum"));
}

// Settings that make the first steps divide by zero are refused with the reason, as Keras
// refuses a beta outside [0, 1) (was: accepted, NaN at step 2, and advice to lower the
// learning rate).
TEST(OptimizerTest, DegenerateSettingsAreRefusedWithTheReason) {
  auto refusal = [](const char* spec) {
    auto optimizer = Optimizer::FromKeras(json::parse(spec));
    return optimizer.ok() ? std::string("accepted") : std::string(optimizer.status().message());
  };
  EXPECT_THAT(refusal(R"({"class_name": "Adam", "config": {"beta_1": 1}})"),
              HasSubstr("optimizer Adam has beta_1 1, outside [0, 1): beta_1 1 never lets the "
                        "moment move from 0"));
  EXPECT_THAT(refusal(R"({"class_name": "Adam", "config": {"beta_2": 1.0}})"),
              HasSubstr("beta_2 1.0, outside [0, 1)"));
  EXPECT_THAT(refusal(R"({"class_name": "Adam", "config": {"epsilon": 0}})"),
              HasSubstr("epsilon 0, outside (0, 1e+06]: epsilon 0 divides a zero gradient by "
                        "zero"));
  EXPECT_THAT(refusal(R"({"class_name": "RMSprop", "config": {"epsilon": 0}})"),
              HasSubstr("outside (0, 1e+06]"));
  EXPECT_THAT(refusal(R"({"class_name": "Adagrad", "config": {"epsilon": 0,
                          "initial_accumulator_value": 0}})"),
              HasSubstr("initial_accumulator_value 0 and epsilon 0"));
  // Either alone is fine, as in Keras.
  EXPECT_EQ(refusal(R"({"class_name": "Adagrad", "config": {"epsilon": 0}})"), "accepted");
  EXPECT_EQ(refusal(R"({"class_name": "Adam", "config": {"beta_1": 0, "beta_2": 0.5}})"),
            "accepted");
}

TEST(OptimizerTest, AdamMatchesKerasFormula) {
  auto adam = Make(json{{"class_name", "Adam"}, {"config", {{"learning_rate", 0.01}}}});
  ExpectMatches(
      *adam,
      [](double& var, double g, std::vector<double>& s, int step) {
        const double t = step + 1;
        s[0] += (g - s[0]) * (1 - 0.9);
        s[1] += (g * g - s[1]) * (1 - 0.999);
        const double alpha = 0.01 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
        var -= alpha * s[0] / (std::sqrt(s[1]) + 1e-7);
      },
      2);
}

TEST(OptimizerTest, SgdPlainMatchesKerasFormula) {
  auto sgd = Make(json{{"class_name", "SGD"}, {"config", {{"learning_rate", 0.1}}}});
  ExpectMatches(
      *sgd, [](double& var, double g, std::vector<double>&, int) { var -= 0.1 * g; }, 0);
}

TEST(OptimizerTest, SgdMomentumMatchesKerasFormula) {
  auto sgd =
      Make(json{{"class_name", "SGD"}, {"config", {{"learning_rate", 0.1}, {"momentum", 0.9}}}});
  ExpectMatches(
      *sgd,
      [](double& var, double g, std::vector<double>& s, int) {
        s[0] = 0.9 * s[0] - 0.1 * g;
        var += s[0];
      },
      1);
}

TEST(OptimizerTest, SgdNesterovMatchesKerasFormula) {
  auto sgd =
      Make(json{{"class_name", "SGD"},
                {"config", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"nesterov", true}}}});
  ExpectMatches(
      *sgd,
      [](double& var, double g, std::vector<double>& s, int) {
        s[0] = 0.9 * s[0] - 0.1 * g;
        var += 0.9 * s[0] - 0.1 * g;
      },
      1);
}

TEST(OptimizerTest, AdagradMatchesKeras3Formula) {
  auto adagrad = Make(json{{"class_name", "Adagrad"}, {"config", {{"learning_rate", 0.1}}}});
  ExpectMatches(
      *adagrad,
      [](double& var, double g, std::vector<double>& s, int) {
        s[0] += g * g;
        var -= 0.1 * g / std::sqrt(s[0] + 1e-7);
      },
      1, 0.1);
}

TEST(OptimizerTest, RmspropMatchesKeras3Formula) {
  auto rmsprop = Make(json{{"class_name", "RMSprop"}, {"config", {{"learning_rate", 0.01}}}});
  ExpectMatches(
      *rmsprop,
      [](double& var, double g, std::vector<double>& s, int) {
        s[0] = 0.9 * s[0] + 0.1 * g * g;
        var -= 0.01 * g / std::sqrt(s[0] + 1e-7);
      },
      1);
}

TEST(OptimizerTest, RmspropCenteredMomentumMatchesKeras3Formula) {
  auto rmsprop = Make(json{
      {"class_name", "RMSprop"},
      {"config", {{"learning_rate", 0.01}, {"momentum", 0.5}, {"centered", true}, {"rho", 0.8}}}});
  ExpectMatches(
      *rmsprop,
      [](double& var, double g, std::vector<double>& s, int) {
        // s: velocity, momentum, average_gradient
        s[0] = 0.8 * s[0] + 0.2 * g * g;
        s[2] = 0.8 * s[2] + 0.2 * g;
        const double increment = 0.01 * g / std::sqrt(s[0] - s[2] * s[2] + 1e-7);
        s[1] = 0.5 * s[1] + increment;
        var -= s[1];
      },
      3);
}

// The example in Keras' RMSprop docstring: var 10, loss var^2 / 2, one step: 9.683772.
TEST(OptimizerTest, RmspropDocstringExample) {
  auto rmsprop = Make(json{{"class_name", "RMSprop"}, {"config", {{"learning_rate", 0.1}}}});
  Tensor var = Tensor::FromVector<float>(Shape({1}), {10.0f});
  std::vector<Tensor> slots = rmsprop->NewSlots(var);
  rmsprop->ApplyDense(var, var.Clone(), slots, 0);
  EXPECT_NEAR(var.data<float>()[0], 9.683772f, 1e-5);
}

TEST(OptimizerTest, ApplyCreatesSlotsAndUpdatesEveryVariable) {
  auto adam = Make("adam");
  std::vector<Tensor> vars = {Tensor::FromVector<float>(Shape({2}), {1.0f, 2.0f}),
                              Tensor::FromVector<float>(Shape({1, 1}), {3.0f})};
  const std::vector<Tensor> grads = {Tensor::FromVector<float>(Shape({2}), {1.0f, -1.0f}),
                                     Tensor::FromVector<float>(Shape({1, 1}), {0.5f})};
  std::vector<std::vector<Tensor>> slots;
  adam->Apply(vars, grads, slots, 0);
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[1].size(), 2u);
  // Adam's first step moves every element by lr * sign(g) (up to epsilon).
  EXPECT_NEAR(vars[0].data<float>()[0], 0.999f, 1e-6);
  EXPECT_NEAR(vars[0].data<float>()[1], 2.001f, 1e-6);
  EXPECT_NEAR(vars[1].data<float>()[0], 2.999f, 1e-6);
}

// A table given by rows (its gradient for those rows alone) is updated exactly as Keras
// updates it with the whole, zero-elsewhere gradient, whatever the optimizer: by the rows
// alone where a zero gradient changes nothing (SGD, Adagrad), else densely (Adam's moments
// decay on every row, and every row with a moment moves).
TEST(OptimizerTest, ApplyByRowsMatchesTheDenseUpdate) {
  for (const char* name : {"sgd", "adagrad", "adam", "rmsprop", "adamw"}) {
    SCOPED_TRACE(name);
    auto optimizer = Optimizer::FromKeras(name);
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    std::vector<float> init;
    for (int i = 0; i < 12; ++i) init.push_back(0.1f * static_cast<float>(i));
    std::vector<Tensor> dense_vars = {Tensor::FromVector<float>({6, 2}, init)};
    std::vector<Tensor> row_vars = {dense_vars[0].Clone()};
    std::vector<std::vector<Tensor>> dense_slots, row_slots;
    const std::vector<std::vector<int64_t>> steps = {{1, 4}, {0, 4, 5}, {2}};
    for (size_t step = 0; step < steps.size(); ++step) {
      const std::vector<int64_t>& rows = steps[step];
      Tensor compact(DType::kFloat32, Shape({static_cast<int64_t>(rows.size()), 2}));
      Tensor whole(DType::kFloat32, Shape({6, 2}));
      whole.SetZero();
      for (size_t i = 0; i < rows.size(); ++i) {
        for (int k = 0; k < 2; ++k) {
          const float g = 0.3f * static_cast<float>(i + 1) - 0.2f * static_cast<float>(k);
          compact.data<float>()[i * 2 + k] = g;
          whole.data<float>()[rows[i] * 2 + k] = g;
        }
      }
      (*optimizer)->Apply(dense_vars, {whole}, dense_slots, static_cast<int64_t>(step));
      const std::vector<const std::vector<int64_t>*> selection = {&rows};
      (*optimizer)
          ->Apply(row_vars, {compact}, row_slots, static_cast<int64_t>(step), {}, selection);
    }
    EXPECT_TRUE(row_vars[0].BitwiseEqual(dense_vars[0]));
    for (size_t s = 0; s < dense_slots[0].size(); ++s) {
      EXPECT_TRUE(row_slots[0][s].BitwiseEqual(dense_slots[0][s])) << "slot " << s;
    }
  }
}

// Keras' decoupled weight decay (optimizer.py _apply_weight_decay): each update first scales
// the variable by 1 - weight_decay * learning_rate, then the rule runs on the (clipped)
// gradient. AdamW is Adam with weight_decay 0.004 by default; the config keeps it.
TEST(OptimizerTest, WeightDecayShrinksTheVariableBeforeTheUpdate) {
  auto adamw =
      Optimizer::FromKeras(json{{"class_name", "AdamW"}, {"config", {{"learning_rate", 0.1}}}});
  ASSERT_TRUE(adamw.ok()) << adamw.status();
  EXPECT_EQ((*adamw)->name(), "AdamW");
  EXPECT_FLOAT_EQ((*adamw)->weight_decay(), 0.004f);
  EXPECT_FALSE((*adamw)->ZeroGradientChangesNothing());
  auto adam =
      Optimizer::FromKeras(json{{"class_name", "Adam"}, {"config", {{"learning_rate", 0.1}}}});
  ASSERT_OK(adam);
  Tensor decayed = Tensor::FromVector<float>({2}, {1.0f, -2.0f});
  Tensor plain =
      Tensor::FromVector<float>({2}, {1.0f * (1 - 0.004f * 0.1f), -2.0f * (1 - 0.004f * 0.1f)});
  const Tensor gradient = Tensor::FromVector<float>({2}, {0.5f, 0.25f});
  std::vector<Tensor> slots = (*adamw)->NewSlots(decayed), plain_slots = (*adam)->NewSlots(plain);
  (*adamw)->ApplyDense(decayed, gradient, slots, 0);
  (*adam)->ApplyDense(plain, gradient, plain_slots, 0);
  EXPECT_TRUE(decayed.BitwiseEqual(plain));
  // The config round trip (a parameter server rebuilds the optimizer from it) keeps it.
  auto again =
      Optimizer::FromKeras(json{{"class_name", (*adamw)->name()}, {"config", (*adamw)->config()}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FLOAT_EQ((*again)->weight_decay(), 0.004f);
  // weight_decay on SGD: var * (1 - 0.5 * 0.1) - 0.1 * g.
  auto sgd = Optimizer::FromKeras(
      json{{"class_name", "SGD"}, {"config", {{"learning_rate", 0.1}, {"weight_decay", 0.5}}}});
  ASSERT_OK(sgd);
  Tensor w = Tensor::FromVector<float>({1}, {2.0f});
  std::vector<Tensor> none;
  (*sgd)->ApplyDense(w, Tensor::FromVector<float>({1}, {1.0f}), none, 0);
  EXPECT_FLOAT_EQ(w.data<float>()[0], 2.0f * 0.95f - 0.1f);
}

TEST(OptimizerTest, RefusesUnsupportedOptionsByName) {
  auto with = [](const char* name, json config) {
    return json{{"class_name", name}, {"config", std::move(config)}};
  };
  EXPECT_THAT(Refusal(with("Adam", {{"weight_decay", 2}})),
              HasSubstr("has weight_decay 2, outside [0, 1]"));
  EXPECT_THAT(Refusal(with("RMSprop", {{"use_ema", true}})), HasSubstr("use_ema"));
  EXPECT_THAT(Refusal(with("Adam", {{"loss_scale_factor", 128}})), HasSubstr("loss_scale_factor"));
  EXPECT_THAT(Refusal(with("Adam", {{"gradient_accumulation_steps", 4}})),
              HasSubstr("gradient_accumulation_steps"));
  EXPECT_EQ(Refusal(with("Adam", {{"amsgrad", true}})),
            "optimizer Adam sets amsgrad to true, which Stratum does not support: set amsgrad "
            "to false");
  EXPECT_THAT(Refusal(with("SGD", {{"decay", 0.01}})), HasSubstr("decay"));
  EXPECT_EQ(Refusal(with("Adam", {{"learning_rate",
                                   {{"module", "keras.optimizers.schedules"},
                                    {"class_name", "ExponentialDecay"},
                                    {"config", {{"initial_learning_rate", 0.1}}}}}})),
            "optimizer Adam's learning_rate (ExponentialDecay) has no decay_steps: Keras requires "
            "it; set it");
  EXPECT_EQ(
      Refusal(with("Adam",
                   {{"learning_rate", {{"class_name", "CyclicalLearningRate"}, {"config", {}}}}})),
      "optimizer Adam's learning_rate is the schedule \"CyclicalLearningRate\", which Stratum "
      "does not support: use ExponentialDecay, PiecewiseConstantDecay, InverseTimeDecay, "
      "PolynomialDecay, CosineDecay or CosineDecayRestarts");
  EXPECT_EQ(Refusal("nadam"),
            "optimizer \"nadam\" is not supported by Stratum: use SGD, Adam, AdamW, Adagrad or "
            "RMSprop");
  EXPECT_THAT(Refusal(with("SGD", {{"momentum", "high"}})),
              HasSubstr("optimizer SGD has momentum \"high\", which is not a number"));
  EXPECT_THAT(Refusal(with("SGD", {{"momentum", 1.5}})), HasSubstr("outside [0, 1]"));
  EXPECT_THAT(Refusal(with("RMSprop", {{"centered", 1}})), HasSubstr("not a boolean"));
  EXPECT_THAT(Refusal(42), HasSubstr("neither a name nor a Keras optimizer object"));
  // A misspelt key would train at the default: refused, naming the keys there are.
  EXPECT_EQ(Refusal(with("Adam", {{"learnin_rate", 0.1}})),
            "optimizer Adam has config key \"learnin_rate\", which Keras' Adam does not have: use "
            "learning_rate, amsgrad, beta_1, beta_2, epsilon (or remove learnin_rate)");
  EXPECT_THAT(Refusal(with("SGD", {{"beta_1", 0.9}})), HasSubstr("config key \"beta_1\""));
  // Harmless settings are accepted.
  EXPECT_NE(Make(with("Adam", {{"weight_decay", 0}, {"use_ema", false}, {"jit_compile", true}})),
            nullptr);
}

// Keras' schedule formulas, evaluated by hand at chosen steps.
TEST(LearningRateScheduleTest, FollowsKerasFormulas) {
  auto schedule = [](const char* name, json config) {
    absl::StatusOr<LearningRate> rate = LearningRate::FromKeras(
        {{"module", "keras.optimizers.schedules"}, {"class_name", name}, {"config", config}},
        "test");
    EXPECT_TRUE(rate.ok()) << rate.status();
    return *rate;
  };
  const LearningRate exponential = schedule(
      "ExponentialDecay",
      {{"initial_learning_rate", 0.1}, {"decay_steps", 10}, {"decay_rate", 0.5}, {"name", "e"}});
  EXPECT_FLOAT_EQ(exponential.At(0), 0.1f);
  EXPECT_FLOAT_EQ(exponential.At(10), 0.05f);
  EXPECT_FLOAT_EQ(exponential.At(15), 0.1f * std::pow(0.5f, 1.5f));  // 0.0353553
  const LearningRate stairs = schedule("ExponentialDecay", {{"initial_learning_rate", 0.1},
                                                            {"decay_steps", 10},
                                                            {"decay_rate", 0.5},
                                                            {"staircase", true}});
  EXPECT_FLOAT_EQ(stairs.At(15), 0.05f);
  const LearningRate piecewise =
      schedule("PiecewiseConstantDecay", {{"boundaries", {100, 200}}, {"values", {1.0, 0.5, 0.1}}});
  EXPECT_FLOAT_EQ(piecewise.At(100), 1.0f);  // values[0] up to and at the first boundary
  EXPECT_FLOAT_EQ(piecewise.At(101), 0.5f);
  EXPECT_FLOAT_EQ(piecewise.At(200), 0.5f);
  EXPECT_FLOAT_EQ(piecewise.At(201), 0.1f);
  const LearningRate inverse =
      schedule("InverseTimeDecay",
               {{"initial_learning_rate", 0.1}, {"decay_steps", 1}, {"decay_rate", 0.5}});
  EXPECT_FLOAT_EQ(inverse.At(2), 0.05f);  // 0.1 / (1 + 0.5 * 2)
  const LearningRate inverse_stairs = schedule("InverseTimeDecay", {{"initial_learning_rate", 0.1},
                                                                    {"decay_steps", 4},
                                                                    {"decay_rate", 0.5},
                                                                    {"staircase", true}});
  EXPECT_FLOAT_EQ(inverse_stairs.At(5), 0.1f / 1.5f);
  const json polynomial = {{"initial_learning_rate", 0.1},
                           {"decay_steps", 10},
                           {"end_learning_rate", 0.01},
                           {"power", 2}};
  EXPECT_FLOAT_EQ(schedule("PolynomialDecay", polynomial).At(5), 0.0325f);  // 0.09 * 0.25 + 0.01
  EXPECT_FLOAT_EQ(schedule("PolynomialDecay", polynomial).At(20), 0.01f);
  json cycling = polynomial;
  cycling["cycle"] = true;
  // Step 15 of a cycle of 20: 0.09 * (1 - 15 / 20)^2 + 0.01.
  EXPECT_FLOAT_EQ(schedule("PolynomialDecay", cycling).At(15), 0.015625f);
  const LearningRate cosine =
      schedule("CosineDecay", {{"initial_learning_rate", 0.1}, {"decay_steps", 100}});
  EXPECT_FLOAT_EQ(cosine.At(50), 0.05f);
  EXPECT_NEAR(cosine.At(100), 0.0f, 1e-9);
  EXPECT_NEAR(cosine.At(200), 0.0f, 1e-9);
  EXPECT_FLOAT_EQ(schedule("CosineDecay",
                           {{"initial_learning_rate", 0.1}, {"decay_steps", 100}, {"alpha", 0.1}})
                      .At(100),
                  0.01f);
  const LearningRate warmup = schedule("CosineDecay", {{"initial_learning_rate", 0.0},
                                                       {"decay_steps", 100},
                                                       {"warmup_target", 0.1},
                                                       {"warmup_steps", 10}});
  EXPECT_FLOAT_EQ(warmup.At(5), 0.05f);  // halfway up the linear warmup
  EXPECT_FLOAT_EQ(warmup.At(10), 0.1f);
  EXPECT_FLOAT_EQ(warmup.At(60), 0.05f);  // halfway down the cosine after it
  EXPECT_NEAR(warmup.At(500), 0.0f, 1e-9);
  const LearningRate restarts = schedule(
      "CosineDecayRestarts",
      {{"initial_learning_rate", 0.1}, {"first_decay_steps", 10}, {"t_mul", 2}, {"m_mul", 0.5}});
  EXPECT_FLOAT_EQ(restarts.At(0), 0.1f);
  EXPECT_FLOAT_EQ(restarts.At(5), 0.05f);
  EXPECT_FLOAT_EQ(restarts.At(10), 0.05f);   // the second period starts at m_mul
  EXPECT_FLOAT_EQ(restarts.At(20), 0.025f);  // halfway through the second period (20 steps)
  const LearningRate even =
      schedule("CosineDecayRestarts",
               {{"initial_learning_rate", 0.1}, {"first_decay_steps", 10}, {"t_mul", 1}});
  EXPECT_FLOAT_EQ(even.At(15), 0.05f);
}

// An optimizer steps its schedule by the update count, and serializes it in its config, so
// that a parameter server rebuilds the same schedule from it.
TEST(LearningRateScheduleTest, StepsByTheUpdateCountAndTravelsInTheConfig) {
  const json spec = {{"class_name", "SGD"},
                     {"config",
                      {{"learning_rate",
                        {{"class_name", "PiecewiseConstantDecay"},
                         {"config", {{"boundaries", {0}}, {"values", {1.0, 0.5}}}}}}}}};
  auto sgd = Make(spec);
  ASSERT_NE(sgd, nullptr);
  EXPECT_FLOAT_EQ(sgd->learning_rate(), 1.0f);
  EXPECT_FLOAT_EQ(sgd->learning_rate(1), 0.5f);
  Tensor var = Tensor::FromVector<float>(Shape({1}), {1.0f});
  std::vector<Tensor> slots = sgd->NewSlots(var);
  const Tensor grad = Tensor::FromVector<float>(Shape({1}), {1.0f});
  sgd->ApplyDense(var, grad, slots, 0);  // rate 1.0
  sgd->ApplyDense(var, grad, slots, 1);  // rate 0.5
  EXPECT_FLOAT_EQ(var.data<float>()[0], -0.5f);
  auto rebuilt = Make({{"class_name", "SGD"}, {"config", sgd->config()}});
  ASSERT_NE(rebuilt, nullptr);
  EXPECT_EQ(rebuilt->config(), sgd->config());
  EXPECT_FLOAT_EQ(rebuilt->learning_rate(7), 0.5f);
  EXPECT_EQ(sgd->learning_rate_schedule().name(), "PiecewiseConstantDecay");
  // Values Keras would refuse are refused by name.
  EXPECT_THAT(Refusal({{"class_name", "SGD"},
                       {"config",
                        {{"learning_rate",
                          {{"class_name", "PiecewiseConstantDecay"},
                           {"config", {{"boundaries", {1, 2}}, {"values", {1.0, 0.5}}}}}}}}}),
              HasSubstr("2 boundaries and 2 values: give one value more than boundaries"));
  EXPECT_THAT(Refusal({{"class_name", "Adam"},
                       {"config",
                        {{"learning_rate",
                          {{"class_name", "CosineDecay"},
                           {"config", {{"initial_learning_rate", 0.1}, {"decay_steps", 0}}}}}}}}),
              HasSubstr("decay_steps 0: use a positive number"));
  EXPECT_THAT(Refusal({{"class_name", "Adam"},
                       {"config",
                        {{"learning_rate",
                          {{"class_name", "ExponentialDecay"},
                           {"config",
                            {{"initial_learning_rate", 0.1},
                             {"decay_steps", 10},
                             {"decay_rate", 0.9},
                             {"stair_case", true}}}}}}}}),
              HasSubstr("config key \"stair_case\", which Keras' schedule does not have"));
}

// Keras' clipping on hand-computed gradients: clipnorm per variable, global_clipnorm over
// the trainable variables together, clipvalue after either; and what Keras refuses.
TEST(OptimizerClippingTest, ClipsAsKerasDoes) {
  auto sgd = [](json clip) {
    clip["learning_rate"] = 1.0;
    return Make({{"class_name", "SGD"}, {"config", clip}});
  };
  // One variable's gradient (3, 4): norm 5.
  auto step = [](const Optimizer& optimizer) {
    std::vector<Tensor> vars = {Tensor::FromVector<float>(Shape({2}), {0, 0})};
    std::vector<Tensor> grads = {Tensor::FromVector<float>(Shape({2}), {3, 4})};
    std::vector<std::vector<Tensor>> slots;
    optimizer.Apply(vars, grads, slots, 0);
    return std::vector<float>(vars[0].data<float>(), vars[0].data<float>() + 2);
  };
  EXPECT_THAT(step(*sgd({{"clipnorm", 1.0}})), ElementsAre(-0.6f, -0.8f));
  EXPECT_THAT(step(*sgd({{"clipnorm", 10.0}})), ElementsAre(-3.0f, -4.0f));  // under: unchanged
  EXPECT_THAT(step(*sgd({{"clipvalue", 3.5}})), ElementsAre(-3.0f, -3.5f));
  EXPECT_THAT(step(*sgd({{"clipnorm", 1.0}, {"clipvalue", 0.7}})), ElementsAre(-0.6f, -0.7f));
  // Two variables, gradients (3) and (4): global norm 5, each scaled by 2.5 / 5; a
  // non-trainable variable's change is neither counted nor scaled.
  auto global = sgd({{"global_clipnorm", 2.5}});
  std::vector<Tensor> vars = {Tensor::FromVector<float>(Shape({1}), {0}),
                              Tensor::FromVector<float>(Shape({1}), {0}),
                              Tensor::FromVector<float>(Shape({1}), {0})};
  std::vector<Tensor> grads = {Tensor::FromVector<float>(Shape({1}), {3}),
                               Tensor::FromVector<float>(Shape({1}), {4}),
                               Tensor::FromVector<float>(Shape({1}), {100})};
  std::vector<VariableSpec> specs(3);
  specs[2].trainable = false;
  std::vector<std::vector<Tensor>> slots;
  global->Apply(vars, grads, slots, 0, specs);
  EXPECT_FLOAT_EQ(vars[0].data<float>()[0], -1.5f);
  EXPECT_FLOAT_EQ(vars[1].data<float>()[0], -2.0f);
  EXPECT_FLOAT_EQ(vars[2].data<float>()[0], -100.0f);
  // The clipping travels in the config (a parameter server rebuilds the optimizer from it).
  auto adam = Make({{"class_name", "Adam"}, {"config", {{"clipnorm", 2.0}, {"clipvalue", 0.5}}}});
  EXPECT_EQ(adam->config()["clipnorm"], 2.0);
  EXPECT_EQ(adam->config()["clipvalue"], 0.5);
  EXPECT_FALSE(adam->config().contains("global_clipnorm"));
  EXPECT_EQ(Make({{"class_name", "Adam"}, {"config", adam->config()}})->clipping().norm, 2.0f);
  EXPECT_EQ(
      Refusal({{"class_name", "Adam"}, {"config", {{"clipnorm", 1.0}, {"global_clipnorm", 1.0}}}}),
      "optimizer Adam sets both clipnorm and global_clipnorm, which Keras refuses too: keep "
      "one");
  EXPECT_THAT(Refusal({{"class_name", "SGD"}, {"config", {{"clipvalue", -1.0}}}}),
              HasSubstr("clipvalue"));
  // null and 0 are off, as Keras writes them.
  EXPECT_EQ(Make({{"class_name", "SGD"}, {"config", {{"clipnorm", nullptr}, {"clipvalue", 0}}}})
                ->clipping()
                .value,
            0.0f);
}

}  // namespace
}  // namespace stratum

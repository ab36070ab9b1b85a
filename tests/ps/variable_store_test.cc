#include "stratum/ps/variable_store.h"

#include <cmath>
#include <limits>
#include <memory>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_replace.h"
#include "stratum/model/optimizer.h"
#include "stratum/ps/ps_client.h"
#include "stratum/ps/store_checkpoint.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/error_kind.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

const nlohmann::json kSgd =
    nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.5}})");

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(VariableStoreTest, CreateReadAssign) {
  VariableStore store;
  ASSERT_TRUE(*store.Create("w", Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4}), kSgd));
  auto value = store.Read("w");
  ASSERT_OK(value);
  EXPECT_TRUE(value->BitwiseEqual(Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4})));
  ASSERT_OK(store.Assign("w", Tensor::FromVector<float>({2, 2}, {5, 6, 7, 8})));
  auto rows = store.ReadRows("w", {1, 1, 0});
  ASSERT_OK(rows);
  EXPECT_TRUE(rows->BitwiseEqual(Tensor::FromVector<float>({3, 2}, {7, 8, 7, 8, 5, 6})));
  EXPECT_EQ(store.total_bytes(), 16);
}

// A PS that restarted between two calls answers a push of a variable it no longer has:
// for the caller that is a failure of the PS, which the coordinator recovers from.
// A PS updates its own variables one push at a time: clipnorm applies there, a
// global_clipnorm (which needs every gradient of a step) is refused with the fix.
TEST(VariableStoreTest, ClipsPerVariableAndRefusesAGlobalNorm) {
  VariableStore store;
  const nlohmann::json clipped = {{"class_name", "SGD"},
                                  {"config", {{"learning_rate", 1.0}, {"clipnorm", 1.0}}}};
  ASSERT_TRUE(*store.Create("w", Tensor::FromVector<float>({2}, {0, 0}), clipped));
  ASSERT_OK(store.ApplyGradient("w", Tensor::FromVector<float>({2}, {3, 4})));
  auto value = store.Read("w");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_FLOAT_EQ(value->data<float>()[0], -0.6f);
  EXPECT_FLOAT_EQ(value->data<float>()[1], -0.8f);
  const nlohmann::json global = {{"class_name", "SGD"}, {"config", {{"global_clipnorm", 1.0}}}};
  EXPECT_THAT(store.Create("v", Tensor::FromVector<float>({2}, {0, 0}), global).status().message(),
              HasSubstr("use clipnorm (per variable) or clipvalue in parameter-server "
                        "jobs"));
}

// ReduceLROnPlateau on a PS: the job's variables take the new rate from their next update
// (Adam's slots kept), the non-trainable variables' update (rate 1) is left alone, and the
// config a checkpoint saves says the new rate.
TEST(VariableStoreTest, ASetLearningRateAppliesToTheJobsVariablesFromTheirNextUpdate) {
  VariableStore store;
  ASSERT_TRUE(*store.Create("w", Tensor::FromVector<float>({1}, {0}), kSgd));
  ASSERT_TRUE(
      *store.Create("moving_mean", Tensor::FromVector<float>({1}, {0}), NonTrainableUpdateJson()));
  ASSERT_OK(store.ApplyGradient("w", Tensor::FromVector<float>({1}, {1})));
  absl::StatusOr<int> changed = store.SetLearningRate(0.125f);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(*changed, 1);
  ASSERT_OK(store.ApplyGradient("w", Tensor::FromVector<float>({1}, {1})));
  ASSERT_OK(store.ApplyGradient("moving_mean", Tensor::FromVector<float>({1}, {1})));
  EXPECT_FLOAT_EQ(store.Read("w")->data<float>()[0], -0.5f - 0.125f);
  EXPECT_FLOAT_EQ(store.Read("moving_mean")->data<float>()[0], -1.0f);  // still rate 1
  absl::StatusOr<VariableSnapshot> snapshot = store.Snapshot("w");
  ASSERT_OK(snapshot);
  EXPECT_FLOAT_EQ(snapshot->optimizer_config["config"]["learning_rate"].get<float>(), 0.125f);
  EXPECT_THAT(Message(store.SetLearningRate(-1).status()), HasSubstr("is not a positive number"));
  VariableStore scheduled;
  const nlohmann::json schedule = nlohmann::json::parse(R"({"class_name": "SGD", "config":
      {"learning_rate": {"class_name": "ExponentialDecay", "config":
      {"initial_learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5}}}})");
  ASSERT_TRUE(*scheduled.Create("w", Tensor::FromVector<float>({1}, {0}), schedule));
  EXPECT_THAT(Message(scheduled.SetLearningRate(0.01f).status()),
              HasSubstr("takes its learning rate from a schedule"));
}

TEST(VariableStoreTest, AMissingVariableIsAPsFailureForItsCaller) {
  VariableStore restarted;
  const absl::Status missing = restarted.Read("dense/kernel").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  const absl::Status failure = PsFailure(missing);
  EXPECT_EQ(failure.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(failure), HasSubstr("a parameter server is unavailable: "));
  EXPECT_THAT(Message(failure), HasSubstr(kPsLostItsVariables));
  // What it is, typed: the decisions read the kind, not these words.
  EXPECT_EQ(ErrorKindOf(missing), ErrorKind::kVariableMissing);
  EXPECT_EQ(ErrorKindOf(failure), ErrorKind::kPsLostItsVariables);
  EXPECT_EQ(ErrorKindOf(PsFailure(absl::UnavailableError("ps:0: gone"))),
            ErrorKind::kPsUnavailable);
  // The same words without the kind are not a lost variable.
  EXPECT_EQ(PsFailure(absl::NotFoundError("does not exist on this parameter server")).code(),
            absl::StatusCode::kNotFound);
  // Other errors are the caller's own.
  const absl::Status bad = absl::InvalidArgumentError("shape [3] does not match [2, 2]");
  EXPECT_EQ(PsFailure(bad), bad);
}

// Both of the PS's paths apply a push alike: all checked before the first is applied.
TEST(VariableStoreTest, APushOfSeveralGradientsIsAllOrNothing) {
  VariableStore store;
  ASSERT_TRUE(*store.Create("a", Tensor::FromVector<float>({1}, {1}), kSgd));
  ASSERT_TRUE(*store.Create("b", Tensor::FromVector<float>({1}, {1}), kSgd));
  const std::string a = "a", b = "b";
  const Tensor good = Tensor::FromVector<float>({1}, {1});
  const Tensor nan = Tensor::FromVector<float>({1}, {std::nanf("")});
  EXPECT_EQ(store.ApplyPush({{&a, &good, nullptr}, {&b, &nan, nullptr}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Info("a")->updates, 0);  // the good one was not applied either
  auto updates = store.ApplyPush({{&a, &good, nullptr}, {&b, &good, nullptr}});
  ASSERT_OK(updates);
  EXPECT_EQ(*updates, (std::vector<int64_t>{1, 1}));
  EXPECT_TRUE(store.Read("a")->BitwiseEqual(Tensor::FromVector<float>({1}, {0.5f})));
}

// A PS that shuts down (it got SIGTERM) cancels the calls it is serving: the caller sees
// CANCELLED, which is the PS going away, not the job's error (QA: a periodic save in flight
// as a SIGTERMed PS went failed the job with "ps:1 at ...: CANCELLED" instead of recovering).
TEST(VariableStoreTest, ACallThatAStoppingPsCancelledIsAPsFailure) {
  const absl::Status failure = PsFailure(absl::CancelledError("ps:1 at 127.0.0.1:1: Cancelled"));
  EXPECT_EQ(failure.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(failure), HasSubstr("a parameter server is unavailable: ps:1 at"));
}

TEST(VariableStoreTest, ReadIntoCopiesWhereTheCallerSays) {
  VariableStore store;
  ASSERT_TRUE(*store.Create("w", Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4}), kSgd));
  ASSERT_OK(store.ApplyGradient("w", Tensor::FromVector<float>({2, 2}, {2, 2, 2, 2})));
  std::vector<float> out(4);
  auto info = store.ReadInto("w", [&](const VariableInfo& info) -> void* {
    EXPECT_EQ(info.shape, Shape({2, 2}));
    return out.data();
  });
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->updates, 1);
  EXPECT_EQ(out, (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(store.ReadInto("w", [](const VariableInfo&) { return nullptr; }).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.ReadInto("nope", [&](const VariableInfo&) -> void* { return out.data(); })
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST(VariableStoreTest, NonFiniteValuesAreFoundAnywhereAndExtremeFiniteOnesPass) {
  VariableStore store;
  constexpr int64_t kElements = 1000003;  // not a multiple of any vector width
  ASSERT_TRUE(*store.Create("w", Tensor(DType::kFloat32, {kElements}), kSgd));
  Tensor gradient(DType::kFloat32, {kElements});
  gradient.data<float>()[0] = std::numeric_limits<float>::max();
  gradient.data<float>()[1] = -std::numeric_limits<float>::max();
  gradient.data<float>()[2] = std::numeric_limits<float>::denorm_min();
  gradient.data<float>()[3] = -0.0f;
  EXPECT_OK(store.CheckGradient("w", gradient, nullptr));
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::infinity()}) {
    for (int64_t at : {int64_t{0}, kElements / 2, kElements - 1}) {
      Tensor poisoned = gradient.Clone();
      poisoned.data<float>()[at] = bad;
      EXPECT_EQ(store.CheckGradient("w", poisoned, nullptr).code(),
                absl::StatusCode::kInvalidArgument)
          << bad << " at " << at;
    }
  }
  EXPECT_EQ(store.refused_non_finite(), 9);
}

TEST(VariableStoreTest, CreateIsIdempotentAndConflictsAreNamed) {
  VariableStore store;
  ASSERT_TRUE(*store.Create("w", Tensor(DType::kFloat32, {3}), kSgd));
  auto again = store.Create("w", Tensor(DType::kFloat32, {3}), kSgd);
  ASSERT_OK(again);
  EXPECT_FALSE(*again);
  auto conflict = store.Create("w", Tensor(DType::kFloat32, {4}), kSgd);
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Message(conflict.status()),
              HasSubstr("variable \"w\" exists as float32[3] with SGD, and cannot be created "
                        "again as float32[4] with SGD"));
  EXPECT_FALSE(store.Create("w", Tensor(DType::kFloat32, {3}), "adam").ok());
}

TEST(VariableStoreTest, ApplyGradientUsesTheOptimizerAndCounts) {
  VariableStore store;
  ASSERT_OK(store.Create("w", Tensor::FromVector<float>({2}, {1, 1}), kSgd));
  auto count = store.ApplyGradient("w", Tensor::FromVector<float>({2}, {1, -2}));
  ASSERT_OK(count);
  EXPECT_EQ(*count, 1);
  EXPECT_TRUE(store.Read("w")->BitwiseEqual(Tensor::FromVector<float>({2}, {0.5f, 2})));
  EXPECT_EQ(store.Info("w")->updates, 1);
}

TEST(VariableStoreTest, BadRequestsAreRefusedAndChangeNothing) {
  VariableStore store;
  const Tensor initial = Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4});
  ASSERT_OK(store.Create("w", initial, kSgd));
  EXPECT_EQ(store.Read("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(store.ApplyGradient("nope", initial).status()),
              HasSubstr("variable \"nope\" does not exist on this parameter server"));
  EXPECT_THAT(Message(store.ApplyGradient("w", Tensor(DType::kFloat32, {4})).status()),
              HasSubstr("gradient for variable \"w\" is float32[4] but the variable is "
                        "float32[2, 2]"));
  EXPECT_THAT(Message(store.Assign("w", Tensor(DType::kInt32, {2, 2}))),
              HasSubstr("value for variable \"w\" is int32[2, 2]"));
  Tensor nan =
      Tensor::FromVector<float>({2, 2}, {0, std::numeric_limits<float>::quiet_NaN(), 0, 0});
  EXPECT_THAT(Message(store.ApplyGradient("w", nan).status()),
              HasSubstr("contains NaN or Inf and was refused"));
  Tensor inf = Tensor::FromVector<float>({1, 2}, {std::numeric_limits<float>::infinity(), 0});
  EXPECT_FALSE(store.ApplyRowGradients("w", {0}, inf).ok());
  EXPECT_EQ(store.refused_non_finite(), 2);
  EXPECT_THAT(Message(store.ReadRows("w", {2}).status()),
              HasSubstr("row 2 of variable \"w\" is out of range"));
  EXPECT_FALSE(store.ApplyRowGradients("w", {5}, Tensor(DType::kFloat32, {1, 2})).ok());
  EXPECT_FALSE(store.ApplyRowGradients("w", {0, 1}, Tensor(DType::kFloat32, {1, 2})).ok());
  EXPECT_TRUE(store.Read("w")->BitwiseEqual(initial));
  EXPECT_EQ(store.Info("w")->updates, 0);
}

TEST(VariableStoreTest, RowGradientsSumDuplicatesAndTouchOnlyTheirRows) {
  VariableStore store;
  ASSERT_TRUE(
      store.Create("emb", Tensor::FromVector<float>({3, 2}, {1, 1, 1, 1, 1, 1}), kSgd).ok());
  ASSERT_TRUE(store
                  .ApplyRowGradients("emb", {2, 0, 2},
                                     Tensor::FromVector<float>({3, 2}, {1, 0, 2, 2, 1, 0}))
                  .ok());
  // Row 2 gets (1,0)+(1,0) = (2,0) -> 1 - 0.5*2 = 0; row 0 gets (2,2) -> 0; row 1 untouched.
  EXPECT_TRUE(
      store.Read("emb")->BitwiseEqual(Tensor::FromVector<float>({3, 2}, {0, 0, 1, 1, 0, 1})));
}

// TensorFlow's sparse kernels: an update by rows changes those rows and the same rows of the
// slots, and leaves every other row's moments as they were (they do not decay).
TEST(VariableStoreTest, RowGradientsUpdateTheirRowsAndSlotsAsADenseUpdateOfThoseRows) {
  const nlohmann::json adam = {{"class_name", "Adam"}, {"config", {{"learning_rate", 0.1}}}};
  VariableStore store;
  const Tensor initial = Tensor::FromVector<float>({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  ASSERT_OK(store.Create("emb", initial, adam));
  ASSERT_TRUE(
      store.ApplyRowGradients("emb", {1, 3}, Tensor::FromVector<float>({2, 2}, {1, -1, 2, 0.5f}))
          .ok());
  ASSERT_OK(store.ApplyRowGradients("emb", {3}, Tensor::FromVector<float>({1, 2}, {-1, 1})));

  // The same two updates, dense, on rows 1 and 3 alone.
  auto optimizer = Optimizer::FromKeras(adam);
  ASSERT_OK(optimizer);
  Tensor row1 = Tensor::FromVector<float>({1, 2}, {3, 4});
  Tensor row3 = Tensor::FromVector<float>({1, 2}, {7, 8});
  std::vector<Tensor> slots1 = (*optimizer)->NewSlots(row1);
  std::vector<Tensor> slots3 = (*optimizer)->NewSlots(row3);
  (*optimizer)->ApplyDense(row1, Tensor::FromVector<float>({1, 2}, {1, -1}), slots1, 0);
  (*optimizer)->ApplyDense(row3, Tensor::FromVector<float>({1, 2}, {2, 0.5f}), slots3, 0);
  (*optimizer)->ApplyDense(row3, Tensor::FromVector<float>({1, 2}, {-1, 1}), slots3, 1);
  auto snapshot = store.Snapshot("emb");
  ASSERT_OK(snapshot);
  const float* value = snapshot->value.data<float>();
  EXPECT_EQ(value[0], 1);
  EXPECT_EQ(value[1], 2);
  EXPECT_EQ(value[2], row1.data<float>()[0]);
  EXPECT_EQ(value[3], row1.data<float>()[1]);
  EXPECT_EQ(value[4], 5);
  EXPECT_EQ(value[6], row3.data<float>()[0]);
  EXPECT_EQ(value[7], row3.data<float>()[1]);
  ASSERT_EQ(snapshot->slots.size(), 2u);
  const float* m = snapshot->slots[0].data<float>();
  EXPECT_EQ(m[0], 0);  // row 0 never touched
  EXPECT_EQ(m[2], slots1[0].data<float>()[0]);
  EXPECT_EQ(m[6], slots3[0].data<float>()[0]);
  EXPECT_EQ(snapshot->info.updates, 2);
}

// clipnorm clips the rows of one push together (the norm of all their values), as Keras clips
// the IndexedSlices of an embedding table, not each row on its own.
TEST(VariableStoreTest, RowGradientsAreClippedTogether) {
  const nlohmann::json sgd = {{"class_name", "SGD"},
                              {"config", {{"learning_rate", 1.0}, {"clipnorm", 1.0}}}};
  VariableStore store;
  ASSERT_OK(store.Create("emb", Tensor(DType::kFloat32, {3, 1}), sgd));
  // Rows 0 and 2 get 3 and 4 (norm 5, scaled by 1/5); row 0 twice (1 + 2), in any order.
  ASSERT_TRUE(
      store.ApplyRowGradients("emb", {2, 0, 0}, Tensor::FromVector<float>({3, 1}, {4, 1, 2})).ok());
  const Tensor value = *store.Read("emb");
  EXPECT_FLOAT_EQ(value.data<float>()[0], -0.6f);
  EXPECT_FLOAT_EQ(value.data<float>()[1], 0.0f);
  EXPECT_FLOAT_EQ(value.data<float>()[2], -0.8f);
}

// weight_decay travels in the optimizer's config: the PS shrinks a variable before each
// update, and a table updated by rows in those rows alone.
TEST(VariableStoreTest, WeightDecayShrinksWhatAnUpdateTouches) {
  const nlohmann::json sgd = {{"class_name", "SGD"},
                              {"config", {{"learning_rate", 0.1}, {"weight_decay", 0.5}}}};
  VariableStore store;
  ASSERT_OK(store.Create("w", Tensor::FromVector<float>({2}, {2, 4}), sgd));
  ASSERT_OK(store.ApplyGradient("w", Tensor::FromVector<float>({2}, {1, 0})));
  const Tensor w = *store.Read("w");
  EXPECT_FLOAT_EQ(w.data<float>()[0], 2 * 0.95f - 0.1f);
  EXPECT_FLOAT_EQ(w.data<float>()[1], 4 * 0.95f);
  ASSERT_OK(store.Create("emb", Tensor::FromVector<float>({2, 1}, {2, 4}), sgd));
  ASSERT_OK(store.ApplyRowGradients("emb", {1}, Tensor::FromVector<float>({1, 1}, {1})));
  const Tensor emb = *store.Read("emb");
  EXPECT_FLOAT_EQ(emb.data<float>()[0], 2);
  EXPECT_FLOAT_EQ(emb.data<float>()[1], 4 * 0.95f - 0.1f);
}

TEST(VariableStoreTest, AScalarHasNoRows) {
  VariableStore store;
  ASSERT_OK(store.Create("s", Tensor::Scalar(1), "sgd"));
  EXPECT_THAT(std::string(store.ReadRows("s", {0}).status().message()),
              HasSubstr("is a scalar, which has no rows"));
  EXPECT_THAT(std::string(store.ApplyRowGradients("s", {0}, Tensor::FromVector<float>({1}, {1}))
                              .status()
                              .message()),
              HasSubstr("a scalar, which has no rows"));
}

TEST(VariableStoreTest, WithoutAnOptimizerGradientsAreRefused) {
  VariableStore store;
  ASSERT_OK(store.Create("step", Tensor::Scalar(0), nullptr));
  EXPECT_EQ(store.ApplyGradient("step", Tensor::Scalar(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_OK(store.Assign("step", Tensor::Scalar(7)));
}

TEST(VariableStoreTest, SnapshotAndRestoreKeepSlotsAndCounts) {
  VariableStore store;
  ASSERT_OK(store.Create("w", Tensor::FromVector<float>({2}, {1, 2}), "adam"));
  for (int i = 0; i < 3; ++i)
    ASSERT_OK(store.ApplyGradient("w", Tensor::FromVector<float>({2}, {0.1f, -0.2f})));
  auto snapshot = store.Snapshot("w");
  ASSERT_OK(snapshot);
  EXPECT_EQ(snapshot->slot_names, (std::vector<std::string>{"m", "v"}));
  VariableStore other;
  ASSERT_OK(other.Restore(*snapshot));
  ASSERT_OK(store.ApplyGradient("w", Tensor::FromVector<float>({2}, {0.3f, 0.3f})));
  ASSERT_OK(other.ApplyGradient("w", Tensor::FromVector<float>({2}, {0.3f, 0.3f})));
  EXPECT_TRUE(other.Read("w")->BitwiseEqual(*store.Read("w")));
  EXPECT_EQ(other.Info("w")->updates, 4);
}

// A job resumed from its checkpoint trains on with the job's optimizer (a lower learning
// rate after a divergence, say) and the checkpoint's slots; another optimizer is refused.
TEST(VariableStoreTest, RestoreKeepsTheJobsOptimizerAndRefusesAnotherKind) {
  VariableStore trained;
  ASSERT_OK(trained.Create("w", Tensor::FromVector<float>({2}, {1, 2}), kSgd));
  ASSERT_OK(trained.ApplyGradient("w", Tensor::FromVector<float>({2}, {1, 1})));
  auto snapshot = trained.Snapshot("w");
  ASSERT_OK(snapshot);
  // The job now has a learning rate of 0: the restored variable must not move.
  VariableStore resumed;
  const nlohmann::json still =
      nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.0}})");
  ASSERT_OK(resumed.Create("w", Tensor::FromVector<float>({2}, {0, 0}), still));
  ASSERT_OK(resumed.Restore(*snapshot));
  ASSERT_OK(resumed.ApplyGradient("w", Tensor::FromVector<float>({2}, {1, 1})));
  EXPECT_TRUE(resumed.Read("w")->BitwiseEqual(Tensor::FromVector<float>({2}, {0.5f, 1.5f})));
  EXPECT_EQ(resumed.Info("w")->updates, 2);
  // Another kind of optimizer has other slots: refused, naming both.
  VariableStore other;
  ASSERT_OK(other.Create("w", Tensor::FromVector<float>({2}, {0, 0}), "adam"));
  const absl::Status refused = other.Restore(*snapshot);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Message(refused),
            "the checkpoint's variable \"w\" was trained with optimizer SGD, but the job uses "
            "Adam: use the job's earlier optimizer, or another checkpoint.dir to train from "
            "scratch");
  // SGD with momentum needs a slot that plain SGD's checkpoint lacks.
  VariableStore momentum;
  ASSERT_TRUE(momentum
                  .Create("w", Tensor::FromVector<float>({2}, {0, 0}),
                          nlohmann::json::parse(R"({"class_name": "SGD", "config": )"
                                                R"({"learning_rate": 0.5, "momentum": 0.9}})"))
                  .ok());
  EXPECT_THAT(Message(momentum.Restore(*snapshot)),
              HasSubstr("has 0 optimizer slots, but the job's optimizer needs 1"));
}

// Every PS refuses gradients that are not finite, so a checkpoint file that holds NaN or
// infinity is damaged: it is refused, naming the variable, before anything is restored
// (the coordinator then falls back to the checkpoint before it).
TEST(VariableStoreTest, ACheckpointFileWithValuesThatAreNotFiniteRestoresNothing) {
  VariableStore trained;
  ASSERT_OK(trained.Create("a", Tensor::FromVector<float>({2}, {1, 2}), "adam"));
  ASSERT_OK(trained.Create("b", Tensor::FromVector<float>({2}, {3, 4}), "adam"));
  ASSERT_OK(trained.ApplyGradient("a", Tensor::FromVector<float>({2}, {1, 1})));
  const std::string path = ::testing::TempDir() + "/finite_check.safetensors";
  ASSERT_OK(SaveStore(trained, path).status());
  for (const std::string& damaged : {std::string("b"), std::string("a/slot_v")}) {
    absl::StatusOr<TensorFile> saved = ReadSafetensors(path);
    ASSERT_TRUE(saved.ok()) << saved.status();
    TensorFile& file = *saved;
    for (auto& [name, tensor] : file.tensors) {
      if (name == damaged) tensor.data<float>()[1] = std::numeric_limits<float>::infinity();
    }
    const std::string damaged_path = path + ".damaged";
    ASSERT_OK(WriteSafetensors(damaged_path, file).status());
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader =
        SafetensorsReader::Open(damaged_path);
    ASSERT_OK(reader.status());
    VariableStore resumed;
    ASSERT_OK(resumed.Create("a", Tensor::FromVector<float>({2}, {0, 0}), "adam"));
    const absl::StatusOr<int> refused = RestoreStore(resumed, **reader);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << damaged;
    EXPECT_THAT(Message(refused.status()),
                HasSubstr("the checkpoint's \"" + damaged + "\" holds NaN or infinity"));
    EXPECT_TRUE(resumed.Read("a")->BitwiseEqual(Tensor::FromVector<float>({2}, {0, 0})));
    EXPECT_FALSE(resumed.Read("b").ok());
  }
}

TEST(VariableStoreTest, ConcurrentPushesAreAllApplied) {
  VariableStore store;
  ASSERT_OK(store.Create("a", Tensor(DType::kFloat32, {64}), kSgd));
  ASSERT_OK(store.Create("b", Tensor(DType::kFloat32, {64}), kSgd));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store, t] {
      Tensor gradient(DType::kFloat32, {64});
      gradient.Flat().setConstant(-1);
      for (int i = 0; i < 250; ++i) ASSERT_OK(store.ApplyGradient(t % 2 ? "a" : "b", gradient));
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(store.Info("a")->updates, 500);
  EXPECT_EQ(store.Read("b")->data<float>()[63], 250.0f);  // 500 x 0.5
}

// A shard of another layout is put together from the rows of saved shards in two files,
// its slots with it; rows that leave a gap, or name a tensor a file lacks, are refused
// before anything is restored.
TEST(StoreCheckpointTest, AShardIsRestoredFromRowsOfSavedShardsAndTheirSlots) {
  auto shard_file = [](const std::string& name, std::vector<float> values, int64_t updates) {
    TensorFile file;
    file.tensors.push_back({name, Tensor::FromVector<float>({2, 1}, values)});
    for (float& value : values) value *= 10;
    file.tensors.push_back({name + "/slot_momentum", Tensor::FromVector<float>({2, 1}, values)});
    file.metadata[name + ".updates"] = std::to_string(updates);
    file.metadata[name + ".optimizer"] =
        R"({"class_name": "SGD", "config": {"learning_rate": 0.1, "momentum": 0.9}})";
    const std::string path = ::testing::TempDir() + "/" + absl::StrReplaceAll(name, {{"/", "_"}});
    EXPECT_OK(WriteSafetensors(path, file).status());
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader = SafetensorsReader::Open(path);
    EXPECT_OK(reader.status());
    return *std::move(reader);
  };
  const std::unique_ptr<SafetensorsReader> part_0 = shard_file("w/part_0", {1, 2}, 7);
  const std::unique_ptr<SafetensorsReader> part_1 = shard_file("w/part_1", {3, 4}, 7);
  const std::vector<const SafetensorsReader*> files = {part_0.get(), part_1.get()};
  const nlohmann::json momentum = nlohmann::json::parse(
      R"({"class_name": "SGD", "config": {"learning_rate": 0.1, "momentum": 0.9}})");
  VariableStore store;
  ASSERT_OK(store.Create("w", Tensor(DType::kFloat32, {4, 1}), momentum).status());
  absl::StatusOr<int> restored =
      RestoreStore(store, files,
                   {{.file = 1, .saved = "w/part_1", .num_rows = 2, .shard = "w", .to_row = 2},
                    {.file = 0, .saved = "w/part_0", .num_rows = 2, .shard = "w"}});
  ASSERT_OK(restored.status());
  EXPECT_EQ(*restored, 1);
  absl::StatusOr<VariableSnapshot> joined = store.Snapshot("w");
  ASSERT_OK(joined.status());
  EXPECT_TRUE(joined->value.BitwiseEqual(Tensor::FromVector<float>({4, 1}, {1, 2, 3, 4})));
  ASSERT_EQ(joined->slots.size(), 1u);
  EXPECT_TRUE(joined->slots[0].BitwiseEqual(Tensor::FromVector<float>({4, 1}, {10, 20, 30, 40})));
  EXPECT_EQ(joined->info.updates, 7);

  VariableStore untouched;
  ASSERT_OK(untouched.Create("w", Tensor(DType::kFloat32, {4, 1}), momentum).status());
  const absl::StatusOr<int> gap =
      RestoreStore(untouched, files,
                   {{.file = 0, .saved = "w/part_0", .num_rows = 1, .shard = "w"},
                    {.file = 1, .saved = "w/part_1", .num_rows = 1, .shard = "w", .to_row = 2}});
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(gap.status()), HasSubstr("do not cover it once each"));
  const absl::StatusOr<int> missing = RestoreStore(
      untouched, files, {{.file = 0, .saved = "w/part_1", .num_rows = 2, .shard = "w"}});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Message(missing.status()),
              HasSubstr(part_0->path() + " has no \"w/part_1\" to restore shard \"w\""));
  const absl::StatusOr<int> beyond = RestoreStore(
      untouched, files,
      {{.file = 0, .saved = "w/part_0", .num_rows = 2, .shard = "w"},
       {.file = 1, .saved = "w/part_1", .first_row = 1, .num_rows = 2, .shard = "w", .to_row = 2}});
  EXPECT_THAT(Message(beyond.status()), HasSubstr("which has no rows [1, 3)"));
  EXPECT_TRUE(untouched.Read("w")->BitwiseEqual(Tensor(DType::kFloat32, {4, 1})));
}

// Hardening case 10: a finite gradient that an optimizer turns into NaN or Inf (here SGD
// at the highest learning rate Keras allows, 1e6, and a gradient of 1e33) is refused saying so, and
// so is every later push, until finite values are assigned; a row update is checked on the rows it
// changed.
TEST(VariableStoreTest, AnUpdateThatMakesTheValueNonFiniteIsRefusedSayingWhy) {
  VariableStore store;
  const nlohmann::json diverging =
      nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 1e6}})");
  ASSERT_OK(store.Create("w", Tensor::FromVector<float>({2}, {1, 1}), diverging).status());
  const absl::StatusOr<int64_t> first =
      store.ApplyGradient("w", Tensor::FromVector<float>({2}, {1e33f, 0}));
  EXPECT_THAT(first.status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                HasSubstr("variable \"w\" became NaN or Inf at its update 1, "
                                          "from a finite gradient: its optimizer (SGD")));
  EXPECT_THAT(std::string(first.status().message()), HasSubstr("lower the learning rate"));
  const absl::StatusOr<int64_t> next =
      store.ApplyGradient("w", Tensor::FromVector<float>({2}, {0, 0}));
  EXPECT_THAT(next.status(), testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                               HasSubstr("became NaN or Inf at its update 1")));
  EXPECT_EQ(store.Info("w")->updates, 1);
  ASSERT_OK(store.Assign("w", Tensor::FromVector<float>({2}, {1, 1})));
  EXPECT_OK(store.ApplyGradient("w", Tensor::FromVector<float>({2}, {0, 0})).status());

  ASSERT_OK(store.Create("table", Tensor::FromVector<float>({3, 2}, {1, 1, 1, 1, 1, 1}), diverging)
                .status());
  EXPECT_OK(
      store.ApplyRowGradients("table", {0}, Tensor::FromVector<float>({1, 2}, {0, 0})).status());
  EXPECT_THAT(
      store.ApplyRowGradients("table", {2}, Tensor::FromVector<float>({1, 2}, {0, 1e33f})).status(),
      testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                        HasSubstr("variable \"table\" became NaN or Inf")));
  // Assigned in pieces of rows, it trains again once the piece with the bad row is replaced.
  const std::vector<int64_t> first_rows = {0, 1}, last_row = {2};
  ASSERT_OK(store.Assign("table", Tensor::FromVector<float>({2, 2}, {1, 1, 1, 1}), &first_rows));
  EXPECT_FALSE(
      store.ApplyRowGradients("table", {0}, Tensor::FromVector<float>({1, 2}, {0, 0})).ok());
  ASSERT_OK(store.Assign("table", Tensor::FromVector<float>({1, 2}, {1, 1}), &last_row));
  EXPECT_OK(
      store.ApplyRowGradients("table", {0}, Tensor::FromVector<float>({1, 2}, {0, 0})).status());
}

// Rows of a variable are assigned in place, the others kept; rows outside the variable, or
// values that are not one row each, change nothing and say what to send.
TEST(VariableStoreTest, AssignsRowsInPlace) {
  VariableStore store;
  ASSERT_TRUE(*store.Create("t", Tensor::FromVector<float>({3, 2}, {1, 2, 3, 4, 5, 6}), kSgd));
  const std::vector<int64_t> rows = {2, 0}, outside = {3}, one = {1};
  ASSERT_OK(store.Assign("t", Tensor::FromVector<float>({2, 2}, {9, 8, 7, 6}), &rows));
  EXPECT_TRUE(store.Read("t")->BitwiseEqual(Tensor::FromVector<float>({3, 2}, {7, 6, 3, 4, 9, 8})));
  EXPECT_THAT(Message(store.Assign("t", Tensor::FromVector<float>({1, 2}, {0, 0}), &outside)),
              HasSubstr("row 3 of variable \"t\" is out of range: it has rows 0..2"));
  EXPECT_THAT(Message(store.Assign("t", Tensor::FromVector<float>({2, 2}, {0, 0, 0, 0}), &one)),
              HasSubstr("row values for variable \"t\" are float32[2, 2] for 1 rows: send "
                        "float32[1, 2]"));
  EXPECT_TRUE(store.Read("t")->BitwiseEqual(Tensor::FromVector<float>({3, 2}, {7, 6, 3, 4, 9, 8})));
}

}  // namespace
}  // namespace stratum

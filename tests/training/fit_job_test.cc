// CheckTrainingJob: what the coordinator and MultiWorkerMirrored workers refuse in a job
// before they wait for their peers, and stratum-train before it trains: here, a loss that
// does not fit the model's output and data files whose shapes do not fit the model and loss.
#include "stratum/training/fit_job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../data/idx_writer.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::testing::HasSubstr;

// A 28x28 input, Dense(10, <activation>).
nlohmann::json ModelJson(const std::string& activation) {
  return nlohmann::json::parse(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 28, 28]}},
      {"class_name": "Flatten", "config": {"name": "flatten"}},
      {"class_name": "Dense", "config": {"name": "out", "units": 10, "activation": ")" +
                               activation + R"("}}]}})");
}

nlohmann::json LossJson(const std::string& class_name, bool from_logits) {
  return {{"class_name", class_name}, {"config", {{"from_logits", from_logits}}}};
}

class CheckTrainingJobTest : public ::testing::Test {
 protected:
  CheckTrainingJobTest() {
    images_ = dir_.Write("images-idx3-ubyte",
                         testing::UbyteIdx({6, 28, 28}, std::vector<uint8_t>(6 * 28 * 28)));
    labels_ = dir_.Write("labels-idx1-ubyte", testing::UbyteIdx({6}, {0, 1, 2, 3, 4, 5}));
    job_.model = ModelJson("softmax");
    job_.loss = "sparse_categorical_crossentropy";
    job_.optimizer = "adam";
    job_.data.train = {"idx", images_, labels_};
    job_.data.test = {"idx", images_, labels_};
  }

  std::string Refusal() const {
    const absl::Status status = CheckTrainingJob(job_);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    return std::string(status.message());
  }

  testing::TempDir dir_;
  std::string images_;
  std::string labels_;
  JobSpec job_;
};

TEST_F(CheckTrainingJobTest, AValidJobPasses) {
  EXPECT_TRUE(CheckTrainingJob(job_).ok()) << CheckTrainingJob(job_);
}

// Keras warns and treats a softmax's probabilities as logits; Stratum used to fuse the
// softmax anyway, so from_logits true trained as false without a word. Either way the job
// is not what its author meant: it is refused with the two fixes.
TEST_F(CheckTrainingJobTest, FromLogitsOnASoftmaxOutputIsRefusedWithTheFix) {
  job_.loss = LossJson("SparseCategoricalCrossentropy", true);
  EXPECT_EQ(Refusal(),
            "loss sparse_categorical_crossentropy has from_logits true, but the model's output "
            "(layer \"out\") is a softmax, so it gives probabilities, not logits: set "
            "from_logits to false, or make the last layer's activation linear");
  job_.loss = LossJson("CategoricalCrossentropy", true);
  EXPECT_THAT(Refusal(), HasSubstr("loss categorical_crossentropy has from_logits true, but"));
  // from_logits false on a softmax, and true on a linear output, are what Keras means.
  job_.loss = LossJson("SparseCategoricalCrossentropy", false);
  EXPECT_OK(CheckTrainingJob(job_));
  job_.model = ModelJson("linear");
  job_.loss = LossJson("SparseCategoricalCrossentropy", true);
  EXPECT_TRUE(CheckTrainingJob(job_).ok()) << CheckTrainingJob(job_);
}

// Keras' AUC is measured for binary classifiers; asked of a 10-class softmax model it is
// refused with the fix, before training.
TEST_F(CheckTrainingJobTest, AucIsRefusedForAModelThatIsNoBinaryClassifier) {
  job_.metrics = {"accuracy", "auc"};
  EXPECT_EQ(Refusal(),
            "compile.metrics asks for \"auc\", which Stratum measures as Keras' AUC of a model of "
            "one output trained with binary_crossentropy, but this model has 10 outputs and the "
            "loss is sparse_categorical_crossentropy: leave \"auc\" out, or train a binary "
            "classifier (Dense(1, activation=\"sigmoid\"), binary_crossentropy)");
}

// A labels field pointing at an images file has as many rows as the images: it used to
// pass the header check and fail only when that data set was first used (for data.test,
// after a whole epoch).
TEST_F(CheckTrainingJobTest, ALabelsFileOfTheWrongRankIsRefusedNamingTheField) {
  job_.data.test.labels = images_;
  EXPECT_EQ(Refusal(), "data.test.labels " + images_ +
                           " is uint8[6, 28, 28], but sparse_categorical_crossentropy takes one "
                           "class id per example, a file of shape [6]: point data.test.labels at "
                           "the labels of data.test.images (an idx1 file, such as "
                           "t10k-labels-idx1-ubyte.gz)");
  job_.data.test.labels = labels_;
  job_.data.train.labels = images_;
  EXPECT_THAT(Refusal(), HasSubstr("data.train.labels " + images_ + " is uint8[6, 28, 28]"));
}

TEST_F(CheckTrainingJobTest, AnImagesFileThatDoesNotFitTheModelIsRefusedNamingTheField) {
  job_.data.test.images = labels_;
  job_.data.test.labels = labels_;
  EXPECT_EQ(Refusal(), "data.test.images " + labels_ +
                           " is uint8[6], 1 value per example, but the model takes [28, 28] (784 "
                           "values) per example: point data.test.images at the images file, or "
                           "change the model's input shape");
}

// A damaged dimension count makes an images file read as another shape: the error says the
// file is corrupt (its data does not match its header), not that it is the wrong file (QA).
TEST_F(CheckTrainingJobTest, ACorruptHeaderIsReportedAsCorruptNotAsAnotherShape) {
  job_.data.train.images =
      dir_.Write("two-dims", testing::IdxBytes(0x08, {6, 28}, std::string(6 * 28 * 28, '\0')));
  EXPECT_THAT(Refusal(), HasSubstr("IDX file \"" + job_.data.train.images +
                                   "\" is corrupt: its header declares shape [6, 28]"));
}

// A test set of no examples is refused: its figures would read 0 as if measured (QA: the
// run ended with "test accuracy 0.0000", and the summary said 0).
TEST_F(CheckTrainingJobTest, AnEmptyTestSetIsRefusedNamingTheField) {
  job_.data.test.images = dir_.Write("empty-images", testing::UbyteIdx({0, 28, 28}, {}));
  job_.data.test.labels = dir_.Write("empty-labels", testing::UbyteIdx({0}, {}));
  EXPECT_EQ(Refusal(), "data.test.images " + job_.data.test.images +
                           " holds no examples, so the model could not be tested on it: point "
                           "data.test at a test set with examples, or remove data.test");
}

// Categorical cross-entropy takes one float32 row per example (one-hot labels).
TEST_F(CheckTrainingJobTest, TargetsAreCheckedAgainstTheLoss) {
  job_.loss = "categorical_crossentropy";
  EXPECT_THAT(Refusal(), HasSubstr("data.train.labels " + labels_ +
                                   " is uint8[6], but categorical_crossentropy takes float32 "
                                   "targets of shape [6, 10]"));
  const std::string one_hot = dir_.Write(
      "one-hot", testing::IdxBytes(0x0D, {6, 10}, std::string(6 * 10 * sizeof(float), '\0')));
  job_.data.train.labels = one_hot;
  job_.data.test.labels = one_hot;
  EXPECT_TRUE(CheckTrainingJob(job_).ok()) << CheckTrainingJob(job_);
}

// A class id the model has no output for is named with its file and example when the data
// is loaded (QA: it was found mid-training as "y[51] is 10", a place in a shuffled batch).
TEST_F(CheckTrainingJobTest, AClassIdOutsideTheModelsOutputsIsNamedWhenLoaded) {
  job_.data.test.labels = dir_.Write("eleven-classes", testing::UbyteIdx({6}, {0, 1, 2, 3, 10, 5}));
  const absl::StatusOr<FitData> data = LoadFitData(job_.data, *Model::FromKerasJson(job_.model));
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(data.status().message(),
            "data.test.labels " + job_.data.test.labels +
                ": example 4 has class id 10, outside the model's 10 classes (0..9): give labels "
                "from 0 to 9, or give the model's last Dense layer at least 11 units");
  job_.data.test.labels = labels_;
  EXPECT_OK(LoadFitData(job_.data, *Model::FromKerasJson(job_.model)));
}

// A model of one output takes 0/1 labels (binary_crossentropy); another label is named.
TEST_F(CheckTrainingJobTest, AModelOfOneOutputTakesBinaryLabels) {
  nlohmann::json model = ModelJson("sigmoid");
  model["config"]["layers"][2]["config"]["units"] = 1;
  job_.data.test.labels = dir_.Write("binary", testing::UbyteIdx({6}, {0, 1, 1, 0, 1, 0}));
  job_.data.train.labels = job_.data.test.labels;
  EXPECT_OK(LoadFitData(job_.data, *Model::FromKerasJson(model)));
  job_.data.test.labels = dir_.Write("ternary", testing::UbyteIdx({6}, {0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(LoadFitData(job_.data, *Model::FromKerasJson(model)).status().message(),
            "data.test.labels " + job_.data.test.labels +
                ": example 2 has label 2, but the model has one output, which takes labels 0 and "
                "1 (binary_crossentropy): give such labels, or give the model's last Dense layer "
                "one unit per class and a categorical loss");
}

// A model whose input takes ids (an int InputLayer, as before an Embedding) looks them up as
// they are: uint8 data keeps its values (not 1/255 of them), and a rescale is refused.
TEST_F(CheckTrainingJobTest, IdsAreTakenUnscaledAndAnotherRescaleIsRefused) {
  const Model ids = *Model::FromKerasJson(nlohmann::json::parse(R"({"class_name": "Sequential",
      "config": {"layers": [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 28, 28],
                                                "dtype": "int32"}},
        {"class_name": "Embedding", "config": {"name": "e", "input_dim": 256, "output_dim": 2}},
        {"class_name": "Flatten", "config": {"name": "flatten"}},
        {"class_name": "Dense", "config": {"name": "out", "units": 10}}]}})"));
  absl::StatusOr<FitData> data = LoadFitData(job_.data, ids);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->rescale, 1);
  EXPECT_NEAR(LoadFitData(job_.data, *Model::FromKerasJson(job_.model))->rescale, 1.0 / 255, 1e-12);
  job_.data.rescale = 1.0 / 255;
  EXPECT_EQ(LoadFitData(job_.data, ids).status().message(),
            "data.rescale is 0.00392157, but the model's input takes ids (an Embedding reads it, "
            "or its InputLayer has dtype int32 or int64), which are not rescaled: remove "
            "data.rescale, or set it to 1");
  job_.data.rescale = 1;
  EXPECT_OK(LoadFitData(job_.data, ids));
}

}  // namespace
}  // namespace stratum

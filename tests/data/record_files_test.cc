// The file sources (TFRecord of tf.Example, CSV) as datasets: order across files and
// interleaving, parallel reads, counts, FILE sharding, errors and ignore_errors, globs.
#include "stratum/data/record_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "idx_writer.h"
#include "stratum/data/convert.h"
#include "stratum/data/csv.h"
#include "stratum/data/input_context.h"
#include "stratum/testing/status_matchers.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

using ::stratum::testing::StatusIs;
using ::stratum::testing::TempDir;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::vector<FeatureSpec> LabelledValue() {
  return *ParseFeatureSpecs({{"x", {{"dtype", "float32"}, {"shape", {2}}}},
                             {"y", {{"dtype", "int64"}, {"shape", json::array()}}}},
                            "features");
}

// `files` TFRecord files holding examples 0..n-1 in contiguous ranges: x = [i, -i], y = i.
std::vector<std::string> WriteShards(const TempDir& dir, int n, int files,
                                     Compression compression = Compression::kNone) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int i = 0; i < n; ++i) {
    x.push_back(static_cast<float>(i));
    x.push_back(static_cast<float>(-i));
    y.push_back(i);
  }
  ConvertOptions options;
  options.out_prefix = dir.path() + "/part";
  options.shards = files;
  options.compression = compression;
  options.input_key = "x";
  options.label_key = "y";
  absl::StatusOr<std::vector<std::string>> written =
      WriteTFRecordShards(Dataset::FromTensorSlices({Tensor::FromVector<float>({n, 2}, x),
                                                     Tensor::FromVector<int64_t>({n}, y)}),
                          n, options);
  EXPECT_TRUE(written.ok()) << written.status();
  return written.ok() ? *written : std::vector<std::string>{};
}

// The labels of a dataset of (x, y) examples, in order; checks x against y.
std::vector<int64_t> Labels(const Dataset& dataset, absl::Status* error = nullptr) {
  std::vector<int64_t> labels;
  auto iterator = dataset.MakeIterator();
  while (true) {
    absl::StatusOr<std::optional<Element>> next = iterator->GetNext();
    if (!next.ok()) {
      if (error != nullptr) *error = next.status();
      return labels;
    }
    if (!*next) return labels;
    const int64_t y = *(**next)[1].data<int64_t>();
    EXPECT_EQ((**next)[0].data<float>()[1], static_cast<float>(-y));
    labels.push_back(y);
  }
}

TEST(RecordFilesTest, ReadsFilesInOrderAndCountsThem) {
  TempDir dir;
  for (Compression compression : {Compression::kNone, Compression::kGzip, Compression::kZlib}) {
    const std::vector<std::string> files = WriteShards(dir, 10, 3, compression);
    const auto format = TFRecordExamples(compression, LabelledValue());
    absl::StatusOr<std::vector<int64_t>> counts = CountRecords(files, *format);
    ASSERT_TRUE(counts.ok()) << counts.status();
    EXPECT_THAT(*counts, ElementsAre(3, 3, 4));
    const Dataset dataset = RecordFilesDataset(files, format, {.record_counts = *counts});
    EXPECT_EQ(*dataset.Cardinality(), 10);
    EXPECT_THAT(Labels(dataset), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
    EXPECT_EQ(dataset.DebugString().find("TFRecord"), 0u) << dataset.DebugString();
  }
}

TEST(RecordFilesTest, InterleavesAsTfDataDoesWithOrWithoutThreads) {
  TempDir dir;
  // Files hold 0-2, 3-5, 6-8, 9-11, 12-15 (16 over 5).
  const std::vector<std::string> files = WriteShards(dir, 16, 5);
  const auto format = TFRecordExamples(Compression::kNone, LabelledValue());
  // cycle 2, block 2: a slot whose file ends passes the turn on; an empty slot opens the
  // next file at once (tf.data's interleave order).
  const std::vector<int64_t> expected = {0, 1, 3, 4, 2, 5, 6, 7, 9, 10, 8, 11, 12, 13, 14, 15};
  ReadOptions sequential{.cycle_length = 2, .block_length = 2};
  EXPECT_THAT(Labels(RecordFilesDataset(files, format, sequential)), ElementsAreArray(expected));
  ReadOptions threaded = sequential;
  threaded.num_parallel_reads = 2;
  threaded.read_ahead = 1;
  for (int epoch = 0; epoch < 3; ++epoch) {
    EXPECT_THAT(Labels(RecordFilesDataset(files, format, threaded)), ElementsAreArray(expected));
  }
  threaded.deterministic = false;
  std::vector<int64_t> any = Labels(RecordFilesDataset(files, format, threaded));
  std::sort(any.begin(), any.end());
  EXPECT_EQ(any.size(), 16u);
  EXPECT_TRUE(std::adjacent_find(any.begin(), any.end()) == any.end());
  // num_parallel_reads alone interleaves that many files, one example each (TFRecordDataset).
  EXPECT_THAT(Labels(RecordFilesDataset(files, format, {.num_parallel_reads = 5})),
              ElementsAre(0, 3, 6, 9, 12, 1, 4, 7, 10, 13, 2, 5, 8, 11, 14, 15));
}

TEST(RecordFilesTest, FileShardingGivesEachWorkerItsFilesAndTheirCount) {
  TempDir dir;
  const std::vector<std::string> files = WriteShards(dir, 16, 5);
  const auto format = TFRecordExamples(Compression::kNone, LabelledValue());
  const Dataset dataset =
      RecordFilesDataset(files, format, {.record_counts = *CountRecords(files, *format)});
  absl::StatusOr<Dataset> worker1 = AutoShard(dataset, AutoShardPolicy::kAuto, 2, 1);
  ASSERT_OK(worker1);
  EXPECT_THAT(worker1->source_files(), ElementsAre(files[1], files[3]));
  EXPECT_EQ(*worker1->Cardinality(), 6);
  EXPECT_THAT(Labels(*worker1), ElementsAre(3, 4, 5, 9, 10, 11));
  absl::StatusOr<Dataset> worker0 = AutoShard(dataset, AutoShardPolicy::kFile, 2, 0);
  EXPECT_EQ(*worker0->Cardinality(), 10);  // files 0, 2, 4: uneven, and counted exactly
  EXPECT_THAT(
      AutoShard(dataset, AutoShardPolicy::kFile, 6, 0).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("reads 5 file units (TFRecord(5 files)) but there are 6 workers")));
}

TEST(RecordFilesTest, ErrorsNameTheFileAndOffsetAndIgnoreErrorsSkipsTheRestOfThatFile) {
  TempDir dir;
  const std::vector<std::string> files = WriteShards(dir, 6, 2);
  {
    // Damage the second record of the first file.
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    std::string first(64, '\0');
    f.read(first.data(), 64);
    const uint64_t length = *reinterpret_cast<const uint64_t*>(first.data());
    f.seekp(static_cast<std::streamoff>(16 + length + 12 + 3));
    f.put('\x55');
  }
  const auto format = TFRecordExamples(Compression::kNone, LabelledValue());
  absl::Status error;
  EXPECT_THAT(Labels(RecordFilesDataset(files, format), &error), ElementsAre(0));
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kDataLoss,
                              AllOf(HasSubstr(files[0]), HasSubstr("the record at byte offset "),
                                    HasSubstr("CRC32C does not match"))));
  EXPECT_THAT(Labels(RecordFilesDataset(files, format, {.ignore_errors = true})),
              ElementsAre(0, 3, 4, 5));
  // Counted as an iterator with ignore_errors reads them.
  EXPECT_THAT(*CountRecords(files, *format, 2, /*ignore_errors=*/true), ElementsAre(1, 3));
  EXPECT_THAT(CountRecords(files, *format).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(files[0])));
  // A spec that does not fit the examples: the file, the record and the feature.
  const auto wrong = TFRecordExamples(
      Compression::kNone,
      *ParseFeatureSpecs({{"x", {{"dtype", "float32"}, {"shape", {3}}}}}, "features"));
  absl::StatusOr<std::optional<Element>> first =
      RecordFilesDataset({files[1]}, wrong).MakeIterator()->GetNext();
  EXPECT_THAT(first.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(files[1] + ": the record at byte offset 0: feature \"x\" "
                                                  "has 2 values"))));
}

TEST(RecordFilesTest, ResolvesGlobsInSortedOrderAndRefusesRemotePaths) {
  TempDir dir;
  for (const char* name : {"b-1", "a-2", "a-1", "c"}) dir.Write(name, "");
  absl::StatusOr<std::vector<std::string>> files =
      ResolveDataFiles({"a-*", "c"}, dir.path(), "data.train.files");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(*files, ElementsAre(dir.path() + "/a-1", dir.path() + "/a-2", dir.path() + "/c"));
  EXPECT_THAT(
      ResolveDataFiles({"z-*"}, dir.path(), "data.train.files").status(),
      StatusIs(absl::StatusCode::kNotFound,
               HasSubstr("data.train.files pattern " + dir.path() + "/z-* matches no file")));
  EXPECT_THAT(ResolveDataFiles({"gs://bucket/train-*"}, "", "data.train.files").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a remote path: Stratum reads local and mounted files only")));
  EXPECT_THAT(ResolveDataFiles({dir.path() + "/none"}, "", "data.train.files").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("which does not exist")));
}

// ---- CSV ----

absl::StatusOr<std::vector<Element>> ReadCsv(const std::vector<std::string>& files,
                                             CsvOptions options) {
  STRATUM_ASSIGN_OR_RETURN(auto format, CsvFormat(files[0], std::move(options)));
  std::vector<Element> out;
  auto iterator = RecordFilesDataset(files, format).MakeIterator();
  while (true) {
    STRATUM_ASSIGN_OR_RETURN(std::optional<Element> next, iterator->GetNext());
    if (!next) return out;
    out.push_back(*std::move(next));
  }
}

TEST(CsvTest, ReadsQuotedFieldsDefaultsAndSelectedColumns) {
  TempDir dir;
  const std::string path = dir.Write("a.csv",
                                     "id,\"name, quoted\",w,h,label\r\n"
                                     "1,\"a, \"\"b\"\"\nc\",1.5,,3\n"
                                     "\n"
                                     "2,x,-2e1,4,NA\n");
  CsvOptions options;
  options.label_name = "label";
  options.select_columns = {"w", "h", "label"};
  options.na_value = "NA";
  options.column_defaults = {{},
                             {CsvColumnDefault::Type::kString, false, 0},
                             {CsvColumnDefault::Type::kFloat32, true, 0},
                             {CsvColumnDefault::Type::kFloat32, false, 7},
                             {CsvColumnDefault::Type::kInt64, false, 9}};
  absl::StatusOr<std::vector<Element>> rows = ReadCsv({path}, options);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_THAT(std::vector<float>((*rows)[0][0].data<float>(), (*rows)[0][0].data<float>() + 2),
              ElementsAre(1.5f, 7.0f));
  EXPECT_EQ(*(*rows)[0][1].data<int64_t>(), 3);
  EXPECT_THAT(std::vector<float>((*rows)[1][0].data<float>(), (*rows)[1][0].data<float>() + 2),
              ElementsAre(-20.0f, 4.0f));
  EXPECT_EQ(*(*rows)[1][1].data<int64_t>(), 9);  // NA: the default
}

TEST(CsvTest, NumbersMayHaveSpacesAndAPlusAsTensorFlowReadsThem) {
  TempDir dir;
  const std::string path = dir.Write("s.csv", "a, b, label\n1.5, +2, +1\n 3 ,-4,0\n");
  CsvOptions options;
  options.label_name = " label";
  absl::StatusOr<std::vector<Element>> rows = ReadCsv({path}, options);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ((*rows)[0][1].dtype(), DType::kInt64);
  EXPECT_EQ(*(*rows)[0][1].data<int64_t>(), 1);
  EXPECT_EQ((*rows)[1][0].data<float>()[0], 3.0f);
  EXPECT_EQ(*CountCsvRows(path, {}), 2);
}

TEST(CsvTest, InfersTypesAndNamesTheLineOfABadValue) {
  TempDir dir;
  const std::string a = dir.Write("a.csv", "f;g;y\n1;0.5;2\n3;1;0\n");
  const std::string b = dir.Write("b.csv.gz", "");
  dir.WriteGz("b.csv.gz", "f;g;y\n5;6;1\n7;oops;1\n");
  CsvOptions options;
  options.label_name = "y";
  options.field_delim = ';';
  absl::StatusOr<std::vector<Element>> rows = ReadCsv({a}, options);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ((*rows)[0][1].dtype(), DType::kInt64);  // every y an integer
  EXPECT_EQ((*rows)[0][0].shape(), Shape({2}));
  options.compression = Compression::kGzip;
  EXPECT_THAT(ReadCsv({b}, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("CSV column \"g\" holds text")));  // inferred from the rows
  options.column_defaults = {{CsvColumnDefault::Type::kInt64, true, 0},
                             {CsvColumnDefault::Type::kFloat32, true, 0},
                             {CsvColumnDefault::Type::kInt64, true, 0}};
  EXPECT_THAT(
      ReadCsv({b}, options).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr(b + " line 3: column \"g\" holds \"oops\", not a float32 number")));
  options.compression = Compression::kNone;
  options.column_defaults.clear();
  options.label_name = "z";
  EXPECT_THAT(ReadCsv({a}, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("label_name \"z\" is not a column: the columns are f, g, y")));
  const std::string text = dir.Write("t.csv", "word,y\nhello,1\n");
  options.label_name = "y";
  options.field_delim = ',';
  EXPECT_THAT(
      ReadCsv({text}, options).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CSV column \"word\" holds text")));
  const std::string other = dir.Write("o.csv", "f;h;y\n1;2;3\n");
  options.field_delim = ';';
  EXPECT_THAT(ReadCsv({a, other}, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("its header (f,h,y) differs from the first file's (f,g,y)")));
  const std::string ragged = dir.Write("r.csv", "f;g;y\n1;2\n");
  EXPECT_THAT(ReadCsv({ragged}, options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("r.csv line 2 has 2 fields, but the data has 3 columns")));
}

}  // namespace
}  // namespace stratum

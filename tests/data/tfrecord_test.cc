#include "stratum/data/tfrecord.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "idx_writer.h"
#include "stratum/data/crc32c.h"
#include "stratum/testing/status_matchers.h"

namespace stratum {
namespace {

using ::stratum::testing::StatusIs;
using ::stratum::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Three records ("hello", "", "tf.data") framed by hand from the TFRecord format's
// description, with CRCs from a bit-by-bit CRC32C written apart from Stratum's.
const std::string kThreeRecords(
    "\x05\x00\x00\x00\x00\x00\x00\x00\xea\xb2\x04\x3e\x68\x65\x6c\x6c\x6f\xbb\x1f\x1c\x19\x00"
    "\x00\x00\x00\x00\x00\x00\x00\x29\x03\x98\x07\xd8\xea\x82\xa2\x07\x00\x00\x00\x00\x00\x00"
    "\x00\xbb\xd7\x9f\x11\x74\x66\x2e\x64\x61\x74\x61\xc7\x0a\xf2\x66",
    5 + 16 + 16 + 7 + 16);

std::vector<std::string> ReadAll(const std::string& path, Compression compression,
                                 absl::Status* error = nullptr) {
  std::vector<std::string> records;
  absl::StatusOr<std::unique_ptr<TFRecordReader>> reader = TFRecordReader::Open(path, compression);
  if (!reader.ok()) {
    if (error != nullptr) *error = reader.status();
    return records;
  }
  while (true) {
    absl::StatusOr<std::optional<absl::string_view>> record = (*reader)->Next();
    if (!record.ok()) {
      if (error != nullptr) *error = record.status();
      return records;
    }
    if (!*record) return records;
    records.emplace_back(**record);
  }
}

std::string Compress(const std::string& bytes, int window) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, window, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, bytes.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

TEST(Crc32cTest, MatchesRfc3720Vectors) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  const std::string zeros(32, '\0');
  const std::string ones(32, '\xff');
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[static_cast<size_t>(i)] = static_cast<char>(i);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62a8ab43u);
  EXPECT_EQ(Crc32c(ascending.data(), 32), 0x46dd794eu);
  EXPECT_EQ(crc32c_internal::Crc32cPortable(0, ascending.data(), 32), 0x46dd794eu);
}

TEST(Crc32cTest, HardwareAndTablesAgreeOnEveryLengthAndSplit) {
  std::mt19937 rng(7);
  std::string bytes(1000, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  for (size_t n = 0; n < bytes.size(); n += 37) {
    const uint32_t whole = Crc32c(bytes.data(), n);
    EXPECT_EQ(whole, crc32c_internal::Crc32cPortable(0, bytes.data(), n)) << n;
    const size_t half = n / 3;
    EXPECT_EQ(Crc32cExtend(Crc32c(bytes.data(), half), bytes.data() + half, n - half), whole);
  }
}

TEST(TFRecordTest, ReadsRecordsFramedByHandFromTheFormat) {
  TempDir dir;
  EXPECT_EQ(ReadAll(dir.Write("a.tfrecord", kThreeRecords), Compression::kNone),
            (std::vector<std::string>{"hello", "", "tf.data"}));
  EXPECT_EQ(ReadAll(dir.Write("a.gz", Compress(kThreeRecords, 15 + 16)), Compression::kGzip),
            (std::vector<std::string>{"hello", "", "tf.data"}));
  EXPECT_EQ(ReadAll(dir.Write("a.zlib", Compress(kThreeRecords, 15)), Compression::kZlib),
            (std::vector<std::string>{"hello", "", "tf.data"}));
  // Concatenated gzip members are one stream, as gzip reads them.
  const std::string two = Compress(kThreeRecords, 31) + Compress(kThreeRecords, 31);
  EXPECT_EQ(ReadAll(dir.Write("two.gz", two), Compression::kGzip).size(), 6u);
  EXPECT_EQ(*CountTFRecords(dir.path() + "/a.tfrecord", Compression::kNone), 3);
}

TEST(TFRecordTest, WriterRoundTripsEveryCompressionBitForBit) {
  TempDir dir;
  std::mt19937 rng(3);
  std::vector<std::string> records;
  for (int i = 0; i < 300; ++i) {
    std::string r(static_cast<size_t>(rng() % (i == 7 ? 600000 : 3000)), '\0');
    for (char& c : r) c = static_cast<char>(rng());
    records.push_back(std::move(r));
  }
  for (Compression compression : {Compression::kNone, Compression::kGzip, Compression::kZlib}) {
    const std::string path = dir.path() + "/" + CompressionName(compression);
    auto writer = TFRecordWriter::Open(path, compression);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (const std::string& r : records) ASSERT_OK((*writer)->Write(r));
    struct stat info {};
    EXPECT_NE(::stat(path.c_str(), &info), 0) << "the file appears only when it is whole";
    ASSERT_OK((*writer)->Close());
    EXPECT_EQ(ReadAll(path, compression), records) << CompressionName(compression);
    EXPECT_EQ(*CountTFRecords(path, compression), 300);
  }
  // The uncompressed file is exactly the framing of the records.
  auto writer = TFRecordWriter::Open(dir.path() + "/hand", Compression::kNone);
  for (const char* r : {"hello", "", "tf.data"}) ASSERT_OK((*writer)->Write(r));
  ASSERT_OK((*writer)->Close());
  std::ifstream in(dir.path() + "/hand", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), kThreeRecords);
}

TEST(TFRecordTest, AWriterNotClosedLeavesNoFile) {
  TempDir dir;
  {
    auto writer = TFRecordWriter::Open(dir.path() + "/partial", Compression::kGzip);
    ASSERT_OK((*writer)->Write("x"));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(TFRecordTest, DamageIsAnErrorNamingTheFileAndTheRecordsOffset) {
  TempDir dir;
  absl::Status error;
  std::string bad_data = kThreeRecords;
  bad_data[37 + 12 + 2] ^= 1;  // inside the third record's data
  const std::string data_path = dir.Write("data.tfrecord", bad_data);
  EXPECT_EQ(ReadAll(data_path, Compression::kNone, &error).size(), 2u);
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kDataLoss,
                              AllOf(HasSubstr(data_path), HasSubstr("byte offset 37"),
                                    HasSubstr("data's CRC32C does not match"))));

  std::string bad_length = kThreeRecords;
  bad_length[21] = 0x7f;  // the second record's length
  EXPECT_EQ(ReadAll(dir.Write("len", bad_length), Compression::kNone, &error).size(), 1u);
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kDataLoss,
                              AllOf(HasSubstr("byte offset 21"),
                                    HasSubstr("length's CRC32C does not match"))));

  for (size_t cut : {size_t{30}, size_t{37 + 5}, kThreeRecords.size() - 1}) {
    const std::string path = dir.Write("cut", kThreeRecords.substr(0, cut));
    ReadAll(path, Compression::kNone, &error);
    EXPECT_THAT(error, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("the file is truncated")))
        << cut;
    EXPECT_THAT(CountTFRecords(path, Compression::kNone).status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  }

  const std::string gz = Compress(kThreeRecords, 31);
  ReadAll(dir.Write("cut.gz", gz.substr(0, gz.size() - 10)), Compression::kGzip, &error);
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  ReadAll(dir.Write("plain-as-gz", kThreeRecords), Compression::kGzip, &error);
  EXPECT_THAT(error,
              StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("corrupt GZIP stream"),
                                                          HasSubstr("check compression_type"))));
}

TEST(TFRecordTest, AnEmptyCompressedFileHasNoRecordsAndAGzipReadAsPlainIsNamed) {
  TempDir dir;
  EXPECT_TRUE(ReadAll(dir.Write("empty.gz", ""), Compression::kGzip).empty());
  EXPECT_EQ(*CountTFRecords(dir.path() + "/empty.gz", Compression::kGzip), 0);
  absl::Status error;
  ReadAll(dir.Write("a.gz", Compress(kThreeRecords, 31)), Compression::kNone, &error);
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kDataLoss,
                              HasSubstr("starts like a GZIP file, not a TFRecord: set "
                                        "compression_type \"GZIP\"")));
}

TEST(TFRecordTest, ALengthBeyondTheFileIsRefusedBeforeItsBufferIsMade) {
  TempDir dir;
  // A valid length CRC for 512 MiB, and nothing after it.
  std::string header(12, '\0');
  const uint64_t length = uint64_t{512} << 20;
  std::memcpy(header.data(), &length, 8);
  const uint32_t crc = MaskCrc32c(Crc32c(header.data(), 8));
  std::memcpy(header.data() + 8, &crc, 4);
  absl::Status error;
  ReadAll(dir.Write("short", header + "abc"), Compression::kNone, &error);
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kDataLoss,
                              AllOf(HasSubstr("it declares 536870912 bytes of data, but the file "
                                              "ends 15 bytes after its start"),
                                    HasSubstr("truncated"))));
}

TEST(TFRecordTest, MissingFilesFoldersAndFifosAreRefusedWithoutBlocking) {
  TempDir dir;
  absl::Status error;
  ReadAll(dir.path() + "/none", Compression::kNone, &error);
  EXPECT_THAT(error, StatusIs(absl::StatusCode::kNotFound, HasSubstr("no such file")));
  ReadAll(dir.path(), Compression::kNone, &error);
  EXPECT_THAT(error,
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a regular file")));
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ReadAll(fifo, Compression::kNone, &error);  // would block without O_NONBLOCK
  EXPECT_THAT(error,
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a regular file")));
}

TEST(TFRecordTest, CompressionNamesAreTfs) {
  EXPECT_EQ(*CompressionFromName(""), Compression::kNone);
  EXPECT_EQ(*CompressionFromName("gzip"), Compression::kGzip);
  EXPECT_EQ(*CompressionFromName("ZLIB"), Compression::kZlib);
  EXPECT_THAT(CompressionFromName("snappy").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"GZIP\" or \"ZLIB\"")));
}

}  // namespace
}  // namespace stratum

#include "stratum/data/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

constexpr char kFashionMnistHint[] =
    "Fashion-MNIST comes from Debian's dataset-fashion-mnist package (apt-get install "
    "dataset-fashion-mnist), which installs /usr/share/datasets/fashion-mnist/";

// Closes a gzFile on every return path.
class GzFile {
 public:
  explicit GzFile(gzFile file) : file_(file) {}
  ~GzFile() {
    if (file_ != nullptr) gzclose(file_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  gzFile get() const { return file_; }

 private:
  gzFile file_;
};

// The whole (decompressed, when gzipped) content. gzread passes plain files through.
absl::StatusOr<std::string> ReadAll(const std::string& path) {
  errno = 0;
  GzFile file(gzopen(path.c_str(), "rb"));
  if (file.get() == nullptr) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) {
      return absl::NotFoundError(
          absl::StrCat("IDX file \"", path, "\" not found: check the path; ", kFashionMnistHint));
    }
    return absl::ErrnoToStatus(error, absl::StrCat("cannot open IDX file \"", path,
                                                   "\": check that it is a readable file"));
  }
  gzbuffer(file.get(), 1 << 20);
  std::string content;
  constexpr size_t kChunk = 4 << 20;
  while (true) {
    const size_t old_size = content.size();
    content.resize(old_size + kChunk);
    const int n = gzread(file.get(), content.data() + old_size, static_cast<unsigned>(kChunk));
    if (n < 0) {
      int zerr = Z_OK;
      const char* message = gzerror(file.get(), &zerr);
      if (zerr == Z_ERRNO) {
        return absl::ErrnoToStatus(
            errno, absl::StrCat("cannot read IDX file \"", path, "\": ", std::strerror(errno)));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "IDX file \"", path, "\" is a corrupt gzip stream after ", old_size,
          " decompressed bytes (zlib: ", message, "): download or reinstall the file"));
    }
    content.resize(old_size + static_cast<size_t>(n));
    if (static_cast<size_t>(n) < kChunk) break;
  }
  // A gzip stream cut short reads as a short read with a pending error.
  int zerr = Z_OK;
  const char* message = gzerror(file.get(), &zerr);
  if (zerr != Z_OK && zerr != Z_STREAM_END) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IDX file \"", path, "\" is a truncated or corrupt gzip stream after ", content.size(),
        " decompressed bytes (zlib: ", message, "): download or reinstall the file"));
  }
  return content;
}

struct ElementType {
  const char* name;
  int size;
  bool supported;
  DType dtype;
};

absl::StatusOr<ElementType> TypeOf(const std::string& path, uint8_t code) {
  switch (code) {
    case 0x08:
      return ElementType{"ubyte", 1, true, DType::kUInt8};
    case 0x09:
      return ElementType{"int8", 1, false, DType::kUInt8};
    case 0x0B:
      return ElementType{"int16", 2, false, DType::kInt32};
    case 0x0C:
      return ElementType{"int32", 4, true, DType::kInt32};
    case 0x0D:
      return ElementType{"float32", 4, true, DType::kFloat32};
    case 0x0E:
      return ElementType{"float64", 8, false, DType::kFloat32};
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "IDX file \"%s\" has an unknown element type byte 0x%02X at offset 2: valid types are "
      "0x08, 0x09, 0x0B, 0x0C, 0x0D and 0x0E; the file is corrupt or not IDX",
      path, code));
}

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string FirstBytes(const std::string& content) {
  std::string hex;
  for (size_t i = 0; i < content.size() && i < 4; ++i) {
    absl::StrAppend(&hex, i == 0 ? "" : " ",
                    absl::Hex(static_cast<unsigned char>(content[i]), absl::kZeroPad2));
  }
  return hex.empty() ? "(none: the file is empty)" : hex;
}

absl::StatusOr<Tensor> ParseIdx(const std::string& path, const std::string& content) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(content.data());
  if (content.size() < 4 || bytes[0] != 0 || bytes[1] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IDX file \"", path, "\" is not an IDX file: its first bytes are ", FirstBytes(content),
        " (", content.size(),
        " bytes in all) but IDX starts with 00 00, a type byte and a dimension count; check "
        "that the path names an IDX file"));
  }
  STRATUM_ASSIGN_OR_RETURN(ElementType type, TypeOf(path, bytes[2]));
  const size_t ndims = bytes[3];
  const size_t header_size = 4 + 4 * ndims;
  if (content.size() < header_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX file \"", path, "\" is truncated: its header declares ", ndims,
                     " dimensions, which take ", header_size, " bytes, but the file has only ",
                     content.size(), " bytes; download or reinstall the file"));
  }
  std::vector<int64_t> dims;
  uint64_t count = 1;
  bool overflow = false;
  for (size_t i = 0; i < ndims; ++i) {
    const uint32_t dim = BigEndian32(bytes + 4 + 4 * i);
    dims.push_back(dim);
    if (dim != 0 && count > (uint64_t{1} << 48) / dim) overflow = true;
    count *= dim;
  }
  Shape shape(std::move(dims));
  const uint64_t available = content.size() - header_size;
  if (overflow || count * static_cast<uint64_t>(type.size) != available) {
    const std::string expected = overflow ? std::string("more than 2^48")
                                          : absl::StrCat(count * static_cast<uint64_t>(type.size));
    return absl::InvalidArgumentError(absl::StrCat(
        "IDX file \"", path, "\" is ",
        !overflow && count * type.size > available ? "truncated" : "corrupt",
        ": its header declares shape ", shape.ToString(), " of ", type.name, ", which takes ",
        expected, " data bytes, but the file has ", available, " data bytes after its ",
        header_size, "-byte header; download or reinstall the file"));
  }
  if (!type.supported) {
    return absl::UnimplementedError(absl::StrFormat(
        "IDX file \"%s\" holds %s elements (type byte 0x%02X), which Stratum does not read: "
        "convert it to ubyte (0x08), int32 (0x0C) or float32 (0x0D)",
        path, type.name, bytes[2]));
  }
  Tensor tensor(type.dtype, std::move(shape));
  const unsigned char* data = bytes + header_size;
  if (type.size == 1) {
    std::memcpy(tensor.raw_data(), data, available);
  } else {
    auto* out = static_cast<uint32_t*>(tensor.raw_data());
    for (uint64_t i = 0; i < count; ++i) out[i] = BigEndian32(data + 4 * i);
  }
  return tensor;
}

absl::Status CheckPair(const std::string& dir, const char* images_name, const Tensor& images,
                       const char* labels_name, const Tensor& labels) {
  if (images.dtype() != DType::kUInt8 || images.shape().rank() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Fashion-MNIST file \"", dir, "/", images_name, "\" holds ", images.DebugString(),
        " but images must be uint8 [n, height, width]; ", kFashionMnistHint));
  }
  if (labels.dtype() != DType::kUInt8 || labels.shape().rank() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fashion-MNIST file \"", dir, "/", labels_name, "\" holds ",
                     labels.DebugString(), " but labels must be uint8 [n]; ", kFashionMnistHint));
  }
  if (images.rows() != labels.rows()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fashion-MNIST in \"", dir, "\": ", images_name, " has ", images.rows(),
                     " images but ", labels_name, " has ", labels.rows(),
                     " labels: the files are truncated or from different sets; reinstall them (",
                     kFashionMnistHint, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> ReadIdxFile(const std::string& path) {
  STRATUM_ASSIGN_OR_RETURN(std::string content, ReadAll(path));
  return ParseIdx(path, content);
}

absl::StatusOr<MnistLikeData> LoadFashionMnist(const std::string& dir) {
  static constexpr const char* kFiles[4] = {
      "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
      "t10k-labels-idx1-ubyte.gz"};
  MnistLikeData data;
  Tensor* targets[4] = {&data.train_images, &data.train_labels, &data.test_images,
                        &data.test_labels};
  for (int i = 0; i < 4; ++i) {
    STRATUM_ASSIGN_OR_RETURN(*targets[i], ReadIdxFile(absl::StrCat(dir, "/", kFiles[i])));
  }
  STRATUM_RETURN_IF_ERROR(
      CheckPair(dir, kFiles[0], data.train_images, kFiles[1], data.train_labels));
  STRATUM_RETURN_IF_ERROR(CheckPair(dir, kFiles[2], data.test_images, kFiles[3], data.test_labels));
  return data;
}

}  // namespace stratum

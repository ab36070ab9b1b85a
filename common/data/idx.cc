#include "stratum/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
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

// Most data bytes an IDX file may declare: far above MNIST-like sets, far below what a
// corrupt header or a gzip bomb would make Stratum allocate.
constexpr uint64_t kMaxDataBytes = uint64_t{16} << 30;
// Data bytes read past the declared size before a file is refused as too long: enough to
// report the exact length of a slightly-too-long file, little enough to stop a bomb early.
constexpr size_t kProbeBytes = 64 << 10;

// What the header declares. `bytes` holds at least the 4-byte prefix and the dimensions.
struct Header {
  ElementType type;
  size_t size = 0;  // bytes
  Shape shape;
  uint64_t count = 0;       // elements
  bool overflow = false;    // the element count exceeds 2^48
  uint64_t data_bytes = 0;  // count * element size, when !overflow
};

// The magic and the type byte; `content` holds what has been read so far.
absl::Status CheckPrefix(const std::string& path, const std::string& content) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(content.data());
  if (content.size() < 4 || bytes[0] != 0 || bytes[1] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IDX file \"", path, "\" is not an IDX file: its first bytes are ", FirstBytes(content),
        " (", content.size(),
        " bytes in all) but IDX starts with 00 00, a type byte and a dimension count; check "
        "that the path names an IDX file"));
  }
  return TypeOf(path, bytes[2]).status();
}

size_t HeaderSize(const std::string& content) {
  return 4 + 4 * static_cast<size_t>(static_cast<unsigned char>(content[3]));
}

absl::StatusOr<Header> ParseHeader(const std::string& path, const std::string& content) {
  STRATUM_RETURN_IF_ERROR(CheckPrefix(path, content));
  const auto* bytes = reinterpret_cast<const unsigned char*>(content.data());
  Header header;
  STRATUM_ASSIGN_OR_RETURN(header.type, TypeOf(path, bytes[2]));
  const size_t ndims = bytes[3];
  header.size = HeaderSize(content);
  if (content.size() < header.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX file \"", path, "\" is truncated: its header declares ", ndims,
                     " dimensions, which take ", header.size, " bytes, but the file has only ",
                     content.size(), " bytes; download or reinstall the file"));
  }
  std::vector<int64_t> dims;
  uint64_t count = 1;
  for (size_t i = 0; i < ndims; ++i) {
    const uint32_t dim = BigEndian32(bytes + 4 + 4 * i);
    dims.push_back(dim);
    if (dim != 0 && count > (uint64_t{1} << 48) / dim) header.overflow = true;
    count *= dim;
  }
  header.shape = Shape(std::move(dims));
  header.count = count;
  header.data_bytes = header.overflow ? 0 : count * static_cast<uint64_t>(header.type.size);
  return header;
}

std::string DeclaredBytes(const Header& header) {
  return header.overflow ? std::string("more than 2^48") : absl::StrCat(header.data_bytes);
}

// Appends up to `limit` more decompressed bytes to `content`, growing it as data arrives
// so that memory follows the real data, not a size the file claims.
absl::Status ReadUpTo(const std::string& path, gzFile file, size_t limit, std::string& content) {
  constexpr size_t kChunk = 4 << 20;
  while (limit > 0) {
    const size_t old_size = content.size();
    const size_t want = std::min(limit, kChunk);
    content.resize(old_size + want);
    const int n = gzread(file, content.data() + old_size, static_cast<unsigned>(want));
    if (n < 0) {
      content.resize(old_size);
      int zerr = Z_OK;
      const char* message = gzerror(file, &zerr);
      if (zerr == Z_ERRNO) {
        // ErrnoToStatus appends the errno's text itself.
        return absl::ErrnoToStatus(errno, absl::StrCat("cannot read IDX file \"", path, "\""));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "IDX file \"", path, "\" is a corrupt gzip stream after ", old_size,
          " decompressed bytes (zlib: ", message, "): download or reinstall the file"));
    }
    content.resize(old_size + static_cast<size_t>(n));
    limit -= static_cast<size_t>(n);
    if (static_cast<size_t>(n) < want) break;
  }
  // A gzip stream cut short reads as a short read with a pending error.
  int zerr = Z_OK;
  const char* message = gzerror(file, &zerr);
  if (zerr != Z_OK && zerr != Z_STREAM_END) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IDX file \"", path, "\" is a truncated or corrupt gzip stream after ", content.size(),
        " decompressed bytes (zlib: ", message, "): download or reinstall the file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<gzFile> OpenIdx(const std::string& path) {
  if (std::error_code error; std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX file \"", path, "\" is a directory: give the path of an IDX file, e.g. ",
                     kDefaultFashionMnistDir, "/train-images-idx3-ubyte.gz"));
  }
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) {
      return absl::NotFoundError(
          absl::StrCat("IDX file \"", path, "\" not found: check the path; ", kFashionMnistHint));
    }
    return absl::ErrnoToStatus(error, absl::StrCat("cannot open IDX file \"", path,
                                                   "\": check that it is a readable file"));
  }
  gzbuffer(file, 1 << 20);
  return file;
}

// Reads the header of the just-opened `file` into `content` and refuses a declared size
// Stratum would not read.
absl::StatusOr<Header> ReadHeader(const std::string& path, gzFile file, std::string& content) {
  STRATUM_RETURN_IF_ERROR(ReadUpTo(path, file, 4, content));
  STRATUM_RETURN_IF_ERROR(CheckPrefix(path, content));
  STRATUM_RETURN_IF_ERROR(ReadUpTo(path, file, HeaderSize(content) - 4, content));
  STRATUM_ASSIGN_OR_RETURN(Header header, ParseHeader(path, content));
  if (header.overflow || header.data_bytes > kMaxDataBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IDX file \"", path, "\" is corrupt: its header declares shape ", header.shape.ToString(),
        " of ", header.type.name, ", which takes ", DeclaredBytes(header),
        " data bytes, more than the 16 GiB Stratum reads from one file; download or reinstall "
        "the file, or split the data set into smaller files"));
  }
  return header;
}

absl::Status CheckSupported(const std::string& path, const Header& header, uint8_t code) {
  if (header.type.supported) return absl::OkStatus();
  // INVALID_ARGUMENT (exit 2, not restarted): the file must be converted first.
  return absl::InvalidArgumentError(absl::StrFormat(
      "IDX file \"%s\" holds %s elements (type byte 0x%02X), which Stratum does not read: "
      "convert it to ubyte (0x08), int32 (0x0C) or float32 (0x0D)",
      path, header.type.name, code));
}

// The decompressed (when gzipped; gzread passes plain files through) header and data. Reads
// the header first and stops soon after the data outgrows what the header declares, so a
// small gzip bomb is refused without inflating it.
absl::StatusOr<std::string> ReadContent(const std::string& path) {
  STRATUM_ASSIGN_OR_RETURN(gzFile opened, OpenIdx(path));
  GzFile file(opened);
  std::string content;
  STRATUM_ASSIGN_OR_RETURN(const Header header, ReadHeader(path, file.get(), content));
  STRATUM_RETURN_IF_ERROR(ReadUpTo(path, file.get(), header.data_bytes + kProbeBytes, content));
  const uint64_t available = content.size() - header.size;
  if (available > header.data_bytes + kProbeBytes - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IDX file \"", path, "\" is corrupt: its header declares shape ", header.shape.ToString(),
        " of ", header.type.name, ", which takes ", header.data_bytes,
        " data bytes, but the file has more than ", available - 1, " data bytes after its ",
        header.size, "-byte header (reading stopped there); download or reinstall the file"));
  }
  return content;
}

absl::StatusOr<Tensor> ParseIdx(const std::string& path, const std::string& content) {
  STRATUM_ASSIGN_OR_RETURN(const Header header, ParseHeader(path, content));
  const ElementType& type = header.type;
  const uint64_t available = content.size() - header.size;
  if (header.overflow || header.data_bytes != available) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IDX file \"", path, "\" is ",
        !header.overflow && header.data_bytes > available ? "truncated" : "corrupt",
        ": its header declares shape ", header.shape.ToString(), " of ", type.name,
        ", which takes ", DeclaredBytes(header), " data bytes, but the file has ", available,
        " data bytes after its ", header.size, "-byte header; download or reinstall the file"));
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(content.data());
  STRATUM_RETURN_IF_ERROR(CheckSupported(path, header, bytes[2]));
  Tensor tensor(type.dtype, header.shape);
  const unsigned char* data = bytes + header.size;
  if (type.size == 1) {
    std::memcpy(tensor.raw_data(), data, available);
  } else {
    auto* out = static_cast<uint32_t*>(tensor.raw_data());
    for (uint64_t i = 0; i < header.count; ++i) out[i] = BigEndian32(data + 4 * i);
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
  STRATUM_ASSIGN_OR_RETURN(std::string content, ReadContent(path));
  return ParseIdx(path, content);
}

absl::StatusOr<IdxHeader> ReadIdxHeader(const std::string& path) {
  STRATUM_ASSIGN_OR_RETURN(gzFile opened, OpenIdx(path));
  GzFile file(opened);
  std::string content;
  STRATUM_ASSIGN_OR_RETURN(const Header header, ReadHeader(path, file.get(), content));
  STRATUM_RETURN_IF_ERROR(CheckSupported(path, header, static_cast<unsigned char>(content[2])));
  return IdxHeader{.dtype = header.type.dtype, .shape = header.shape};
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

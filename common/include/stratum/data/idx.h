// Readers for the IDX format of MNIST and Fashion-MNIST, plain or gzipped. An IDX file is
// a big-endian header (two zero bytes, a type byte, a dimension count, one uint32 per
// dimension) followed by the elements, row-major and big-endian. Stratum reads element
// types ubyte (0x08, as uint8), int32 (0x0C) and float32 (0x0D); int8, int16 and float64
// files are refused by name.
//
// Thread safety: the functions keep no state; call them from any thread.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "stratum/tensor/tensor.h"

namespace stratum {

// Where Debian's dataset-fashion-mnist package installs the data.
inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// The whole file as one tensor whose shape is the header's dimensions.
// NOT_FOUND when the file does not exist; INVALID_ARGUMENT when it is not IDX, is
// truncated or longer than its header says (reading stops soon after the declared size,
// so a gzip bomb is not inflated), declares more than 16 GiB of data, or is a corrupt gzip
// stream;
// UNIMPLEMENTED for element types other than ubyte, int32 and float32; the errno's code
// (e.g. PERMISSION_DENIED) when it cannot be opened or read.
absl::StatusOr<Tensor> ReadIdxFile(const std::string& path);

// What an IDX file's header declares.
struct IdxHeader {
  DType dtype;
  Shape shape;
};

// The header of an IDX file, read without its data: a quick check, before a long wait,
// that the file is there, readable and IDX of a type Stratum reads. Errors as ReadIdxFile
// for the header; a data part that is truncated or corrupt is found only by ReadIdxFile.
absl::StatusOr<IdxHeader> ReadIdxHeader(const std::string& path);

// An MNIST-shaped data set: images [n, rows, cols] and labels [n], uint8.
struct MnistLikeData {
  Tensor train_images;
  Tensor train_labels;
  Tensor test_images;
  Tensor test_labels;
};

// Reads train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz
// and t10k-labels-idx1-ubyte.gz from `dir`, and checks that images are uint8 [n, h, w],
// labels uint8 [n], and that the counts agree. Errors as ReadIdxFile, plus
// INVALID_ARGUMENT for files of the wrong shape or disagreeing counts.
absl::StatusOr<MnistLikeData> LoadFashionMnist(const std::string& dir = kDefaultFashionMnistDir);

}  // namespace stratum

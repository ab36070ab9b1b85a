#include "data_wire.h"

#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace stratum::data_wire {
namespace {

// A request entry's flags.
constexpr uint32_t kRead = 1;
constexpr uint32_t kRows = 2;

class Writer {
 public:
  template <typename T>
  void Put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  void PutString(const std::string& text) {
    Put(static_cast<uint32_t>(text.size()));
    out_.append(text);
  }
  void PutTensor(const TensorRef& tensor) {
    Put(static_cast<uint32_t>(tensor.dtype));
    Put(static_cast<uint32_t>(tensor.shape.rank()));
    for (int64_t dim : tensor.shape.dims()) Put(dim);
    Put(static_cast<uint32_t>(tensor.location));
    Put(tensor.offset);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads what Writer wrote; every read checks the bytes left first.
class Reader {
 public:
  Reader(absl::string_view bytes, const Limits& limits) : bytes_(bytes), limits_(limits) {}

  template <typename T>
  absl::Status Get(T* value, const char* what) {
    if (bytes_.size() < sizeof(T)) {
      return absl::InvalidArgumentError(absl::StrCat("frame meta ends inside ", what));
    }
    std::memcpy(value, bytes_.data(), sizeof(T));
    bytes_.remove_prefix(sizeof(T));
    return absl::OkStatus();
  }

  absl::Status GetString(std::string* text, uint32_t max, const char* what) {
    uint32_t size = 0;
    if (absl::Status status = Get(&size, what); !status.ok()) return status;
    if (size > max) {
      return absl::InvalidArgumentError(
          absl::StrCat("frame meta has a ", what, " of ", size, " bytes, over the limit of ", max));
    }
    if (bytes_.size() < size) {
      return absl::InvalidArgumentError(absl::StrCat("frame meta ends inside ", what));
    }
    text->assign(bytes_.data(), size);
    bytes_.remove_prefix(size);
    return absl::OkStatus();
  }

  absl::Status GetTensor(TensorRef* tensor) {
    uint32_t dtype = 0, rank = 0, location = 0;
    if (absl::Status status = Get(&dtype, "a dtype"); !status.ok()) return status;
    if (dtype < static_cast<uint32_t>(DType::kFloat32) ||
        dtype > static_cast<uint32_t>(DType::kUInt8)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", tensor->name, "\" has dtype ", dtype,
                       ", which is not one of float32, int32, int64, uint8"));
    }
    tensor->dtype = static_cast<DType>(dtype);
    if (absl::Status status = Get(&rank, "a rank"); !status.ok()) return status;
    if (rank > limits_.max_rank) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor->name, "\" has rank ",
                                                     rank, ", over the limit of ",
                                                     limits_.max_rank));
    }
    std::vector<int64_t> dims(rank);
    int64_t elements = 1;
    for (int64_t& dim : dims) {
      if (absl::Status status = Get(&dim, "a dimension"); !status.ok()) return status;
      if (dim < 0 || (dim > 0 && elements > (int64_t{1} << 40) / dim)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor->name,
                                                       "\" has dimension ", dim,
                                                       ", which is negative or too large"));
      }
      elements *= dim;
    }
    tensor->shape = Shape(std::move(dims));
    if (absl::Status status = Get(&location, "a location"); !status.ok()) return status;
    if (location > static_cast<uint32_t>(Location::kShared)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", tensor->name, "\" has location ", location,
                       ", which is neither inline (0) nor shared (1)"));
    }
    tensor->location = static_cast<Location>(location);
    return Get(&tensor->offset, "an offset");
  }

  absl::Status GetCount(uint32_t* count) {
    if (absl::Status status = Get(count, "the tensor count"); !status.ok()) return status;
    if (*count > limits_.max_tensors) {
      return absl::InvalidArgumentError(
          absl::StrCat("frame has ", *count, " tensors, over the limit of ", limits_.max_tensors));
    }
    return absl::OkStatus();
  }

  size_t left() const { return bytes_.size(); }

  absl::Status CheckEnd() const {
    if (bytes_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("frame meta runs on for ", bytes_.size(), " bytes after its last tensor"));
  }

 private:
  absl::string_view bytes_;
  const Limits& limits_;
};

}  // namespace

std::string EncodeRequestMeta(const RequestMeta& meta) {
  Writer writer;
  writer.Put(static_cast<uint32_t>(meta.tensors.size()));
  for (const TensorRef& tensor : meta.tensors) {
    writer.PutString(tensor.name);
    writer.PutTensor(tensor);
    writer.Put(static_cast<uint32_t>((tensor.read ? kRead : 0) | (tensor.has_rows ? kRows : 0)));
    if (tensor.has_rows) {
      writer.Put(static_cast<uint64_t>(tensor.rows.size()));
      for (int64_t row : tensor.rows) writer.Put(row);
    }
  }
  return writer.Take();
}

std::string EncodeResponseMeta(const ResponseMeta& meta) {
  Writer writer;
  writer.PutString(meta.message);
  writer.Put(static_cast<uint32_t>(meta.updates.size()));
  for (int64_t updates : meta.updates) writer.Put(updates);
  writer.Put(static_cast<uint32_t>(meta.values.size()));
  for (const TensorRef& tensor : meta.values) writer.PutTensor(tensor);
  writer.Put(meta.shared_bytes_wanted);
  return writer.Take();
}

absl::Status CheckHeader(const FrameHeader& header, uint32_t magic, const Limits& limits) {
  if (header.magic != magic) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame starts with 0x", absl::Hex(header.magic), " where 0x", absl::Hex(magic),
                     " belongs: the peer does not speak Stratum's data path, version ", kVersion));
  }
  if (magic == kRequestMagic && header.op_or_code != static_cast<uint32_t>(Op::kPush) &&
      header.op_or_code != static_cast<uint32_t>(Op::kPull)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request has op ", header.op_or_code, ", which is neither push nor pull"));
  }
  if (header.meta_bytes > limits.max_meta_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame has ", header.meta_bytes,
                                                   " bytes of meta, over the limit of ",
                                                   limits.max_meta_bytes));
  }
  if (header.inline_bytes > limits.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "frame carries ", header.inline_bytes, " bytes of tensors, over the limit of ",
        limits.max_bytes, ": split the variable (a variable partitioner) or raise the limit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RequestMeta> ParseRequestMeta(absl::string_view bytes, const Limits& limits) {
  Reader reader(bytes, limits);
  uint32_t count = 0;
  if (absl::Status status = reader.GetCount(&count); !status.ok()) return status;
  RequestMeta meta;
  meta.tensors.resize(count);
  for (TensorRef& tensor : meta.tensors) {
    if (absl::Status status = reader.GetString(&tensor.name, limits.max_name_bytes, "a name");
        !status.ok()) {
      return status;
    }
    if (absl::Status status = reader.GetTensor(&tensor); !status.ok()) return status;
    uint32_t flags = 0;
    if (absl::Status status = reader.Get(&flags, "an entry's flags"); !status.ok()) return status;
    if ((flags & ~(kRead | kRows)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor.name, "\" has flags ",
                                                     flags,
                                                     ", which are not read (1) or rows (2)"));
    }
    tensor.read = (flags & kRead) != 0;
    tensor.has_rows = (flags & kRows) != 0;
    if (tensor.has_rows) {
      uint64_t rows = 0;
      if (absl::Status status = reader.Get(&rows, "a row count"); !status.ok()) return status;
      if (rows > reader.left() / sizeof(int64_t)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor.name, "\" names ", rows,
                                                       " rows, more than the meta holds"));
      }
      tensor.rows.resize(rows);
      for (int64_t& row : tensor.rows) {
        if (absl::Status status = reader.Get(&row, "a row"); !status.ok()) return status;
      }
    }
  }
  if (absl::Status status = reader.CheckEnd(); !status.ok()) return status;
  return meta;
}

absl::StatusOr<ResponseMeta> ParseResponseMeta(absl::string_view bytes, const Limits& limits) {
  Reader reader(bytes, limits);
  ResponseMeta meta;
  if (absl::Status status = reader.GetString(&meta.message, limits.max_meta_bytes, "a message");
      !status.ok()) {
    return status;
  }
  uint32_t count = 0;
  if (absl::Status status = reader.GetCount(&count); !status.ok()) return status;
  meta.updates.resize(count);
  for (int64_t& updates : meta.updates) {
    if (absl::Status status = reader.Get(&updates, "an update count"); !status.ok()) return status;
  }
  if (absl::Status status = reader.GetCount(&count); !status.ok()) return status;
  meta.values.resize(count);
  for (TensorRef& tensor : meta.values) {
    if (absl::Status status = reader.GetTensor(&tensor); !status.ok()) return status;
  }
  if (absl::Status status = reader.Get(&meta.shared_bytes_wanted, "the shared size");
      !status.ok()) {
    return status;
  }
  if (absl::Status status = reader.CheckEnd(); !status.ok()) return status;
  return meta;
}

absl::Status CheckPlacement(const std::vector<TensorRef>& tensors, uint64_t inline_bytes,
                            uint64_t shared_bytes, const Limits& limits) {
  uint64_t inline_total = 0, total = 0;
  for (const TensorRef& tensor : tensors) total += tensor.byte_size();  // < 2^60: no overflow
  if (total > limits.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "frame carries ", total, " bytes of tensors, over the limit of ", limits.max_bytes,
        ": split the variable (a variable partitioner) or raise the limit"));
  }
  for (const TensorRef& tensor : tensors) {
    const uint64_t bytes = tensor.byte_size();
    if (tensor.location == Location::kInline) {
      inline_total += bytes;
      continue;
    }
    if (shared_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", tensor.name, "\" is in shared memory, but the connection has none"));
    }
    if (tensor.offset % DTypeSize(tensor.dtype) != 0 || tensor.offset > shared_bytes ||
        bytes > shared_bytes - tensor.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", tensor.name, "\" of ", bytes, " bytes at offset ", tensor.offset,
          " does not lie aligned inside the shared segment of ", shared_bytes, " bytes"));
    }
  }
  if (inline_total != inline_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame carries ", inline_bytes, " inline bytes but its tensors need ", inline_total));
  }
  return absl::OkStatus();
}

}  // namespace stratum::data_wire

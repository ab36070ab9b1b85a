#include "stratum/checkpoint/keras_export.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <map>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "stratum/checkpoint/safetensors.h"
#include "stratum/util/status_macros.h"

namespace stratum {
namespace {

// The model JSON as an object (Keras writes it as a string inside JSON too).
nlohmann::json Unwrapped(const nlohmann::json& model_json) {
  if (model_json.is_string()) {
    nlohmann::json parsed = nlohmann::json::parse(model_json.get<std::string>(), nullptr, false);
    if (!parsed.is_discarded()) return parsed;
  }
  return model_json;
}

// HDF5's C library (Debian's libhdf5-103-1), loaded when an export is written rather than
// linked: the binaries run without it, and only an export needs it. The declarations are
// those of HDF5 1.10's hdf5.h for what an export calls.
using hid_t = int64_t;
using herr_t = int;
using hsize_t = unsigned long long;  // NOLINT(runtime/int): HDF5's own type

struct Hdf5 {
  herr_t (*open)();
  herr_t (*set_error_printing)(hid_t, void*, void*);
  hid_t (*create_file)(const char*, unsigned, hid_t, hid_t);
  herr_t (*flush_file)(hid_t, int);
  herr_t (*close_file)(hid_t);
  hid_t (*create_property_list)(hid_t);
  herr_t (*set_create_intermediate_group)(hid_t, unsigned);
  herr_t (*close_property_list)(hid_t);
  hid_t (*create_group)(hid_t, const char*, hid_t, hid_t, hid_t);
  herr_t (*close_group)(hid_t);
  hid_t (*create_simple_space)(int, const hsize_t*, const hsize_t*);
  hid_t (*create_space)(int);
  herr_t (*close_space)(hid_t);
  hid_t (*create_dataset)(hid_t, const char*, hid_t, hid_t, hid_t, hid_t, hid_t);
  herr_t (*write_dataset)(hid_t, hid_t, hid_t, hid_t, hid_t, const void*);
  herr_t (*close_dataset)(hid_t);
  const hid_t* link_create_class;  // H5P_CLS_LINK_CREATE_ID_g
  const hid_t* ieee_f32le;         // H5T_IEEE_F32LE_g
  const hid_t* native_float;       // H5T_NATIVE_FLOAT_g
};
constexpr unsigned kTruncate = 0x0002u;  // H5F_ACC_TRUNC
constexpr hid_t kDefault = 0;            // H5P_DEFAULT, H5S_ALL, H5E_DEFAULT
constexpr int kGlobalScope = 1;          // H5F_SCOPE_GLOBAL
constexpr int kScalarSpace = 0;          // H5S_SCALAR

// The library, loaded once; FAILED_PRECONDITION with the package to install when missing.
absl::StatusOr<const Hdf5*> LoadHdf5() {
  static const absl::StatusOr<const Hdf5*> loaded = []() -> absl::StatusOr<const Hdf5*> {
    void* library = nullptr;
    for (const char* name :
         {"libhdf5_serial.so.103", "libhdf5.so.103", "libhdf5_serial.so", "libhdf5.so"}) {
      if ((library = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (library == nullptr) {
      return absl::FailedPreconditionError(
          "exporting Keras' .weights.h5 needs the HDF5 library, which is not installed: "
          "apt-get install libhdf5-103-1");
    }
    auto* hdf5 = new Hdf5();
    bool complete = true;
    auto bind = [&](auto& slot, const char* symbol) {
      void* found = dlsym(library, symbol);
      complete = complete && found != nullptr;
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(found);
    };
    bind(hdf5->open, "H5open");
    bind(hdf5->set_error_printing, "H5Eset_auto2");
    bind(hdf5->create_file, "H5Fcreate");
    bind(hdf5->flush_file, "H5Fflush");
    bind(hdf5->close_file, "H5Fclose");
    bind(hdf5->create_property_list, "H5Pcreate");
    bind(hdf5->set_create_intermediate_group, "H5Pset_create_intermediate_group");
    bind(hdf5->close_property_list, "H5Pclose");
    bind(hdf5->create_group, "H5Gcreate2");
    bind(hdf5->close_group, "H5Gclose");
    bind(hdf5->create_simple_space, "H5Screate_simple");
    bind(hdf5->create_space, "H5Screate");
    bind(hdf5->close_space, "H5Sclose");
    bind(hdf5->create_dataset, "H5Dcreate2");
    bind(hdf5->write_dataset, "H5Dwrite");
    bind(hdf5->close_dataset, "H5Dclose");
    bind(hdf5->link_create_class, "H5P_CLS_LINK_CREATE_ID_g");
    bind(hdf5->ieee_f32le, "H5T_IEEE_F32LE_g");
    bind(hdf5->native_float, "H5T_NATIVE_FLOAT_g");
    if (!complete || hdf5->open() < 0) {
      return absl::FailedPreconditionError(
          "the HDF5 library found lacks what exporting Keras' .weights.h5 calls: install "
          "Debian's libhdf5-103-1 (HDF5 1.10)");
    }
    hdf5->set_error_printing(kDefault, nullptr, nullptr);  // errors are returned, not printed
    return hdf5;
  }();
  return loaded;
}

// Closes an HDF5 handle when it goes out of scope.
class H5Handle {
 public:
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Handle() {
    if (id_ >= 0) close_(id_);
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

absl::Status H5Error(const std::string& path, const std::string& what) {
  return absl::FailedPreconditionError(
      absl::StrCat("the Keras weights file ", path, " could not be written (", what,
                   "): give an export folder on a disk with room that this process can write"));
}

// Writes the weights of `groups` into a new HDF5 file at `path`.
absl::Status WriteWeightsH5(const std::string& path, const std::vector<KerasWeightsGroup>& groups,
                            const std::vector<Tensor>& variables) {
  STRATUM_ASSIGN_OR_RETURN(const Hdf5* h5, LoadHdf5());
  H5Handle file(h5->create_file(path.c_str(), kTruncate, kDefault, kDefault), h5->close_file);
  if (!file.ok()) return H5Error(path, "cannot create the file");
  H5Handle intermediate(h5->create_property_list(*h5->link_create_class), h5->close_property_list);
  h5->set_create_intermediate_group(intermediate.get(), 1);
  H5Handle root_vars(h5->create_group(file.get(), "vars", intermediate.get(), kDefault, kDefault),
                     h5->close_group);
  if (!root_vars.ok()) return H5Error(path, "cannot create group /vars");
  for (const KerasWeightsGroup& group : groups) {
    const std::string vars_path = group.path + "/vars";
    H5Handle vars(
        h5->create_group(file.get(), vars_path.c_str(), intermediate.get(), kDefault, kDefault),
        h5->close_group);
    if (!vars.ok()) return H5Error(path, "cannot create group /" + vars_path);
    for (size_t i = 0; i < group.variables.size(); ++i) {
      const Tensor& value = variables[group.variables[i]];
      std::vector<hsize_t> dims;
      for (int64_t d : value.shape().dims()) dims.push_back(static_cast<hsize_t>(d));
      H5Handle space(dims.empty() ? h5->create_space(kScalarSpace)
                                  : h5->create_simple_space(static_cast<int>(dims.size()),
                                                            dims.data(), nullptr),
                     h5->close_space);
      const std::string name = std::to_string(i);
      H5Handle dataset(h5->create_dataset(vars.get(), name.c_str(), *h5->ieee_f32le, space.get(),
                                          kDefault, kDefault, kDefault),
                       h5->close_dataset);
      if (!space.ok() || !dataset.ok() ||
          h5->write_dataset(dataset.get(), *h5->native_float, kDefault, kDefault, kDefault,
                            value.data<float>()) < 0) {
        return H5Error(path, absl::StrCat("cannot write /", vars_path, "/", name));
      }
    }
  }
  if (h5->flush_file(file.get(), kGlobalScope) < 0) return H5Error(path, "cannot flush it");
  return absl::OkStatus();
}

}  // namespace

std::string KerasSnakeCase(const std::string& class_name) {
  // Keras: drop non-word characters; "(.)([A-Z][a-z]+)" -> "\1_\2"; then
  // "([a-z])([A-Z])" -> "\1_\2"; lower case.
  std::string word;
  for (char c : class_name) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') word += c;
  }
  std::string first;
  for (size_t i = 0; i < word.size(); ++i) {
    const bool starts_capitalized_word =
        i > 0 && std::isupper(static_cast<unsigned char>(word[i])) && i + 1 < word.size() &&
        std::islower(static_cast<unsigned char>(word[i + 1]));
    if (starts_capitalized_word) first += '_';
    first += word[i];
  }
  std::string out;
  for (size_t i = 0; i < first.size(); ++i) {
    if (i > 0 && std::isupper(static_cast<unsigned char>(first[i])) &&
        std::islower(static_cast<unsigned char>(first[i - 1]))) {
      out += '_';
    }
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(first[i])));
  }
  return out;
}

absl::StatusOr<std::vector<KerasWeightsGroup>> KerasWeightsLayout(const nlohmann::json& model_json,
                                                                  const Model& model) {
  const nlohmann::json json = Unwrapped(model_json);
  const std::string model_class = json.value("class_name", "");
  if (!json.contains("config") || !json["config"].contains("layers") ||
      !json["config"]["layers"].is_array()) {
    return absl::InvalidArgumentError(
        "the model JSON has no config.layers: export takes Keras' model.to_json() of a "
        "Sequential or functional model");
  }
  std::vector<KerasWeightsGroup> groups;
  std::map<std::string, int> per_class;
  std::vector<bool> placed(model.variables().size(), false);
  for (const nlohmann::json& layer : json["config"]["layers"]) {
    const std::string class_name = layer.value("class_name", "");
    if (class_name == "InputLayer" && model_class == "Sequential") continue;
    if (class_name == "Sequential" || class_name == "Functional" || class_name == "Model") {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model holds the model ", layer["config"].value("name", class_name),
          ", and exporting nested models is not supported: flatten it into one model"));
    }
    const std::string base = KerasSnakeCase(class_name);
    const int n = per_class[base]++;
    KerasWeightsGroup group{
        .path = absl::StrCat("layers/", base, n == 0 ? "" : absl::StrCat("_", n)), .variables = {}};
    const std::string prefix = layer["config"].value("name", "") + "/";
    for (size_t v = 0; v < model.variables().size(); ++v) {
      if (model.variables()[v].name.rfind(prefix, 0) == 0 && prefix.size() > 1) {
        group.variables.push_back(v);
        placed[v] = true;
      }
    }
    groups.push_back(std::move(group));
  }
  for (size_t v = 0; v < placed.size(); ++v) {
    if (!placed[v]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "variable ", model.variables()[v].name,
          " belongs to no layer of the model JSON's config.layers, so Keras could not load it: "
          "give every layer its name, as model.to_json() does"));
    }
  }
  return groups;
}

absl::Status WriteKerasWeightsFile(const nlohmann::json& model_json, const Model& model,
                                   const std::vector<Tensor>& variables, const std::string& path) {
  if (variables.size() != model.variables().size()) {
    return absl::InternalError(absl::StrCat(
        "export of ", variables.size(), " variables for a model of ", model.variables().size()));
  }
  STRATUM_ASSIGN_OR_RETURN(const std::vector<KerasWeightsGroup> groups,
                           KerasWeightsLayout(model_json, model));
  std::error_code error;
  if (const auto folder = std::filesystem::path(path).parent_path(); !folder.empty()) {
    std::filesystem::create_directories(folder, error);
    if (error) return H5Error(path, absl::StrCat("its folder cannot be made: ", error.message()));
  }
  const std::string temp = absl::StrCat(path, ".tmp-", getpid());
  if (absl::Status written = WriteWeightsH5(temp, groups, variables); !written.ok()) {
    std::filesystem::remove(temp, error);
    return written;
  }
  std::filesystem::rename(temp, path, error);
  if (error) return H5Error(path, error.message());
  return absl::OkStatus();
}

absl::Status ExportKerasModel(const nlohmann::json& model_json, const Model& model,
                              const std::vector<Tensor>& variables, const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat("the export folder ", dir,
                                                      " cannot be made (", error.message(),
                                                      "): give a folder this process can write"));
  }
  STRATUM_RETURN_IF_ERROR(
      WriteKerasWeightsFile(model_json, model, variables, dir + "/model.weights.h5"));
  TensorFile weights;
  for (size_t v = 0; v < variables.size(); ++v) {
    weights.tensors.emplace_back(model.variables()[v].name, variables[v]);
  }
  weights.metadata["format"] = "stratum-weights";
  const std::string safetensors = dir + "/model.safetensors";
  const std::string safetensors_temp = absl::StrCat(safetensors, ".tmp-", getpid());
  STRATUM_RETURN_IF_ERROR(WriteSafetensors(safetensors_temp, weights).status());
  std::filesystem::rename(safetensors_temp, safetensors, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot rename ", safetensors_temp, ": ", error.message()));
  }
  return WriteFileAtomically(dir + "/model.json", Unwrapped(model_json).dump() + "\n");
}

}  // namespace stratum

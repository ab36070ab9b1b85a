// Job files and the Keras JSON in them: any text is a job (or a model) or an error that
// names the problem, never a crash, a hang or an allocation the text did not earn.
#include <cstdint>
#include "absl/strings/string_view.h"

#include "stratum/job/job_spec.h"
#include "stratum/model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  // The whole job file, and the same text as a bare model (Keras' model.to_json()).
  (void)stratum::ParseJobSpec(text, "fuzz.json", "/nonexistent");
  (void)stratum::Model::FromKerasJson(absl::string_view(text));
  return 0;
}

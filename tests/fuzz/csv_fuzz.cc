// CSV files as make_csv_dataset reads them (header, inferred column types, quoted fields
// across lines): any bytes are rows of (features, label) or an error naming the file and
// line, never a crash.
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "fuzz_file.h"
#include "stratum/data/csv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = stratum::fuzz::WriteInput("input.csv", data, size);
  stratum::CsvOptions options;
  options.label_name = "label";
  absl::StatusOr<std::shared_ptr<const stratum::RecordFormat>> format =
      stratum::CsvFormat(path, options);
  (void)stratum::CountCsvRows(path, options);
  if (!format.ok()) return 0;
  absl::StatusOr<std::unique_ptr<stratum::ExampleReader>> reader = (*format)->Open(path);
  if (!reader.ok()) return 0;
  for (;;) {
    absl::StatusOr<std::optional<stratum::Element>> row = (*reader)->Next();
    if (!row.ok() || !row->has_value()) break;
  }
  return 0;
}

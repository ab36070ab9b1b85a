// Numbers as text other programs read back exactly.
#pragma once

#include <string>

namespace stratum {

// A double as Python's repr() writes it (CSVLogger's cells, Prometheus' samples): the
// shortest text that reads back as the same double ("0.1", "1e-05", "123.0", "nan", "inf").
std::string PythonFloat(double value);

}  // namespace stratum

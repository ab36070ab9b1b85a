#include "stratum/util/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace stratum {

absl::Status CheckLogLevel(const std::string& level) {
  // from_str maps anything it does not know to "off"; only "off" itself may mean that.
  if (spdlog::level::from_str(level) == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError("--log_level \"" + level +
                                      "\" is not a log level: use trace, debug, info, warn, "
                                      "error or off");
  }
  return absl::OkStatus();
}

absl::Status InitLogging(const std::string& task, const std::string& level) {
  if (absl::Status checked = CheckLogLevel(level); !checked.ok()) return checked;
  const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  auto logger = spdlog::stderr_logger_mt("stratum");
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %L " + task + "] %v");
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace stratum

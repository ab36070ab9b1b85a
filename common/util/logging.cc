#include "stratum/util/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace stratum {

absl::Status InitLogging(const std::string& task, const std::string& level) {
  spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  // from_str maps anything it does not know to "off"; only "off" itself may mean that.
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError("--log_level \"" + level +
                                      "\" is not a log level: use trace, debug, info, warn, "
                                      "error or off");
  }
  auto logger = spdlog::stderr_logger_mt("stratum");
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %L " + task + "] %v");
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace stratum

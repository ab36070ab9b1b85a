#include "stratum/util/json_text.h"

#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stratum/util/json_depth.h"

namespace stratum {

absl::StatusOr<nlohmann::json> ParseJsonText(absl::string_view text, absl::string_view what,
                                             absl::string_view where, absl::string_view fix) {
  using json = nlohmann::json;
  if (absl::Status deep = CheckJsonDepth(text, what, fix); !deep.ok()) return deep;
  struct Container {
    std::string name;  // "fit", "layers[]"
    bool array = false;
    std::set<std::string> keys;  // of an object
  };
  std::vector<Container> open;
  std::string last_key, repeated, repeated_in;
  auto check_keys = [&](int, json::parse_event_t event, json& parsed) {
    const bool in_array = !open.empty() && open.back().array;
    const std::string name = open.empty() ? ""
                             : in_array   ? absl::StrCat(open.back().name, "[]")
                                          : last_key;
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        open.push_back({name, event == json::parse_event_t::array_start, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        open.pop_back();
        break;
      case json::parse_event_t::key:
        last_key = parsed.get<std::string>();
        if (!open.back().keys.insert(last_key).second && repeated.empty()) {
          repeated = last_key;
          for (size_t i = 1; i < open.size(); ++i) {
            if (!open[i].array)
              absl::StrAppend(&repeated_in, repeated_in.empty() ? "" : ".", open[i].name);
          }
        }
        break;
      default:
        break;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(text.begin(), text.end(), check_keys);
  } catch (const json::parse_error& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid JSON (error at byte ", error.byte, "): ", fix));
  } catch (const json::exception& error) {  // out_of_range: a number such as 1e400
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds a number out of range (", error.what(), "): ", fix));
  }
  if (!repeated.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": key \"", repeated, "\" appears twice in ",
                     repeated_in.empty() ? "the top object" : absl::StrCat("\"", repeated_in, "\""),
                     " (JSON would keep the last silently): keep one"));
  }
  return root;
}

double JsonNumberOr(const nlohmann::json& object, const char* key, double missing) {
  const auto found = object.find(key);
  if (found == object.end()) return missing;
  if (found->is_null()) return std::numeric_limits<double>::quiet_NaN();
  return found->get<double>();
}

}  // namespace stratum

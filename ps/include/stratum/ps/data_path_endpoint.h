// What a parameter server announces of its raw data path through gRPC (DataPath): where
// a client connects and what it presents. The data path itself (its frames and sockets)
// is internal to ps/.
#pragma once

#include <cstdint>
#include <string>

namespace stratum {

struct DataPathEndpoint {
  int tcp_port = 0;       // 0: no data path
  std::string unix_name;  // abstract Unix socket for same-host clients; "" for none
  uint64_t token = 0;     // a client presents it in its hello
  uint64_t max_bytes = 0;
};

}  // namespace stratum

// Unix stream sockets in the abstract namespace: how two processes of one host talk
// without the TCP/IP stack (the parameter server's data path, the collectives' ring). An
// abstract name needs no file and vanishes with its socket, but answers only inside the
// network namespace that bound it, so a peer in another container (or on another host)
// gets NOT_FOUND and the caller falls back to TCP.
//
// Thread safety: free functions without shared state. The caller owns the fds returned.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <string>

#include "absl/status/statusor.h"

namespace stratum {

// Fills `address` with the abstract-namespace address of `name` (no leading NUL; cut to
// what sun_path holds) and returns the length to pass to bind() or connect().
socklen_t AbstractUnixAddress(const std::string& name, sockaddr_un* address);

// A blocking SOCK_STREAM socket (close-on-exec) listening on the abstract name `name`.
// UNAVAILABLE naming "@name" when it cannot be bound (the name is taken).
absl::StatusOr<int> ListenAbstractUnix(const std::string& name, int backlog = 64);

}  // namespace stratum

#!/usr/bin/env bash
# Set-up of the Prometheus test (prometheus_test): Debian's prometheus package, installed
# only when /usr/bin/prometheus is missing. Fails, saying why, when it cannot be had: the
# test must not pass without a real Prometheus.
#
#   tests/integration/install_prometheus.sh
set -euo pipefail

if [ -x /usr/bin/prometheus ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install_prometheus.sh: /usr/bin/prometheus is missing: install it (apt-get install prometheus)" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package starts no service here (no systemd), which is what the test wants: it runs its own.
[ -x /usr/bin/prometheus ] || { echo "install_prometheus.sh: prometheus did not install" >&2; exit 1; }

#!/usr/bin/env bash
# Set-up of a test that runs a real program from Debian's packages (prometheus_test:
# Prometheus; status_page_test: Chromium): installs PACKAGE when PROGRAM is missing. Fails,
# saying why, when it cannot be had: the test must not pass without the real thing.
#
#   tests/integration/install_package.sh PROGRAM PACKAGE
set -euo pipefail

program="${1:?usage: install_package.sh PROGRAM PACKAGE}"
package="${2:?usage: install_package.sh PROGRAM PACKAGE}"
if [ -x "$program" ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install_package.sh: $program is missing: install it (apt-get install $package)" >&2
  exit 1
fi
# The other test set-ups install packages too, and ctest runs them side by side: one
# apt-get at a time (the one before may have installed this package meanwhile).
exec 9>/tmp/stratum-test-apt.lock
flock -w 1200 9
[ -x "$program" ] && exit 0
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null
[ -x "$program" ] || { echo "install_package.sh: $package did not install $program" >&2; exit 1; }

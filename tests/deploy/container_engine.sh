#!/usr/bin/env bash
# The container tests' engine (CTest fixture container_engine):
#
#   tests/deploy/container_engine.sh start STATE_DIR   installs docker.io and debootstrap when
#       missing, and starts dockerd when no engine answers (its pid and log in STATE_DIR)
#   tests/deploy/container_engine.sh stop STATE_DIR    stops the dockerd that start started
#
# Where no engine can be had (not root, no apt-get, dockerd fails), start says why and exits
# 0, so the container tests skip saying so; under CI=true it fails instead.
set -euo pipefail

action="${1:?usage: container_engine.sh start|stop STATE_DIR}"
state="${2:?usage: container_engine.sh start|stop STATE_DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$state"

if [ "$action" = stop ]; then
  [ -f "$state/dockerd.pid" ] || exit 0
  pid="$(cat "$state/dockerd.pid")"
  rm -f "$state/dockerd.pid"
  kill "$pid" 2>/dev/null || exit 0
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.5; done
  echo "container_engine.sh: dockerd ($pid) did not stop in 30 s" >&2
  exit 1
fi

unavailable() {
  if [ "${CI:-}" = true ]; then
    echo "container_engine.sh: $*; CI=true needs the container tests" >&2
    exit 1
  fi
  echo "container_engine.sh: $*: the container tests will skip"
  exit 0
}

# debootstrap makes the base image (deploy/docker/build.sh).
bash "$here/../integration/install_package.sh" /usr/sbin/debootstrap debootstrap ||
  unavailable "debootstrap cannot be installed"
# docker-compose runs deploy/compose.yaml.
bash "$here/../integration/install_package.sh" /usr/bin/docker-compose docker-compose ||
  unavailable "docker-compose cannot be installed"
docker info >/dev/null 2>&1 && exit 0
bash "$here/../integration/install_package.sh" /usr/sbin/dockerd docker.io ||
  unavailable "docker.io cannot be installed"
[ "$(id -u)" = 0 ] || unavailable "no Docker engine answers, and only root can start dockerd"
dockerd >"$state/dockerd.log" 2>&1 &
echo $! >"$state/dockerd.pid"
for _ in $(seq 1 120); do
  docker info >/dev/null 2>&1 && { echo "container_engine.sh: started dockerd ($(cat "$state/dockerd.pid"))"; exit 0; }
  kill -0 "$(cat "$state/dockerd.pid")" 2>/dev/null || break
  sleep 0.5
done
tail -5 "$state/dockerd.log" >&2
unavailable "dockerd did not start (the end of its log is above; all of it: $state/dockerd.log)"

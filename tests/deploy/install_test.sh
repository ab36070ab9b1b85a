#!/usr/bin/env bash
# The library as a user outside this repository builds on it: `cmake --install` into a
# fresh prefix, then examples/custom_training_loop.cc built as an outside project twice,
# with find_package(Stratum CONFIG) and with pkg-config, and each run for one epoch.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
mkdir "$work/app"
cp "$source/examples/custom_training_loop.cc" "$work/app/"
cat >"$work/app/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(outside CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(Stratum CONFIG REQUIRED)
add_executable(custom_training_loop custom_training_loop.cc)
target_link_libraries(custom_training_loop PRIVATE Stratum::worker)
CMAKE
cmake -S "$work/app" -B "$work/app/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/app/build" >/dev/null
"$work/app/build/custom_training_loop" --epochs=1 | tee "$work/cmake.out"
grep -Eq "^epoch 1: train loss [0-9.]+, test accuracy 0\.[5-9]" "$work/cmake.out"
echo "install_test: built and ran with find_package(Stratum CONFIG)"

# lib/ or lib64/, as GNUInstallDirs chose.
PKG_CONFIG_PATH="$(dirname "$(find "$work/prefix" -name stratum.pc | head -1)")"
export PKG_CONFIG_PATH
# shellcheck disable=SC2046
g++ -O1 "$work/app/custom_training_loop.cc" $(pkg-config --cflags --libs stratum) \
  -o "$work/app/with_pkg_config"
"$work/app/with_pkg_config" --epochs=1 | tee "$work/pc.out"
grep -Eq "^epoch 1: train loss [0-9.]+, test accuracy 0\.[5-9]" "$work/pc.out"
echo "install_test: built and ran with pkg-config --cflags --libs stratum"

# A parameter-server program pair (a worker program's own closures, a coordinator program)
# builds against the package too, two compilers at once.
cp "$source/examples/ps_custom_loop.h" "$source/examples/ps_custom_loop_worker.cc" \
  "$source/examples/ps_custom_loop_coordinator.cc" "$work/app/"
pids=()
for program in ps_custom_loop_worker ps_custom_loop_coordinator; do
  # shellcheck disable=SC2046
  g++ -O0 "$work/app/$program.cc" $(pkg-config --cflags --libs stratum) -o "$work/app/$program" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
"$work/app/ps_custom_loop_worker" --help | grep -q "train_step_fn"
echo "install_test: the parameter-server custom loop's programs built with pkg-config"

# Wire internals stay out of the public headers.
for internal in stratum/ps/data_wire.h stratum/ps/data_memory.h stratum/ps/data_path.h \
  stratum/worker/collective/tcp_transport.h; do
  if [ -e "$work/prefix/include/$internal" ]; then
    echo "install_test: $internal is installed, but it is an internal of its component" >&2
    exit 1
  fi
done
echo "install_test: no wire internals among the installed headers"

# The installed binaries run from the prefix.
"$work/prefix/bin/stratum-launch" --dry-run --chief --workers 1 --ps 1 | grep -q "stratum-coordinator"
echo "install_test: the installed stratum-launch plans a cluster of the installed binaries"

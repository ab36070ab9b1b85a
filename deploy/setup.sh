#!/usr/bin/env bash
# Installs what Stratum needs from Debian 12's packages (only what is missing), then
# configures and builds it with CMake and Ninja, Release, into build/.
#
#   deploy/setup.sh                  install + build
#   deploy/setup.sh --no-install     build only
#   BUILD_DIR=out deploy/setup.sh    build somewhere else
#
# CUDA and NCCL are used when found (/usr/local/cuda); set STRATUM_WITH_CUDA=OFF to skip
# them, ON to require them. STRATUM_BUILD_TESTS=OFF builds only the binaries and examples
# (the container image does). Runs apt-get as root, or through sudo.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$repo/build}"
install=1
for arg in "$@"; do
  case "$arg" in
    --no-install) install=0 ;;
    -h|--help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

packages=(
  g++ cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev nlohmann-json3-dev libspdlog-dev libeigen3-dev zlib1g-dev libssl-dev
  libdnnl-dev  # oneDNN: the CPU convolutions
  libfarmhash-dev  # StringLookup's hashing of out-of-vocabulary tokens (linked statically)
  libgtest-dev libgmock-dev
  clang libclang-rt-14-dev  # libFuzzer and the sanitizers: the fuzz tests (tests/fuzz/)
  iproute2  # the tests' simulated hosts (network namespaces)
  python3-protobuf  # the tests' independent reading and writing of tf.Example files
  libhdf5-103-1  # HDF5, which --export loads to write Keras' .weights.h5
  python3-h5py  # the tests' independent reading of those exports
  dataset-fashion-mnist
)

if [ "$install" = 1 ]; then
  missing=()
  for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$package")
    fi
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup.sh: installing ${missing[*]}"
    sudo=""
    if [ "$(id -u)" != 0 ]; then
      command -v sudo >/dev/null || { echo "setup.sh: run as root or install sudo" >&2; exit 1; }
      sudo="sudo"
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
fi

cmake_args=(-S "$repo" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release)
[ -n "${STRATUM_WITH_CUDA:-}" ] && cmake_args+=("-DSTRATUM_WITH_CUDA=$STRATUM_WITH_CUDA")
[ -n "${STRATUM_BUILD_TESTS:-}" ] && cmake_args+=("-DSTRATUM_BUILD_TESTS=$STRATUM_BUILD_TESTS")
# CI builds with warnings as errors, so that none creeps in.
[ "${CI:-}" = "true" ] && cmake_args+=(-DSTRATUM_WERROR=ON)
cmake "${cmake_args[@]}" >/dev/null
cmake --build "$build_dir"
echo "setup.sh: built into $build_dir (binaries in $build_dir/bin)"

# The TFRecord example's data (examples/fashion_mnist_tfrecord.json): Fashion-MNIST as
# TFRecord shards of tf.Example, written once (about a second).
data_dir="$repo/examples/data/fashion-mnist"
if [ -x "$build_dir/bin/stratum-data" ] && [ ! -e "$data_dir/test-00001-of-00002.tfrecord.gz" ]; then
  mkdir -p "$data_dir"
  fmnist=/usr/share/datasets/fashion-mnist
  "$build_dir/bin/stratum-data" convert --images "$fmnist/train-images-idx3-ubyte.gz" \
    --labels "$fmnist/train-labels-idx1-ubyte.gz" --out "$data_dir/train" --shards 8 >/dev/null
  "$build_dir/bin/stratum-data" convert --images "$fmnist/t10k-images-idx3-ubyte.gz" \
    --labels "$fmnist/t10k-labels-idx1-ubyte.gz" --out "$data_dir/test" --shards 2 \
    --compression_type GZIP >/dev/null
  echo "setup.sh: wrote the TFRecord example's data into $data_dir"
fi
# The ParameterServerStrategy tutorial's data (examples/ps_tutorial.json).
if [ ! -e "$repo/examples/data/ps-tutorial/test.tfrecord" ]; then
  python3 "$repo/examples/ps_tutorial_data.py" --out "$repo/examples/data/ps-tutorial"
  echo "setup.sh: wrote the parameter-server tutorial's data into $repo/examples/data/ps-tutorial"
fi

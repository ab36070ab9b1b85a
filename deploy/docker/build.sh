#!/usr/bin/env bash
# Builds Stratum's container image offline, from this checkout:
#
#   deploy/docker/build.sh                        builds the binaries in the image's build stage
#   deploy/docker/build.sh --binaries build/bin   takes the binaries a Debian 12 host built from
#                                                 this checkout (what the container tests do)
#
# Options: --tag NAME:TAG (default stratum:<project version>, the manifests' image), --no-cache,
# --base-image NAME (default debian:12), --cuda (STRATUM_WITH_CUDA=ON; give a --base-image that
# has the CUDA Toolkit and NCCL in /usr/local/cuda).
#
# - The base image: when `debian:12` is not in the engine, it is made here with debootstrap
#   (minbase, bookworm, from the Debian mirror this machine's apt uses) and `docker import`,
#   since no image registry need be reachable.
# - The context: the checkout's files that git tracks or would track (no .git, no build
#   folders), in a temporary folder: the legacy builder reads no Dockerfile.dockerignore.
# - The legacy builder (DOCKER_BUILDKIT=0): BuildKit fetches its Dockerfile frontend, which an
#   offline engine cannot. `docker buildx build` works too where BuildKit has what it needs.
#
# Needs a running Docker engine (dockerd), git, and, to make the base image, debootstrap and root.
set -euo pipefail
# The whole script is read before it runs (a checkout changed during a build changes nothing).
{
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
version="$(sed -n 's/^project(stratum VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")"
tag="stratum:${version}"
base_image="debian:12"
binaries=""
with_cuda=OFF
cache=()

die() {
  echo "build.sh: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="${2:?--tag needs NAME:TAG}"; shift 2 ;;
    --base-image) base_image="${2:?--base-image needs an image}"; shift 2 ;;
    --binaries) binaries="${2:?--binaries needs the folder of the built binaries}"; shift 2 ;;
    --cuda) with_cuda=ON; shift ;;
    --no-cache) cache=(--no-cache); shift ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument \"$1\": see deploy/docker/build.sh --help" ;;
  esac
done

docker info >/dev/null 2>&1 ||
  die "no Docker engine answers (docker info failed): start one (as root: dockerd &) and run this again"

# The Debian mirror this machine's apt uses (deb822 or one-line sources).
debian_mirror() {
  local uri
  uri="$(awk '/^URIs:/ {u=$2} /^Suites:/ && / bookworm( |$)/ {print u; exit}' \
           /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
  [ -n "$uri" ] || uri="$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' \
                           /etc/apt/sources.list 2>/dev/null || true)"
  [ -n "$uri" ] || die "found no bookworm entry in /etc/apt/sources.list*: give --base-image an image you have"
  echo "$uri"
}

make_base_image() {
  command -v debootstrap >/dev/null ||
    die "$base_image is not in the engine and debootstrap is missing: apt-get install debootstrap"
  [ "$(id -u)" = 0 ] || die "$base_image is not in the engine, and making it with debootstrap needs root"
  local dir mirror
  mirror="$(debian_mirror)"
  dir="$(mktemp -d "${TMPDIR:-/tmp}/stratum-rootfs.XXXXXX")"
  echo "build.sh: making $base_image with debootstrap (minbase, bookworm) ..."
  if ! debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.log" 2>&1; then
    tail -20 "$dir.log" >&2
    rm -rf "$dir" "$dir.log"
    die "debootstrap failed (its log is above)"
  fi
  # As Debian's own images: no package cache, no package lists (apt-get update fetches them).
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/cache/apt/*.bin "$dir"/var/lib/apt/lists/*
  tar -C "$dir" -c . | docker import - "$base_image" >/dev/null
  rm -rf "$dir" "$dir.log"
}

if ! docker image inspect "$base_image" >/dev/null 2>&1; then
  [ "$base_image" = "debian:12" ] || die "the base image $base_image is not in the engine: load it first"
  make_base_image
fi

context="$(mktemp -d "${TMPDIR:-/tmp}/stratum-image-context.XXXXXX")"
trap 'rm -rf "$context"' EXIT
# Every file git tracks or would track that exists (a deleted one is left out).
git -C "$root" ls-files -z --cached --others --exclude-standard |
  (cd "$root" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
  tar -C "$root" --null -T - -c | tar -C "$context" -x
if [ -n "$binaries" ]; then
  [ -x "$binaries/stratum-worker" ] ||
    die "--binaries $binaries holds no stratum-worker: build first (deploy/setup.sh)"
  mkdir -p "$context/prebuilt/bin"
  # The binaries the image holds (the Dockerfile's runtime stage lists them).
  for binary in $(grep -o '/src/build/bin/[a-z_-]*' "$root/deploy/docker/Dockerfile" |
                  sed 's|.*/||' | sort -u); do
    [ -x "$binaries/$binary" ] || die "--binaries $binaries has no $binary: build it first"
    cp "$binaries/$binary" "$context/prebuilt/bin/"
  done
fi

start=$(date +%s)
if ! DOCKER_BUILDKIT=0 docker build "${cache[@]}" -f "$context/deploy/docker/Dockerfile" \
       --build-arg "BASE_IMAGE=$base_image" --build-arg "STRATUM_WITH_CUDA=$with_cuda" \
       -t "$tag" "$context" >"$context.log" 2>&1; then
  tail -30 "$context.log" >&2
  die "docker build failed (the end of its output is above; all of it: $context.log)"
fi
rm -f "$context.log"
seconds=$(($(date +%s) - start))
size=$(docker image inspect --format '{{.Size}}' "$tag")
echo "build.sh: built $tag in ${seconds} s ($((size / 1048576)) MiB)"
exit
}

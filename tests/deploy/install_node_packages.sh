#!/usr/bin/env bash
# Set-up of the manifest test (k8s_manifests_test.js): Node.js and npm (from Debian, only
# when missing) and the npm packages it validates and parses with (kubernetes-models: the
# Kubernetes API's schemas; yaml), installed into DIR/node_modules (in the build tree, so
# outside git). Quick when they are already there. Fails, saying why, when they cannot be
# had: the test must not pass without them.
#
#   tests/deploy/install_node_packages.sh DIR
set -euo pipefail

dir="${1:?usage: install_node_packages.sh DIR}"
packages=(kubernetes-models@4.5.1 yaml@2.9.1)

installed() {
  local spec name version
  for spec in "${packages[@]}"; do
    name="${spec%@*}"
    version="${spec##*@}"
    [ -f "$dir/node_modules/$name/package.json" ] || return 1
    grep -q "\"version\": \"$version\"" "$dir/node_modules/$name/package.json" || return 1
  done
}

missing=()
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "install_node_packages.sh: ${missing[*]} missing: install them (apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "install_node_packages.sh: installing ${missing[*]} from Debian"
  # The other test set-ups install packages too, and ctest runs them side by side: one
  # apt-get at a time.
  exec 9>/tmp/stratum-test-apt.lock
  flock -w 1200 9
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if installed; then
  echo "install_node_packages.sh: ${packages[*]} already in $dir/node_modules"
  exit 0
fi
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"name": "stratum-manifest-test", "private": true}' >"$dir/package.json"
echo "install_node_packages.sh: npm install ${packages[*]} into $dir"
if ! npm install --prefix "$dir" --no-audit --no-fund --no-package-lock --no-save \
     --loglevel=error "${packages[@]}"; then
  echo "install_node_packages.sh: npm could not install ${packages[*]}: is npm's registry reachable" \
       "(npm config get registry)? The manifest test cannot run without them." >&2
  exit 1
fi
installed || { echo "install_node_packages.sh: ${packages[*]} are still not in $dir/node_modules" >&2; exit 1; }

#!/usr/bin/env bash
# Installs every build/test dependency of dynapipe from Debian 12 packages.
# The single source of package names; safe to run again (installs only what is missing).
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libtorch-dev libopenblas0-openmp libgloo-dev libfmt-dev   # runtime/: LibTorch + c10d (Gloo)
  libjemalloc-dev                                            # the dynapipe binary's allocator
  nlohmann-json3-dev libcli11-dev libspdlog-dev zlib1g-dev   # planner core
  libhiredis-dev redis-server                                # Redis plan store + its test
  libgtest-dev libgmock-dev libbenchmark-dev                 # tests and bench/
  clang libclang-rt-14-dev                                   # fuzz targets (ctest label fuzz)
  python3-torch python3-pybind11 pybind11-dev                # reference checks, bindings
  python3-dev python3-pytest                                 # the dynapipe Python module and its tests
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"

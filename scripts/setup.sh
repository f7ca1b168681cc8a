#!/usr/bin/env bash
# Installs the build dependencies that are missing, with apt-get (Debian 12 / Ubuntu 24.04).
# Prints what it installs; does nothing when everything is present.
set -euo pipefail

packages=(cmake ninja-build g++ libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
          libopenblas-dev pkg-config pybind11-dev python3-dev python3-numpy python3-pytest
          libcpp-httplib-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all build dependencies are installed"
  exit 0
fi

echo "setup: installing missing packages with apt-get: ${missing[*]}"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    echo "setup: not root and no sudo; install these packages first: ${missing[*]}" >&2
    exit 1
  fi
  sudo=(sudo)
fi
"${sudo[@]}" apt-get update
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"

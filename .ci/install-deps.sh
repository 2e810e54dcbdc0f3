#!/usr/bin/env bash
# Installs what building and testing walgate needs, from Debian 12 packages only. Installs just
# the packages that are missing; needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  g++ cmake ninja-build ccache pkg-config
  libboost1.81-dev libboost-system1.81-dev libboost-json1.81-dev libboost-url1.81-dev
  libssl-dev openssl zlib1g-dev libpq-dev libicu-dev doctest-dev libcli11-dev libtomlplusplus-dev
  postgresql-15 postgresql-15-wal2json
  libnats-dev nats-server
  nodejs npm
)
if [ "${WALGATE_WITH_BROWSER:-1}" = 1 ]; then
  packages+=(chromium)
fi
if [ "${WALGATE_WITH_FUZZ:-1}" = 1 ]; then
  packages+=(clang-19 libclang-rt-19-dev)
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
# nodejs may come from elsewhere than Debian; a working node and npm are enough.
if command -v node >/dev/null && command -v npm >/dev/null; then
  filtered=()
  for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's postgresql package starts a cluster on 5432; the tests never use it.

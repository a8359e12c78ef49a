# shellcheck shell=bash
# Shared by scripts/install-criu.sh and scripts/install-crun.sh, which build a program from
# Debian's own source package: sourced, after each sets `me` (its name) and `log` (a file).
# shellcheck disable=SC2154 # me and log are the sourcing script's

# quiet WHAT CMD...: runs CMD with its output in $log; on failure says WHAT failed, shows the
# tail of that output and exits.
quiet() {
  local what=$1
  shift
  if ! "$@" >>"$log" 2>&1; then
    echo "$me: $what failed:" >&2
    tail -n 25 "$log" | sed 's/^/  /' >&2
    exit 1
  fi
}

# install_missing WHAT PKG...: installs those of the bookworm packages PKG that are missing,
# with the system's apt (WHAT names them in an error).
install_missing() {
  local what=$1 p
  shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  quiet "apt-get update" apt-get -q update
  quiet "installing $what (${missing[*]})" \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
}

# private_apt DIR MIRROR KEYRING SUITE...: a private apt configuration in DIR (its own sources
# list naming only the deb-src lines of SUITEs, its own lists and an empty dpkg status), updated;
# sets the array apt_opts, which every apt-get and apt-cache call of it takes. apt then checks a
# source package against its suite's signed Sources index, and nothing is installed from it.
private_apt() {
  local dir=$1 mirror=$2 keyring=$3 s
  shift 3
  mkdir -p "$dir"/{etc/sources.list.d,etc/preferences.d,lists/partial,cache/archives/partial}
  : >"$dir/status"
  for s in "$@"; do
    echo "deb-src [signed-by=$keyring] $mirror $s main"
  done >"$dir/etc/sources.list"
  # Command-line options win over anything in /etc/apt/apt.conf.d (proxies there still apply).
  apt_opts=(
    -o "Dir::Etc::SourceList=$dir/etc/sources.list"
    -o "Dir::Etc::SourceParts=$dir/etc/sources.list.d"
    -o "Dir::Etc::Preferences=$dir/etc/preferences"
    -o "Dir::Etc::PreferencesParts=$dir/etc/preferences.d"
    -o "Dir::State::Lists=$dir/lists"
    -o "Dir::State::status=$dir/status"
    -o "Dir::Cache=$dir/cache"
    -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
    -o "APT::Architecture=amd64" -o "APT::Architectures=amd64"
    -o "Acquire::Languages=none"
  )
  chown -R _apt "$dir/lists/partial" "$dir/cache/archives/partial" 2>/dev/null || :
  quiet "apt-get update of the private Debian $* source lists ($mirror)" \
    apt-get "${apt_opts[@]}" -q update
}

# Shared by scripts/container/*.sh (sourced): the container cache and installing Debian packages.

# The cache kept between runs: the engine's data root (and so the base image in it) and the base
# image's tarball. Outside the checkout, so a fresh clone (CI) finds it.
CACHE=${S3BATCH_CONTAINER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/s3batch-container}

# apt_install PACKAGE...: with apt-get, as root; exit status 3 (with the reason) where it cannot be.
# apt's output goes to $CACHE/apt.log, shown only when the install fails.
apt_install() {
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "$* missing, and it cannot be installed here (needs root and apt-get)" >&2
        return 3
    fi
    mkdir -p "$CACHE"
    echo "installing $* with apt-get" >&2
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"; } \
        >"$CACHE/apt.log" 2>&1; then
        tail -n 20 "$CACHE/apt.log" >&2
        echo "apt-get install $* failed (log: $CACHE/apt.log)" >&2
        return 1
    fi
}

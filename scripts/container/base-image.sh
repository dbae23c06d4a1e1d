#!/usr/bin/env bash
# The base image of the container test: Debian 12 (bookworm) minbase with python3, python3-venv,
# ca-certificates and passwd (useradd), made with mmdebstrap from this machine's configured Debian
# mirror (read from /etc/apt/sources.list* at run time) and `docker import`ed. No registry needed.
#
# Prints the image's name. Built once: the name carries a hash of this recipe (this file and the
# CA bundle copied in), the image stays in the engine's storage, and its tarball is kept in the
# container cache ($S3BATCH_CONTAINER_CACHE, default ~/.cache/s3batch-container) for an engine
# whose storage was wiped. Needs DOCKER_HOST (scripts/container/engine.sh start).
#
# The CA bundle: where this machine reaches the package index through a TLS proxy that it trusts,
# pip inside the build needs the same trust, so $SSL_CERT_FILE (default: Debian's bundle) replaces
# the image's bundle and PIP_CERT points pip at it.
set -euo pipefail

# shellcheck source=scripts/container/lib.sh
. "$(dirname "$0")/lib.sh"
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates,passwd
BUNDLE=/etc/ssl/certs/ca-certificates.crt
CA_FILE=${SSL_CERT_FILE:-$BUNDLE}

key=$( { cat "$0"; cat "$CA_FILE"; } | sha256sum | cut -c1-12)
IMAGE=s3batch-base:$SUITE-$key
TARBALL=$CACHE/base-$SUITE-$key.tar

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base image $IMAGE: cached in the engine" >&2
    echo "$IMAGE"
    exit 0
fi

import() {
    docker import \
        --change "ENV PIP_CERT=$BUNDLE" \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        "$TARBALL" "$IMAGE" >/dev/null
}

if [ -f "$TARBALL" ]; then
    echo "base image $IMAGE: imported from the cached $TARBALL" >&2
    import
    echo "$IMAGE"
    exit 0
fi

command -v mmdebstrap >/dev/null 2>&1 || apt_install mmdebstrap

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# This machine's Debian mirrors, as apt is configured here: the first deb URI of a stanza (or line)
# for the main archive and for the security archive, used for bookworm whatever the host runs.
python3 - "$SUITE" >"$work/debian.sources" <<'PY'
import glob, re, sys

suite = sys.argv[1]
main = security = None
for path in sorted(glob.glob("/etc/apt/sources.list") + glob.glob("/etc/apt/sources.list.d/*.list")
                   + glob.glob("/etc/apt/sources.list.d/*.sources")):
    text = open(path).read()
    entries = []
    if path.endswith(".sources"):
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.M))
            if "deb" in fields.get("Types", "").split() and fields.get("Enabled", "yes") != "no":
                entries += [(uri, fields.get("Suites", "")) for uri in fields.get("URIs", "").split()]
    else:
        for line in text.splitlines():
            m = re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
            if m:
                entries.append(m.groups())
    for uri, suites in entries:
        if not re.search(r"/debian(-security)?/?$", uri):
            continue  # a third-party repository
        if "-security" in suites or uri.rstrip("/").endswith("-security"):
            security = security or uri
        else:
            main = main or uri
if not main:
    sys.exit("no Debian mirror in /etc/apt/sources.list*: configure apt, or set S3BATCH_BASE_IMAGE")
key = "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
print(f"Types: deb\nURIs: {main}\nSuites: {suite} {suite}-updates\nComponents: main\n{key}\n")
if security:
    print(f"Types: deb\nURIs: {security}\nSuites: {suite}-security\nComponents: main\n{key}")
PY

echo "building base image $IMAGE with mmdebstrap ($SUITE minbase: $PACKAGES)" >&2
started=$(date +%s)
mkdir -p "$CACHE"
mmdebstrap --variant=minbase --include="$PACKAGES" --quiet \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook="upload $CA_FILE $BUNDLE" \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
    "$SUITE" "$work/root.tar" "$work/debian.sources" >&2
mv "$work/root.tar" "$TARBALL"
import
# Bases of older recipes are never used again.
for old in "$CACHE"/base-*.tar; do [ "$old" = "$TARBALL" ] || rm -f "$old"; done
for old in $(docker images --format '{{.Repository}}:{{.Tag}}' s3batch-base); do
    [ "$old" = "$IMAGE" ] || docker rmi "$old" >/dev/null 2>&1 || true
done
echo "base image $IMAGE built in $(( $(date +%s) - started )) s ($(du -m "$TARBALL" | cut -f1) MB tarball)" >&2
echo "$IMAGE"

#!/usr/bin/env bash
# Make a local base image for building Kelvin's image without a container registry:
# Debian bookworm (its python3 is 3.11, as python:3.11-slim-bookworm) from Debian's own
# package mirror with debootstrap, imported into podman's image store.
#
#   scripts/image-base.sh [NAME]     # default localhost/kelvin-base:bookworm; a no-op if present
#   podman build --runtime runc --build-arg PYTHON_IMAGE=localhost/kelvin-base:bookworm .
#
# Needs root, debootstrap and podman; takes a few minutes the first time (~150 MB).
set -euo pipefail
name="${1:-localhost/kelvin-base:bookworm}"
podman="podman --runtime runc"
if $podman image exists "$name"; then
  exit 0
fi
command -v debootstrap >/dev/null || { echo "image-base: debootstrap is not installed" >&2; exit 1; }
mirror="${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}"
mirror="${mirror:-http://deb.debian.org/debian}"
root="$(mktemp -d "${TMPDIR:-/tmp}/kelvin-base.XXXXXX")"
trap 'rm -rf "$root"' EXIT
echo "image-base: debootstrap bookworm from $mirror into $root" >&2
# python3-venv: the build stage makes a virtualenv; ca-certificates: pip reaches PyPI over TLS.
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
# Trust what this machine trusts: a site CA of an intercepting proxy (in
# /usr/local/share/ca-certificates) must reach the base, or pip cannot reach PyPI.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null
fi
# The same layout as the python image: `python` on PATH, no apt lists or caches.
ln -sf python3 "$root/usr/bin/python"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | $podman import --change 'CMD ["/bin/bash"]' - "$name" >/dev/null
echo "image-base: $name ready" >&2

#!/usr/bin/env bash
# Build the LeaderWorkerSet controller manager (sigs.k8s.io/lws, the release tools/testbed/lws/go.mod pins) from
# its Go module, and copy its CRD (config/crd/bases of the same module), for tests/apiserver's LeaderWorkerSet
# fixture (e2e/testbed/lws.py): the real controller turns the operator's LeaderWorkerSets into leader and
# worker pods against the test bed's API server.
#
# Only the Go module proxy is needed. The machine's Go builds it (GOTOOLCHAIN=local: no toolchain download).
#
# Output:  $CACHE/lws-$VERSION/bin/lws-manager
#          $CACHE/lws-$VERSION/crd/leaderworkerset.x-k8s.io_leaderworkersets.yaml
#          $CACHE/lws-$VERSION/.built   (marker, written last; names the go.mod/go.sum/script digest)
# where CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}. Go's module and build caches are the ones
# tools/kube-build.sh uses ($CACHE/go-mod, $CACHE/go-build).
#
# Idempotent: exits at once when the marker matches. Concurrent callers are serialised with flock.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC=$HERE/testbed/lws
VERSION=$(awk '($1 == "require" && $2 == "sigs.k8s.io/lws") || $1 == "sigs.k8s.io/lws" {
  v = ($1 == "require") ? $3 : $2; sub(/^v/, "", v); print v; exit}' "$SRC/go.mod")
[[ -n $VERSION ]] || { echo "lws-build: cannot read the pinned sigs.k8s.io/lws version" >&2; exit 1; }

CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}
OUT=$CACHE/lws-$VERSION
MARKER=$OUT/.built
CRD=leaderworkerset.x-k8s.io_leaderworkersets.yaml
DIGEST=$(cat "$SRC"/go.mod "$SRC"/go.sum "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)

built() { [[ -x $OUT/bin/lws-manager && -f $OUT/crd/$CRD && -f $MARKER && $(cat "$MARKER") == "$DIGEST" ]]; }

built && exit 0

mkdir -p "$CACHE"
exec 9>"$CACHE/.lws-build.lock"
echo "lws-build: waiting for lock $CACHE/.lws-build.lock" >&2
flock 9
if built; then
  echo "lws-build: already built by another caller" >&2
  exit 0
fi

T0=$SECONDS
export GOMODCACHE=$CACHE/go-mod
export GOCACHE=$CACHE/go-build
export GOFLAGS=-mod=readonly
export GOTOOLCHAIN=local
export CGO_ENABLED=0
mkdir -p "$GOMODCACHE" "$GOCACHE"
go version >&2

echo "lws-build: go build: sigs.k8s.io/lws/cmd v$VERSION" >&2
rm -rf "$OUT/bin.tmp" "$OUT/crd.tmp"
mkdir -p "$OUT/bin.tmp" "$OUT/crd.tmp"
(cd "$SRC" && go build -trimpath -ldflags "-s -w" -o "$OUT/bin.tmp/lws-manager" sigs.k8s.io/lws/cmd)
MODDIR=$(cd "$SRC" && go list -m -f '{{.Dir}}' sigs.k8s.io/lws)
cp "$MODDIR/config/crd/bases/$CRD" "$OUT/crd.tmp/$CRD"
chmod 0644 "$OUT/crd.tmp/$CRD"

rm -rf "$OUT/bin" "$OUT/crd"
mv "$OUT/bin.tmp" "$OUT/bin"
mv "$OUT/crd.tmp" "$OUT/crd"
echo "$DIGEST" >"$MARKER"
echo "lws-build: done: $OUT/bin/lws-manager ($(du -sh "$OUT/bin" | cut -f1)), $((SECONDS - T0))s" >&2

#!/usr/bin/env bash
# Build the Gateway API Inference Extension's endpoint picker (sigs.k8s.io/gateway-api-inference-extension
# cmd/epp, the release tools/testbed/epp/go.mod pins) for the routing tests (e2e/testbed/epp.py), and copy the
# extension's CRDs (config/crd/bases of the same module: InferencePool, InferenceObjective, ...) and the envoy
# test bed's gateway (tools/testbed/epp/gateway: a client of the picker's real ext_proc gRPC interface that
# forwards HTTP to the endpoint it picks, since no gateway data plane can be installed here) beside it.
#
# Only the Go module proxy is needed. The machine's Go builds it (GOTOOLCHAIN=local: no toolchain download).
#
# Output:  $CACHE/epp-$VERSION/bin/epp
#          $CACHE/epp-$VERSION/bin/gateway
#          $CACHE/epp-$VERSION/crds/*.yaml           (the extension's)
#          $CACHE/epp-$VERSION/gateway-crds/*.yaml   (the Gateway API's standard channel, at the version the
#                                                      extension's go.mod requires: HTTPRoute, Gateway, ...)
#          $CACHE/epp-$VERSION/.built   (marker, written last; names the go.mod/go.sum/script digest)
# where CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}. Go's module and build caches are the ones
# tools/kube-build.sh uses ($CACHE/go-mod, $CACHE/go-build): client-go and apimachinery are shared.
#
# Idempotent: exits at once when the marker matches. Concurrent callers are serialised with flock.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC=$HERE/testbed/epp
MODULE=sigs.k8s.io/gateway-api-inference-extension
VERSION=$(awk -v m="$MODULE" '($1 == "require" && $2 == m) || $1 == m {
  v = ($1 == "require") ? $3 : $2; sub(/^v/, "", v); print v; exit}' "$SRC/go.mod")
[[ -n $VERSION ]] || { echo "epp-build: cannot read the pinned $MODULE version" >&2; exit 1; }

CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}
OUT=$CACHE/epp-$VERSION
MARKER=$OUT/.built
DIGEST=$(cat "$SRC"/go.mod "$SRC"/go.sum "$SRC"/tools.go "$SRC"/gateway/main.go "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)

built() { [[ -x $OUT/bin/epp && -x $OUT/bin/gateway && -d $OUT/crds && -d $OUT/gateway-crds && -f $MARKER && $(cat "$MARKER") == "$DIGEST" ]]; }

built && exit 0

mkdir -p "$CACHE"
exec 9>"$CACHE/.epp-build.lock"
echo "epp-build: waiting for lock $CACHE/.epp-build.lock" >&2
flock 9
if built; then
  echo "epp-build: already built by another caller" >&2
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

echo "epp-build: go build: $MODULE/cmd/epp v$VERSION" >&2
rm -rf "$OUT/bin.tmp" "$OUT/crds.tmp" "$OUT/gateway-crds.tmp"
mkdir -p "$OUT/bin.tmp" "$OUT/crds.tmp" "$OUT/gateway-crds.tmp"
(cd "$SRC" && go build -trimpath -ldflags "-s -w" -o "$OUT/bin.tmp/epp" "$MODULE/cmd/epp")
echo "epp-build: go build: the test bed's gateway (ext_proc client)" >&2
(cd "$SRC" && go build -trimpath -ldflags "-s -w" -o "$OUT/bin.tmp/gateway" ./gateway)
MODDIR=$(cd "$SRC" && go list -m -f '{{.Dir}}' "$MODULE")
cp "$MODDIR"/config/crd/bases/*.yaml "$OUT/crds.tmp/"
GWDIR=$(cd "$SRC" && go mod download -json sigs.k8s.io/gateway-api | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[[ -n $GWDIR ]] || { echo "epp-build: cannot download sigs.k8s.io/gateway-api" >&2; exit 1; }
cp "$GWDIR"/config/crd/standard/*.yaml "$OUT/gateway-crds.tmp/"
chmod -R u+w "$OUT/crds.tmp" "$OUT/gateway-crds.tmp"

rm -rf "$OUT/bin" "$OUT/crds" "$OUT/gateway-crds"
mv "$OUT/bin.tmp" "$OUT/bin"
mv "$OUT/crds.tmp" "$OUT/crds"
mv "$OUT/gateway-crds.tmp" "$OUT/gateway-crds"
echo "$DIGEST" >"$MARKER"
echo "epp-build: done: $OUT/bin/epp ($(du -sh "$OUT/bin" | cut -f1)), $((SECONDS - T0))s" >&2

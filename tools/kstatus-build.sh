#!/usr/bin/env bash
# Build kstatus as Flux, kpt and the cli-utils applier run it: tools/testbed/kstatus/main.go calls
# sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute at the release tools/testbed/kstatus/go.mod pins, for
# tests/artefacts/test_kstatus.py (through e2e/testbed/kstatus.py).
#
# Only the Go module proxy is needed. The machine's Go builds it (GOTOOLCHAIN=local: no toolchain download).
#
# Output:  $CACHE/kstatus-$CLI_UTILS_VERSION/bin/kstatus
#          $CACHE/kstatus-$CLI_UTILS_VERSION/.built   (marker, written last; names the go.mod/go.sum/script digest)
# where CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}. Go's module and build caches are the ones
# tools/kube-build.sh uses ($CACHE/go-mod, $CACHE/go-build): k8s.io/apimachinery is shared.
#
# Idempotent: exits at once when the marker matches. Concurrent callers are serialised with flock.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC=$HERE/testbed/kstatus
VERSION=$(awk '($1 == "require" && $2 == "sigs.k8s.io/cli-utils") || $1 == "sigs.k8s.io/cli-utils" {
  v = ($1 == "require") ? $3 : $2; sub(/^v/, "", v); print v; exit}' "$SRC/go.mod")
[[ -n $VERSION ]] || { echo "kstatus-build: cannot read the pinned sigs.k8s.io/cli-utils version" >&2; exit 1; }

CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}
OUT=$CACHE/kstatus-$VERSION
MARKER=$OUT/.built
DIGEST=$(cat "$SRC"/go.mod "$SRC"/go.sum "$SRC"/main.go "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)

built() { [[ -x $OUT/bin/kstatus && -f $MARKER && $(cat "$MARKER") == "$DIGEST" ]]; }

built && exit 0

mkdir -p "$CACHE"
exec 9>"$CACHE/.kstatus-build.lock"
echo "kstatus-build: waiting for lock $CACHE/.kstatus-build.lock" >&2
flock 9
if built; then
  echo "kstatus-build: already built by another caller" >&2
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

echo "kstatus-build: go build: kstatus of sigs.k8s.io/cli-utils v$VERSION" >&2
rm -rf "$OUT/bin.tmp"
mkdir -p "$OUT/bin.tmp"
(cd "$SRC" && go build -trimpath -ldflags "-s -w" -o "$OUT/bin.tmp/kstatus" .)
got=$("$OUT/bin.tmp/kstatus" -version)
[[ $got == "v$VERSION" ]] || { echo "kstatus-build: built with cli-utils $got, go.mod pins v$VERSION" >&2; exit 1; }

rm -rf "$OUT/bin"
mv "$OUT/bin.tmp" "$OUT/bin"
echo "$DIGEST" >"$MARKER"
echo "kstatus-build: done: $OUT/bin/kstatus ($(du -sh "$OUT/bin" | cut -f1)), $((SECONDS - T0))s" >&2

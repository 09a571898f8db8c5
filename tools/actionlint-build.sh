#!/usr/bin/env bash
# Build actionlint, the GitHub Actions workflow linter, from its Go module at the version pinned in
# tools/testbed/actionlint/go.mod (a `tool` directive; go.sum holds every module's checksum). The release
# workflow (.github/workflows/release.yaml) cannot run here; tests/artefacts/test_release_workflow.py lints it with this.
#
# Only the Go module proxy is needed, as for tools/kube-build.sh, whose conventions this follows (and
# tools/kstatus-build.sh's GOTOOLCHAIN=local: no toolchain download).
#
# Output:  $CACHE/actionlint-$VERSION/bin/actionlint
#          $CACHE/actionlint-$VERSION/.built   (marker, written last; names the go.mod/go.sum digest)
# where CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}; Go's module and build caches are the test
# bed's ($CACHE/go-mod, $CACHE/go-build). Prints the binary's path on stdout.
#
# Idempotent: exits at once when the marker matches the pinned module. Concurrent callers are serialised
# with flock, so only one of them builds.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODULE=$HERE/testbed/actionlint
VERSION=$(awk '$1 == "github.com/rhysd/actionlint" {sub(/^v/, "", $2); print $2; exit}' "$MODULE/go.mod")
[[ -n $VERSION ]] || { echo "actionlint-build: cannot read the pinned version from $MODULE/go.mod" >&2; exit 1; }

CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}
OUT=$CACHE/actionlint-$VERSION
MARKER=$OUT/.built
DIGEST=$(cat "$MODULE/go.mod" "$MODULE/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)

built() { [[ -x $OUT/bin/actionlint && -f $MARKER && $(cat "$MARKER") == "$DIGEST" ]]; }

if built; then
  echo "$OUT/bin/actionlint"
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.actionlint-build.lock"
echo "actionlint-build: waiting for lock $CACHE/.actionlint-build.lock" >&2
flock 9
if built; then
  echo "actionlint-build: already built by another caller" >&2
  echo "$OUT/bin/actionlint"
  exit 0
fi

T0=$SECONDS
export GOMODCACHE=$CACHE/go-mod
export GOCACHE=$CACHE/go-build
export GOFLAGS=-mod=readonly
export GOTOOLCHAIN=local  # the machine's Go; a go.mod asking for a newer one fails instead of downloading
export CGO_ENABLED=0
mkdir -p "$GOMODCACHE" "$GOCACHE"
go version >&2

rm -rf "$OUT/bin.tmp"
mkdir -p "$OUT/bin.tmp"
# Built as a dependency, actionlint cannot read its own version from the build info: stamp it as its
# release builds do.
(cd "$MODULE" && go build -trimpath -ldflags "-s -w -X github.com/rhysd/actionlint.version=v$VERSION" \
  -o "$OUT/bin.tmp/actionlint" github.com/rhysd/actionlint/cmd/actionlint)
"$OUT/bin.tmp/actionlint" -version >&2

rm -rf "${OUT:?}/bin"
mv "$OUT/bin.tmp" "$OUT/bin"
echo "$DIGEST" >"$MARKER"
echo "actionlint-build: done: $OUT/bin ($(du -sh "$OUT/bin" | cut -f1)), total $((SECONDS - T0))s" >&2
echo "$OUT/bin/actionlint"

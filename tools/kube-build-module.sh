#!/usr/bin/env bash
# Build another pinned control plane of the test bed from Go modules: kube-apiserver, kube-controller-manager and
# kubectl of the Kubernetes release pinned in tools/testbed/<module>/go.mod (k8s.io/kubernetes, staging modules
# pinned with replace directives), and etcd of the release pinned in tools/testbed/etcd/go.mod.
#
# Usage: tools/kube-build-module.sh kube-1.30   (the oldest claimed minor, the README's minimum; docs/testing.md)
#
# tools/kube-build.sh builds tools/testbed/kube (the newest) the same way. It is kept as it was, not made a caller
# of this script, because its marker is a digest of its own text: changing it would rebuild the newest control
# plane in the shared cache for every checkout, back and forth between checkouts with the old and the new text.
#
# Only the Go module proxy is needed (no Docker, no release downloads). The machine's Go builds it; a
# go.mod that asks for a newer Go needs GOTOOLCHAIN exported before this runs (see the README).
#
# Output:  $CACHE/kube-$KUBE_VERSION/bin/{kube-apiserver,kube-controller-manager,kubectl,etcd}
#          $CACHE/kube-$KUBE_VERSION/.built   (marker, written last; names the go.mod/go.sum digest)
# where CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}. Go's module and build caches live under
# $CACHE/go-mod and $CACHE/go-build, so a rebuild after a version bump reuses what did not change.
#
# Idempotent: exits at once when the marker matches the pinned modules. Concurrent callers are serialised
# with flock, so only one of them builds.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TESTBED=$HERE/testbed
MODULE=${1:?usage: kube-build-module.sh <module of tools/testbed, e.g. kube-1.30>}
[[ $MODULE =~ ^kube(-[0-9.]+)?$ && -f $TESTBED/$MODULE/go.mod ]] || { echo "kube-build: no module $MODULE" >&2; exit 1; }
KUBE_VERSION=$(awk '$1 == "k8s.io/kubernetes" {sub(/^v/, "", $2); print $2; exit}
  $1 == "require" && $2 == "k8s.io/kubernetes" {sub(/^v/, "", $3); print $3; exit}' "$TESTBED/$MODULE/go.mod")
ETCD_VERSION=$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" {sub(/^v/, "", $3); print $3; exit}' \
  "$TESTBED/etcd/go.mod")
[[ -n $KUBE_VERSION && -n $ETCD_VERSION ]] || { echo "kube-build: cannot read the pinned versions" >&2; exit 1; }

CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}
OUT=$CACHE/kube-$KUBE_VERSION
MARKER=$OUT/.built
BINARIES=(kube-apiserver kube-controller-manager kubectl etcd)
DIGEST=$(cat "$TESTBED/$MODULE"/go.mod "$TESTBED/$MODULE"/go.sum "$TESTBED"/etcd/go.mod "$TESTBED"/etcd/go.sum \
  "$TESTBED"/etcd/main.go "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)

built() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x $OUT/bin/$b ]] || return 1; done
  [[ -f $MARKER && $(cat "$MARKER") == "$DIGEST" ]]
}

built && exit 0

mkdir -p "$CACHE"
exec 9>"$CACHE/.kube-build.lock"
echo "kube-build: waiting for lock $CACHE/.kube-build.lock" >&2
flock 9
if built; then
  echo "kube-build: already built by another caller" >&2
  exit 0
fi

T0=$SECONDS
step_start=$SECONDS
step() {
  local now=$SECONDS
  echo "kube-build: [$((now - T0))s total, previous step $((now - step_start))s] $*" >&2
  step_start=$now
}

export GOMODCACHE=$CACHE/go-mod
export GOCACHE=$CACHE/go-build
export GOFLAGS=-mod=readonly
export CGO_ENABLED=0
mkdir -p "$GOMODCACHE" "$GOCACHE"
go version >&2

# Version stamps, as Kubernetes' hack/lib/version.sh sets them: /version is served from component-base's.
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
MINOR=$(cut -d. -f2 <<<"$KUBE_VERSION")
LDFLAGS="-s -w"
for VPKG in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDFLAGS+=" -X $VPKG.gitVersion=v$KUBE_VERSION -X $VPKG.gitMajor=1 -X $VPKG.gitMinor=$MINOR"
  LDFLAGS+=" -X $VPKG.gitTreeState=clean -X $VPKG.buildDate=$BUILD_DATE"
done

rm -rf "$OUT/bin.tmp"
mkdir -p "$OUT/bin.tmp"
for b in kube-apiserver kube-controller-manager kubectl; do
  step "go build: $b v$KUBE_VERSION"
  (cd "$TESTBED/$MODULE" && go build -trimpath -ldflags "$LDFLAGS" -o "$OUT/bin.tmp/$b" "k8s.io/kubernetes/cmd/$b")
done
step "go build: etcd v$ETCD_VERSION"
(cd "$TESTBED/etcd" && go build -trimpath -ldflags "-s -w" -o "$OUT/bin.tmp/etcd" .)
"$OUT/bin.tmp/kube-apiserver" --version >&2
"$OUT/bin.tmp/etcd" --version >&2

rm -rf "$OUT/bin"
mv "$OUT/bin.tmp" "$OUT/bin"
echo "$DIGEST" >"$MARKER"
step "done: $OUT/bin ($(du -sh "$OUT/bin" | cut -f1)), total $((SECONDS - T0))s"

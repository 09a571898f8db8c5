#!/usr/bin/env bash
# Build argocd-health, Argo CD's own health-check runtime for the tests (e2e/testbed/lua_health.py): the Go program in
# tools/testbed/argocd, linked against the github.com/argoproj/argo-cd/v3 release its go.mod pins (util/lua and
# gitops-engine's health package: gopher-lua with Argo CD's sandbox).
#
# Only the Go module proxy is needed. Argo CD v3.6 asks for Go 1.27: when the machine's Go is older, the
# toolchain named by go.mod's `toolchain` line is fetched from the proxy (the golang.org/toolchain module,
# checksum-verified by the go command) into the module cache, once; a new enough Go is used as it is.
#
# Output:  $CACHE/argocd-$ARGOCD_VERSION/bin/argocd-health
#          $CACHE/argocd-$ARGOCD_VERSION/.built   (marker, written last; names the go.mod/go.sum/main.go digest)
# where CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}. Go's module and build caches are shared with
# tools/kube-build.sh: $CACHE/go-mod and $CACHE/go-build.
#
# Idempotent: exits at once when the marker matches. Concurrent callers are serialised with flock.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC=$HERE/testbed/argocd
ARGOCD_VERSION=$(awk '$1 == "github.com/argoproj/argo-cd/v3" {sub(/^v/, "", $2); print $2; exit}' "$SRC/go.mod")
GO_REQUIRED=$(awk '$1 == "go" {print $2; exit}' "$SRC/go.mod")
TOOLCHAIN=$(awk '$1 == "toolchain" {print $2; exit}' "$SRC/go.mod")
[[ -n $ARGOCD_VERSION && -n $GO_REQUIRED ]] || { echo "argocd-build: cannot read the pinned versions" >&2; exit 1; }

CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}
OUT=$CACHE/argocd-$ARGOCD_VERSION
MARKER=$OUT/.built
BINARY=$OUT/bin/argocd-health
DIGEST=$(cat "$SRC"/go.mod "$SRC"/go.sum "$SRC"/main.go "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)

built() { [[ -x $BINARY && -f $MARKER && $(cat "$MARKER") == "$DIGEST" ]]; }

built && exit 0

mkdir -p "$CACHE"
exec 9>"$CACHE/.argocd-build.lock"
echo "argocd-build: waiting for lock $CACHE/.argocd-build.lock" >&2
flock 9
if built; then
  echo "argocd-build: already built by another caller" >&2
  exit 0
fi

T0=$SECONDS
step_start=$SECONDS
step() {
  local now=$SECONDS
  echo "argocd-build: [$((now - T0))s total, previous step $((now - step_start))s] $*" >&2
  step_start=$now
}

export GOMODCACHE=$CACHE/go-mod
export GOCACHE=$CACHE/go-build
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0
mkdir -p "$GOMODCACHE" "$GOCACHE"

# The machine's Go when it is new enough for go.mod, else exactly go.mod's toolchain (never "auto").
LOCAL_GO=$(GOTOOLCHAIN=local go env GOVERSION)
if [[ $(printf '%s\n' "go$GO_REQUIRED" "$LOCAL_GO" | sort -V | head -1) == "go$GO_REQUIRED" ]]; then
  export GOTOOLCHAIN=local
else
  [[ -n $TOOLCHAIN ]] || { echo "argocd-build: $LOCAL_GO < go $GO_REQUIRED and go.mod names no toolchain" >&2; exit 1; }
  export GOTOOLCHAIN=$TOOLCHAIN
  step "$LOCAL_GO is older than go $GO_REQUIRED (go.mod): using $TOOLCHAIN from the module proxy"
fi
(cd "$SRC" && go version) >&2

rm -rf "$OUT/bin.tmp"
mkdir -p "$OUT/bin.tmp"
step "go build: argocd-health (github.com/argoproj/argo-cd/v3 v$ARGOCD_VERSION)"
(cd "$SRC" && go build -trimpath -ldflags "-s -w" -o "$OUT/bin.tmp/argocd-health" .)
"$OUT/bin.tmp/argocd-health" -version >&2

rm -rf "$OUT/bin"
mv "$OUT/bin.tmp" "$OUT/bin"
echo "$DIGEST" >"$MARKER"
step "done: $OUT/bin ($(du -sh "$OUT/bin" | cut -f1)), total $((SECONDS - T0))s"

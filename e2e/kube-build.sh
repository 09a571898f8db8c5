#!/usr/bin/env bash
# Build kube-apiserver and kube-controller-manager 1.20.2 from Debian's source
# package, and make sure etcd (Debian etcd-server) is installed.
#
# There is no kind/k3d/envtest download on our machines: only the Debian, PyPI
# and npm registries are reachable. Debian bookworm ships the full Kubernetes
# 1.20.2 source (with vendor/) plus Go 1.19 and etcd 3.4, so we build the two
# control-plane binaries ourselves (about 6 minutes on 2 cores, once).
#
# Output:  $CACHE/kube-1.20.2/bin/{kube-apiserver,kube-controller-manager}
#          $CACHE/kube-1.20.2/.built   (marker, written last)
# where CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}.
#
# Idempotent: exits at once when the marker exists. Concurrent callers are
# serialised with flock, so only one of them builds.
set -euo pipefail

KUBE_VERSION=1.20.2
DEB_VERSION=1.20.5+really1.20.2-1.1+deb12u1
ORIG_TARBALL=kubernetes_1.20.5+really1.20.2.orig.tar.gz
APT_PACKAGES=(golang-go etcd-server golang-github-modern-go-reflect2-dev)
REFLECT2_DEBIAN=/usr/share/gocode/src/github.com/modern-go/reflect2
DEB_SRC_FILE=/etc/apt/sources.list.d/vllm-operator-deb-src.sources

CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}
OUT=$CACHE/kube-$KUBE_VERSION
MARKER=$OUT/.built

packages_installed() {
  local p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || return 1
  done
  [[ -x /usr/bin/etcd && -d $REFLECT2_DEBIAN ]]
}

# Fast path (no lock needed): already built and etcd present.
if [[ -f $MARKER && -x $OUT/bin/kube-apiserver && -x $OUT/bin/kube-controller-manager && -x /usr/bin/etcd ]]; then
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.kube-build.lock"
echo "kube-build: waiting for lock $CACHE/.kube-build.lock" >&2
flock 9
# Someone else may have finished while we waited.
if [[ -f $MARKER && -x $OUT/bin/kube-apiserver && -x $OUT/bin/kube-controller-manager ]] && packages_installed; then
  echo "kube-build: already built by another caller" >&2
  exit 0
fi

SUDO=
if [[ $(id -u) -ne 0 ]]; then
  SUDO=sudo
fi

T0=$SECONDS
step_start=$SECONDS
step() {
  local now=$SECONDS
  echo "kube-build: [$((now - T0))s total, previous step $((now - step_start))s] $*" >&2
  step_start=$now
}

SRC_DL=$CACHE/kube-src-download
mkdir -p "$SRC_DL"

# ---------------------------------------------------------------- apt
if packages_installed && [[ -f $SRC_DL/$ORIG_TARBALL ]]; then
  step "apt: packages installed and source tarball cached, skipping apt"
else
  step "apt: enabling deb-src and installing ${APT_PACKAGES[*]}"
  if [[ ! -f $DEB_SRC_FILE ]]; then
    $SUDO tee "$DEB_SRC_FILE" >/dev/null <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${APT_PACKAGES[@]}"
  if [[ ! -f $SRC_DL/$ORIG_TARBALL ]]; then
    step "apt: downloading kubernetes=$DEB_VERSION source"
    (cd "$SRC_DL" && apt-get source --download-only "kubernetes=$DEB_VERSION")
  fi
  [[ -f $SRC_DL/$ORIG_TARBALL ]] || { echo "kube-build: $ORIG_TARBALL not downloaded" >&2; exit 1; }
fi

# ---------------------------------------------------------------- unpack
G=$CACHE/kube-gopath
KSRC=$G/src/k8s.io/kubernetes
step "unpack: $ORIG_TARBALL -> $KSRC"
rm -rf "$G"
mkdir -p "$KSRC"
tar -xzf "$SRC_DL/$ORIG_TARBALL" -C "$KSRC" --strip-components=1
[[ -d $KSRC/cmd/kube-apiserver && -d $KSRC/vendor ]] || { echo "kube-build: unexpected tarball layout" >&2; exit 1; }

# Go 1.19 vs. the vendored reflect2 v1.0.1: the apiserver dies with
# "fatal error: fault ... reflect2 UnsafeMapType". Use Debian's v1.0.2.
step "patch: vendor/github.com/modern-go/reflect2 <- $REFLECT2_DEBIAN"
rm -rf "$KSRC/vendor/github.com/modern-go/reflect2"
cp -rL "$REFLECT2_DEBIAN" "$KSRC/vendor/github.com/modern-go/reflect2"
find "$KSRC/vendor/github.com/modern-go/reflect2" -name '*_test.go' -delete

# GOPATH mode (module mode fails with "updates to go.mod needed").
export GOPATH=$G
export GO111MODULE=off
export CGO_ENABLED=0
export GOFLAGS=
export GOCACHE=$CACHE/go-build-cache
mkdir -p "$GOCACHE"
cd "$KSRC"
go version >&2

# ---------------------------------------------------------------- openapi-gen
# The source package lacks pkg/generated/openapi/zz_generated.openapi.go.
step "openapi-gen: building"
go build -o "$G/bin/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
DIRS=$(grep -RlF --include='*.go' '+k8s:openapi-gen=' pkg cmd vendor/k8s.io \
  | grep -v '_test\.go$' \
  | xargs -n1 dirname | sort -u \
  | grep -v -e '^vendor/k8s.io/code-generator' -e '^vendor/k8s.io/sample-apiserver' \
  | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
step "openapi-gen: generating for $(tr ',' '\n' <<<"$DIRS" | wc -l) packages"
"$G/bin/openapi-gen" -i "$DIRS" \
  -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
  -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r /dev/null
[[ -f pkg/generated/openapi/zz_generated.openapi.go ]] || { echo "kube-build: openapi-gen produced nothing" >&2; exit 1; }

# ---------------------------------------------------------------- go build
# Version stamps (as hack/lib/version.sh does): /version is served from
# client-go's copy, --version from component-base's.
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS="-s -w"
for VPKG in k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version k8s.io/kubernetes/vendor/k8s.io/component-base/version; do
  LDFLAGS+=" -X $VPKG.gitVersion=v$KUBE_VERSION -X $VPKG.gitMajor=1 -X $VPKG.gitMinor=20"
  LDFLAGS+=" -X $VPKG.gitTreeState=clean -X $VPKG.buildDate=$BUILD_DATE"
done
rm -rf "$OUT/bin.tmp"
mkdir -p "$OUT/bin.tmp"
for b in kube-apiserver kube-controller-manager; do
  step "go build: $b"
  go build -trimpath -ldflags "$LDFLAGS" -o "$OUT/bin.tmp/$b" "./cmd/$b"
done
"$OUT/bin.tmp/kube-apiserver" --version >&2

rm -rf "$OUT/bin"
mv "$OUT/bin.tmp" "$OUT/bin"
step "cleanup: removing source tree (binaries, tarball and Go build cache are kept)"
cd /
rm -rf "$G"
date -u +%Y-%m-%dT%H:%M:%SZ >"$MARKER"
step "done: $OUT/bin ($(du -sh "$OUT/bin" | cut -f1)), total $((SECONDS - T0))s"

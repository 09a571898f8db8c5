#!/usr/bin/env bash
# KEDA's ScaledObject CRD (github.com/kedacore/keda/v2, config/crd/bases of the pinned release) from its Go module,
# for tests/apiserver/test_autoscaler_apiserver.py: the operator's ScaledObjects are admitted by KEDA's own schema
# on the test bed's API server. Only the CRD: no KEDA operator runs here (nothing is built).
#
# Output:  $CACHE/keda-$VERSION/crd/keda.sh_scaledobjects.yaml
# where CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}; Go's module cache is tools/kube-build.sh's.
# Idempotent: exits at once when the file is there. Concurrent callers are serialised with flock.
set -euo pipefail

VERSION=2.21.0
CACHE=${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}
OUT=$CACHE/keda-$VERSION/crd
CRD=keda.sh_scaledobjects.yaml

[[ -f $OUT/$CRD ]] && exit 0
mkdir -p "$CACHE"
exec 9>"$CACHE/.keda-crd.lock"
flock 9
[[ -f $OUT/$CRD ]] && exit 0

export GOMODCACHE=$CACHE/go-mod GOTOOLCHAIN=local GOFLAGS=-mod=mod
mkdir -p "$GOMODCACHE"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DIR=$(cd "$WORK" && go mod download -json "github.com/kedacore/keda/v2@v$VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -f $DIR/config/crd/bases/$CRD ]] || { echo "keda-crd: no $CRD in the module (dir: '$DIR')" >&2; exit 1; }
rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp"
cp "$DIR/config/crd/bases/$CRD" "$OUT.tmp/$CRD"
chmod 0644 "$OUT.tmp/$CRD"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "keda-crd: $OUT/$CRD" >&2

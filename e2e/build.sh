#!/usr/bin/env bash
# Build (or restore from cache) the e2e control-plane binaries.
#
#   e2e/build.sh            -> prints the binary directory on stdout (last line)
#
# Binaries land in ${KVPILOT_CACHE:-$HOME/.cache/kvpilot}/bin/<key>/, where <key>
# is the sha256 of go.mod, go.sum, main.go, versions.env and `go version`.
# A finished build is marked by a .complete file; if it exists nothing is rebuilt.
# ${KVPILOT_CACHE}/bin/current is a symlink to the latest finished build.
# e2e/cluster.py computes the same key (bin_dir()), so the two always agree.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$HERE/k8sbin
. "$SRC/versions.env"
CACHE=${KVPILOT_CACHE:-$HOME/.cache/kvpilot}
command -v go >/dev/null || { echo "build.sh: 'go' not found on PATH (need Go >= 1.26)" >&2; exit 1; }
GOVER=$(go env GOVERSION)
KEY=$( { cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/main.go" "$SRC/versions.env"; echo "$GOVER"; } | sha256sum | cut -c1-16)
OUT=$CACHE/bin/$KEY
if [[ -f $OUT/.complete ]]; then
  ln -sfn "$KEY" "$CACHE/bin/current"
  echo "build.sh: cached binaries in $OUT" >&2
  echo "$OUT"
  exit 0
fi
mkdir -p "$CACHE/bin" "$CACHE/logs"
# One build at a time per cache (make test, a pytest fixture and `e2e.cluster up` may race):
# later callers wait here, then find the finished build.
exec 9>"$CACHE/bin/.build.lock"
if ! flock -n 9; then
  echo "build.sh: another build holds $CACHE/bin/.build.lock; waiting for it" >&2
  flock 9
fi
if [[ -f $OUT/.complete ]]; then
  ln -sfn "$KEY" "$CACHE/bin/current"
  echo "build.sh: cached binaries in $OUT" >&2
  echo "$OUT"
  exit 0
fi
TMP=$OUT.tmp.$$
rm -rf "$OUT.tmp".*; mkdir -p "$TMP"   # leftovers of interrupted builds
trap 'rm -rf "$TMP"' EXIT
TIMEV=()
[[ -x /usr/bin/time ]] && TIMEV=(/usr/bin/time -v)

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath"
# 2 cores, 24 GiB: parallel package compiles are fine memory-wise; -p defaults to GOMAXPROCS.

V=${K8S_VERSION#v}; MAJ=${V%%.*}; MIN=${V#*.}; MIN=${MIN%%.*}
LDF="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDF="$LDF -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$MAJ -X $p.gitMinor=$MIN"
  LDF="$LDF -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

t0=$(date +%s)
echo "build.sh: building k8s multicall ($K8S_VERSION) into $OUT (cold build: ~tens of minutes on 2 cores)" >&2
( cd "$SRC" && "${TIMEV[@]}" go build -ldflags "$LDF" -o "$TMP/k8s" . ) 2> >(tee "$CACHE/logs/build-k8s-$KEY-$$.log" >&2)
for n in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl; do ln -sf k8s "$TMP/$n"; done

echo "build.sh: go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
KWOK_LDF="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
( cd /tmp && GOBIN=$TMP "${TIMEV[@]}" go install -ldflags "$KWOK_LDF" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" ) 2> >(tee "$CACHE/logs/build-kwok-$KEY-$$.log" >&2)

echo "build.sh: go install $HELM_MODULE/cmd/helm@$HELM_VERSION" >&2
HELM_LDF="-s -w -X $HELM_MODULE/internal/version.version=$HELM_VERSION -X $HELM_MODULE/pkg/chart/v2/lint/rules.k8sVersionMajor=$MAJ -X $HELM_MODULE/pkg/chart/v2/lint/rules.k8sVersionMinor=$MIN"
( cd /tmp && GOBIN=$TMP "${TIMEV[@]}" go install -ldflags "$HELM_LDF" "$HELM_MODULE/cmd/helm@$HELM_VERSION" ) 2> >(tee "$CACHE/logs/build-helm-$KEY-$$.log" >&2)

# KWOK's default stages (kwokctl injects these itself; plain `kwok` needs --config).
# Taken verbatim from the pinned kwok module, not copied into the repo.
KWOK_DIR=$(cd /tmp && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
{
  first=1
  for f in "$KWOK_DIR"/kustomize/stage/node/fast/*.yaml \
           "$KWOK_DIR"/kustomize/stage/node/heartbeat-with-lease/*.yaml \
           "$KWOK_DIR"/kustomize/stage/pod/fast/*.yaml; do
    [[ $(basename "$f") == kustomization.yaml ]] && continue
    [[ $first == 1 ]] || echo "---"
    first=0
    cat "$f"
  done
} > "$TMP/kwok-default-stages.yaml"

echo "$KEY k8s=$K8S_VERSION kwok=$KWOK_VERSION helm=$HELM_VERSION $GOVER seconds=$(( $(date +%s) - t0 ))" > "$TMP/.complete"
rm -rf "$OUT"; mv "$TMP" "$OUT"; trap - EXIT
ln -sfn "$KEY" "$CACHE/bin/current"
echo "build.sh: done in $(( $(date +%s) - t0 ))s -> $OUT" >&2
echo "$OUT"

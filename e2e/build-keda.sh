#!/usr/bin/env bash
# Build (or restore from cache) KEDA's operator and metrics adapter for e2e/test_keda.py.
#
#   e2e/build-keda.sh       -> prints the KEDA binary directory on stdout (last line)
#
# Same scheme as e2e/build.sh, with its own key so that bumping KEDA does not rebuild the
# control plane (and vice versa): binaries land in ${KVPILOT_CACHE:-$HOME/.cache/kvpilot}/bin/keda-<key>/,
# <key> = sha256 of e2e/keda/versions.env and `go version`; a finished build has .complete;
# bin/keda-current links to the latest. e2e/keda_local.py computes the same key.
#
# KEDA's go.mod has a replace directive, so `go install module@version` refuses it: the module
# is downloaded with `go mod download` (the Go module proxy) and built as the main module from
# its read-only copy in GOMODCACHE. Its CRDs (keda.sh and eventing.keda.sh) are copied from the module's
# config/crd/bases.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/keda/versions.env"
CACHE=${KVPILOT_CACHE:-$HOME/.cache/kvpilot}
command -v go >/dev/null || { echo "build-keda.sh: 'go' not found on PATH (need Go >= 1.26)" >&2; exit 1; }
GOVER=$(go env GOVERSION)
KEY=$( { cat "$HERE/keda/versions.env"; echo "$GOVER"; } | sha256sum | cut -c1-16)
OUT=$CACHE/bin/keda-$KEY
done_cached() {
  ln -sfn "keda-$KEY" "$CACHE/bin/keda-current"
  echo "build-keda.sh: cached KEDA binaries in $OUT" >&2
  echo "$OUT"
  exit 0
}
[[ -f $OUT/.complete ]] && done_cached
mkdir -p "$CACHE/bin" "$CACHE/logs"
exec 9>"$CACHE/bin/.build-keda.lock"
if ! flock -n 9; then
  echo "build-keda.sh: another build holds $CACHE/bin/.build-keda.lock; waiting for it" >&2
  flock 9
fi
[[ -f $OUT/.complete ]] && done_cached
TMP=$OUT.tmp.$$
rm -rf "$OUT.tmp".*; mkdir -p "$TMP/crds"
trap 'rm -rf "$TMP"' EXIT
TIMEV=()
[[ -x /usr/bin/time ]] && TIMEV=(/usr/bin/time -v)
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath"

t0=$(date +%s)
echo "build-keda.sh: go mod download $KEDA_MODULE@$KEDA_VERSION" >&2
SRC=$(cd /tmp && go mod download -json "$KEDA_MODULE@$KEDA_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
( cd "$SRC" && go mod download ) >&2
t1=$(date +%s)
LDF="-s -w -X $KEDA_MODULE/version.Version=${KEDA_VERSION#v} -X $KEDA_MODULE/version.GitCommit=$KEDA_VERSION"
echo "build-keda.sh: building keda operator + adapter ($KEDA_VERSION) into $OUT (cold build: ~tens of minutes on 2 cores)" >&2
( cd "$SRC" && "${TIMEV[@]}" go build -ldflags "$LDF" -o "$TMP/" ./cmd/operator ./cmd/adapter ) \
  2> >(tee "$CACHE/logs/build-keda-$KEY-$$.log" >&2)
mv "$TMP/operator" "$TMP/keda"; mv "$TMP/adapter" "$TMP/keda-adapter"
cp "$SRC"/config/crd/bases/*.yaml "$TMP/crds/"
chmod u+w "$TMP"/crds/*.yaml
t2=$(date +%s)
echo "$KEY keda=$KEDA_VERSION $GOVER download_seconds=$(( t1 - t0 )) build_seconds=$(( t2 - t1 ))" > "$TMP/.complete"
rm -rf "$OUT"; mv "$TMP" "$OUT"; trap - EXIT
ln -sfn "keda-$KEY" "$CACHE/bin/keda-current"
echo "build-keda.sh: done in $(( t2 - t0 ))s -> $OUT" >&2
echo "$OUT"

#!/usr/bin/env bash
# Build (or restore from cache) the LeaderWorkerSet controller manager for e2e/test_leader_worker_set.py.
#
#   e2e/build-lws.sh       -> prints the LWS binary directory on stdout (last line)
#
# Same scheme as e2e/build-keda.sh: binaries land in ${KVPILOT_CACHE:-$HOME/.cache/kvpilot}/bin/lws-<key>/,
# <key> = sha256 of e2e/lws/versions.env and `go version`; a finished build has .complete; bin/lws-current
# links to the latest. e2e/lws_local.py computes the same key.
#
# The source: the module proxy's zip when it serves one (go verifies it against sum.golang.org); it refuses
# sigs.k8s.io/lws v0.10.0 today (403), so otherwise the pinned commit ($LWS_COMMIT, the tag's) is read from a
# copy of that commit's tree kept in this repository (e2e/lws/lws-<version>-src.tar.gz, checked against its
# .sha256), else a git repository holding it: $LWS_GIT_DIR, else a clone of $LWS_GIT_URL. `git archive` of that commit is the
# tree the commit hash names, so either way the bytes are pinned. The dependencies come from the module proxy
# and are checked against the module's go.sum. Built: cmd/main.go (the manager: LWS, DisaggregatedSet and pod
# controllers, webhooks) as `lws-manager`; its CRDs are copied from config/crd/bases and its webhook
# configurations from config/webhook/manifests.yaml.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lws/versions.env"
CACHE=${KVPILOT_CACHE:-$HOME/.cache/kvpilot}
command -v go >/dev/null || { echo "build-lws.sh: 'go' not found on PATH (need Go >= 1.26)" >&2; exit 1; }
GOVER=$(go env GOVERSION)
KEY=$( { cat "$HERE/lws/versions.env"; echo "$GOVER"; } | sha256sum | cut -c1-16)
OUT=$CACHE/bin/lws-$KEY
done_cached() {
  ln -sfn "lws-$KEY" "$CACHE/bin/lws-current"
  echo "build-lws.sh: cached LWS binaries in $OUT" >&2
  echo "$OUT"
  exit 0
}
[[ -f $OUT/.complete ]] && done_cached
mkdir -p "$CACHE/bin" "$CACHE/logs"
exec 9>"$CACHE/bin/.build-lws.lock"
if ! flock -n 9; then
  echo "build-lws.sh: another build holds $CACHE/bin/.build-lws.lock; waiting for it" >&2
  flock 9
fi
[[ -f $OUT/.complete ]] && done_cached
TMP=$OUT.tmp.$$
rm -rf "$OUT.tmp".*; mkdir -p "$TMP/src" "$TMP/crds"
trap 'rm -rf "$TMP"' EXIT
TIMEV=()
[[ -x /usr/bin/time ]] && TIMEV=(/usr/bin/time -v)
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath -mod=mod"

t0=$(date +%s)
SRC=$TMP/src
ZIPDIR=$(cd /tmp && go mod download -json "$LWS_MODULE@$LWS_VERSION" 2>/dev/null \
  | python3 -c 'import json,sys; print(json.load(sys.stdin).get("Dir", ""))' || true)
if [[ -n $ZIPDIR && -d $ZIPDIR ]]; then
  echo "build-lws.sh: source from the module proxy: $LWS_MODULE@$LWS_VERSION" >&2
  cp -r "$ZIPDIR"/. "$SRC"/; chmod -R u+w "$SRC"
elif [[ -f $HERE/lws/lws-$LWS_VERSION-src.tar.gz ]]; then
  # the repository's own copy: `git archive $LWS_COMMIT -- go.mod go.sum api client-go cmd pkg config LICENSE`
  # (Apache-2.0), so a clean clone builds with nothing but the module proxy for the dependencies
  ( cd "$HERE/lws" && sha256sum --quiet -c "lws-$LWS_VERSION-src.tar.gz.sha256" ) >&2 \
    || { echo "build-lws.sh: e2e/lws/lws-$LWS_VERSION-src.tar.gz does not match its sha256" >&2; exit 1; }
  echo "build-lws.sh: source from e2e/lws/lws-$LWS_VERSION-src.tar.gz (git archive of $LWS_COMMIT)" >&2
  tar -xzf "$HERE/lws/lws-$LWS_VERSION-src.tar.gz" -C "$SRC"
else
  GITDIR=${LWS_GIT_DIR:-}
  MIRROR=/work/.mirror/kubernetes-sigs+lws/repo  # where this project's machines keep a snapshot of the repository
  [[ -z $GITDIR && -d $MIRROR ]] && GITDIR=$MIRROR
  if [[ -z $GITDIR ]]; then
    GITDIR=$TMP/git
    echo "build-lws.sh: the module proxy refuses $LWS_MODULE@$LWS_VERSION; cloning $LWS_GIT_URL" >&2
    git clone -q --bare --filter=blob:none "$LWS_GIT_URL" "$GITDIR" >&2 \
      || { echo "build-lws.sh: cannot clone $LWS_GIT_URL; set LWS_GIT_DIR to a git repository holding $LWS_COMMIT" >&2; exit 1; }
  fi
  got=$(git --git-dir="$GITDIR" rev-parse --verify -q "$LWS_COMMIT^{commit}" || true)
  [[ $got == "$LWS_COMMIT" ]] \
    || { echo "build-lws.sh: $GITDIR does not hold commit $LWS_COMMIT ($LWS_VERSION)" >&2; exit 1; }
  tag=$(git --git-dir="$GITDIR" rev-parse -q --verify "refs/tags/$LWS_VERSION^{commit}" || true)
  [[ -z $tag || $tag == "$LWS_COMMIT" ]] \
    || { echo "build-lws.sh: tag $LWS_VERSION is $tag in $GITDIR, not the pinned $LWS_COMMIT" >&2; exit 1; }
  echo "build-lws.sh: source from git commit $LWS_COMMIT ($LWS_VERSION) in $GITDIR" >&2
  git --git-dir="$GITDIR" archive "$LWS_COMMIT" -- go.mod go.sum api client-go cmd pkg config | tar -x -C "$SRC"
fi
( cd "$SRC" && go mod download ) >&2
t1=$(date +%s)
LDF="-s -w -X $LWS_MODULE/pkg/version.GitVersion=$LWS_VERSION -X $LWS_MODULE/pkg/version.GitCommit=$LWS_COMMIT"
echo "build-lws.sh: building the LWS manager ($LWS_VERSION) into $OUT (cold: 243 s of CPU, 20 min wall on 2 cores shared at load 28)" >&2
( cd "$SRC" && "${TIMEV[@]}" go build -ldflags "$LDF" -o "$TMP/lws-manager" ./cmd ) \
  2> >(tee "$CACHE/logs/build-lws-$KEY-$$.log" >&2)
cp "$SRC"/config/crd/bases/*.yaml "$TMP/crds/"
cp "$SRC"/config/webhook/manifests.yaml "$TMP/webhooks.yaml"
chmod u+w "$TMP"/crds/*.yaml "$TMP/webhooks.yaml"
rm -rf "$SRC" "$TMP/git"
t2=$(date +%s)
echo "$KEY lws=$LWS_VERSION commit=$LWS_COMMIT $GOVER download_seconds=$(( t1 - t0 )) build_seconds=$(( t2 - t1 ))" > "$TMP/.complete"
rm -rf "$OUT"; mv "$TMP" "$OUT"; trap - EXIT
ln -sfn "lws-$KEY" "$CACHE/bin/lws-current"
echo "build-lws.sh: done in $(( t2 - t0 ))s -> $OUT" >&2
echo "$OUT"

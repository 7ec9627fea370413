#!/usr/bin/env bash
# Regenerate go.mod's replace block for every k8s.io staging module of the pinned
# k8s.io/kubernetes version. k8s.io/kubernetes's published go.mod requires each
# staging module at v0.0.0 (the monorepo resolves them through go.work), which the
# module proxy does not serve; staging module vX.Y.Z is published as v0.Y.Z.
# Usage: e2e/k8sbin/gen-replace.sh   (uses only the Go module proxy)
set -euo pipefail
cd "$(dirname "$0")"
. ./versions.env
V=${K8S_VERSION#v}            # 1.36.3
SV=v0.${V#1.}                 # v0.36.3
GOMOD=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
# drop any old k8s.io replaces, then add the generated ones
for m in $(go mod edit -json | python3 -c 'import json,sys; [print(r["Old"]["Path"]) for r in (json.load(sys.stdin).get("Replace") or []) if r["Old"]["Path"].startswith("k8s.io/")]'); do
  go mod edit -dropreplace="$m"
done
for m in $(awk '$1 ~ /^k8s\.io\// && $2=="v0.0.0" {print $1}' "$GOMOD"); do
  go mod edit -replace="$m=$m@$SV"
done
go mod edit -replace="k8s.io/kubernetes=k8s.io/kubernetes@$K8S_VERSION"
go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
go mod tidy

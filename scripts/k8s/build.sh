#!/usr/bin/env bash
# Build the real Kubernetes pieces for `make test-k8s` from the Go module proxy, once per version,
# into a cache outside the repository ($TIDESERVE_K8S_CACHE, default ~/.cache/tideserve-k8s).
# Each piece is independent: a failure is recorded in <cache>/<piece>-<version>/FAILED (with the
# log) and the others still build. A finished piece has <cache>/<piece>-<version>/OK.
# Nothing fetched here is ever written into the repository.
#   scripts/k8s/build.sh            build every missing piece
#   scripts/k8s/build.sh etcd kube  build only these pieces
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions
. "$HERE/versions"

CACHE=${TIDESERVE_K8S_CACHE:-$HOME/.cache/tideserve-k8s}
mkdir -p "$CACHE"
export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=mod" CGO_ENABLED=0
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tideserve-k8s-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

log() { echo "[$(date +%H:%M:%S)] $*"; }

# Copy a module from the module cache into a writable directory; prints the directory.
module_copy() { # module version
    local dir
    dir=$(go mod download -json "$1@$2" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') || return 1
    local dst="$WORK/$(basename "$1")-$2"
    rm -rf "$dst"; cp -r "$dir" "$dst" && chmod -R u+w "$dst" && rm -rf "$dst/vendor" "$dst/go.work" "$dst/go.work.sum"
    echo "$dst"
}

build_etcd() { # $1 = output dir
    local src="$WORK/etcd-wrapper"
    mkdir -p "$src"
    cat > "$src/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    (cd "$src" && go mod init tideserve.local/etcd >/dev/null 2>&1 &&
        go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" && go mod tidy &&
        go build -trimpath -o "$1/etcd" .)
}

build_kube() {
    local src; src=$(module_copy k8s.io/kubernetes "$KUBE_VERSION") || return 1
    local staging="v0${KUBE_VERSION#v1}"   # v1.35.4 -> v0.35.4
    (cd "$src" || exit 1
        # every ./staging/src/k8s.io/X replace -> the published k8s.io/X at the matching v0 version
        go mod edit -json | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("./staging/"):
        print(r["Old"]["Path"])' | while read -r m; do
            go mod edit -replace "$m=$m@$staging"
        done
        go mod tidy || true
        local pkg=k8s.io/component-base/version minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
        local ld="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
        go build -trimpath -ldflags "$ld" -o "$1/" ./cmd/kube-apiserver ./cmd/kube-controller-manager ./cmd/kube-scheduler)
}

build_kwok() {
    GOBIN="$1" go install -trimpath "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

build_karpenter() {
    local gobin="$WORK/karpenter-bin"; mkdir -p "$gobin"
    GOBIN="$gobin" go install -trimpath "sigs.k8s.io/karpenter/kwok@$KARPENTER_VERSION" &&
        mv "$gobin/kwok" "$1/karpenter-kwok" &&
        local dir && dir=$(go mod download -json "sigs.k8s.io/karpenter@$KARPENTER_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') &&
        mkdir -p "$1/crds" && cp "$dir"/kwok/charts/crds/*.yaml "$1/crds/" && chmod u+w "$1"/crds/*
}

build_keda() {
    local src; src=$(module_copy github.com/kedacore/keda/v2 "$KEDA_VERSION") || return 1
    (cd "$src" && { go build -trimpath -ldflags "-s -w" -o "$1/" ./cmd/operator ./cmd/adapter || { go mod tidy && go build -trimpath -ldflags "-s -w" -o "$1/" ./cmd/operator ./cmd/adapter; }; } &&
        mkdir -p "$1/crds" && cp config/crd/bases/*.yaml "$1/crds/")
}

build_helm() {
    GOBIN="$1" go install -trimpath "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" || {
        local src; src=$(module_copy helm.sh/helm/v3 "$HELM_VERSION") || return 1
        (cd "$src" && go build -trimpath -o "$1/helm" ./cmd/helm); }
}

version_of() {
    case $1 in etcd) echo $ETCD_VERSION;; kube) echo $KUBE_VERSION;; kwok) echo $KWOK_VERSION;;
        karpenter) echo $KARPENTER_VERSION;; keda) echo $KEDA_VERSION;; helm) echo $HELM_VERSION;;
        *) echo "unknown piece $1" >&2; return 1;; esac
}

if [ "${1:-}" = "--print-versions" ]; then
    for p in etcd kube kwok karpenter keda helm; do echo "$p=$(version_of $p)"; done; exit 0
fi

pieces=("$@"); [ ${#pieces[@]} -eq 0 ] && pieces=(etcd kube kwok karpenter keda helm)
rc=0
for p in "${pieces[@]}"; do
    out="$CACHE/$p-$(version_of "$p")"
    [ -f "$out/OK" ] && { log "$p $(version_of "$p"): cached in $out"; continue; }
    rm -rf "$out"; mkdir -p "$out"
    log "$p $(version_of "$p"): building into $out"
    start=$(date +%s)
    if "build_$p" "$out" > "$out/build.log" 2>&1; then
        echo "$(( $(date +%s) - start ))" > "$out/OK"
        log "$p: built in $(( $(date +%s) - start ))s"
    else
        tail -20 "$out/build.log"
        echo "build failed after $(( $(date +%s) - start ))s; see $out/build.log" > "$out/FAILED"
        log "$p: FAILED (see $out/build.log)"; rc=1
    fi
done
exit $rc

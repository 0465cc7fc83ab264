#!/usr/bin/env bash
# Builds the local control plane from Go modules, at the versions pinned in
# e2e/cluster/versions.env, into a cache outside the repository:
#
#   ${LANEKEEPER_CLUSTER_CACHE:-${XDG_CACHE_HOME:-~/.cache}/lanekeeper/cluster}/<key>/bin
#
# where <key> is derived from versions.env and the build recipe number below,
# so a changed pin builds a new entry and an unchanged one is reused. Prints the bin directory
# on its last line of stdout (progress goes to stderr).
#
#   etcd                      go.etcd.io/etcd/server/v3
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#                             k8s.io/kubernetes, built through a go.mod of our
#                             own that pins every k8s.io staging module to the
#                             matching v0.x release (k8s.io/kubernetes replaces
#                             them with ./staging paths that a module consumer
#                             cannot see)
#   kwok                      sigs.k8s.io/kwok
#   helm                      helm.sh/helm/v3
#
# Needs Go (go.mod files ask for at most the Go on the machine) and the Go
# module proxy; nothing else.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck disable=SC1091 # the pin file, read at run time
. "$here/versions.env"

root=${LANEKEEPER_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lanekeeper/cluster}
# Bump when the way the components are built changes (flags, ldflags), so
# caches built the old way are not reused; comments need no bump.
recipe=1
key=$( { cat "$here/versions.env"; echo "recipe=$recipe"; } | sha256sum | cut -c1-12)
entry="$root/${KUBERNETES_VERSION}-$key"
bin="$entry/bin"
tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm)

complete() {
  local t
  for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done
}

if complete; then
  echo "cluster components: cached in $bin" >&2
  echo "$bin"
  exit 0
fi

mkdir -p "$bin" "$entry/src"
export GOFLAGS="-buildvcs=false -mod=mod"
export CGO_ENABLED=0
started=$(date +%s)

# go_module DIR MODULE VERSION: a throwaway module in DIR that requires
# MODULE@VERSION (its go.sum checked against the checksum database).
go_module() {
  local dir=$1 module=$2 version=$3
  rm -rf "$dir"
  mkdir -p "$dir"
  (cd "$dir" && go mod init "lanekeeper.dev/e2e-cluster/$(basename "$dir")" >/dev/null 2>&1 \
    && go mod edit -require="$module@$version")
}

build() { # build DIR OUT PACKAGE [LDFLAGS]
  local dir=$1 out=$2 pkg=$3 ldflags=${4:-}
  local t0
  t0=$(date +%s)
  echo "  building $out ($pkg)" >&2
  (cd "$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$bin/$out.tmp" "$pkg")
  mv "$bin/$out.tmp" "$bin/$out"
  echo "  built $out in $(( $(date +%s) - t0 )) s" >&2
}

# ---- Kubernetes -------------------------------------------------------------
k8s="$entry/src/kubernetes"
if ! { [ -x "$bin/kube-apiserver" ] && [ -x "$bin/kube-controller-manager" ] \
       && [ -x "$bin/kube-scheduler" ] && [ -x "$bin/kubectl" ]; }; then
  echo "== kubernetes $KUBERNETES_VERSION" >&2
  go_module "$k8s" k8s.io/kubernetes "$KUBERNETES_VERSION"
  kmod=$(cd "$k8s" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  staging=v0.${KUBERNETES_VERSION#v1.}
  # Every "k8s.io/X => ./staging/src/k8s.io/X" of k8s.io/kubernetes becomes
  # "k8s.io/X => k8s.io/X v0.<minor>.<patch>".
  mapfile -t staged < <(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\1#p' "$kmod")
  [ "${#staged[@]}" -gt 20 ] || { echo "could not read the staging modules from $kmod" >&2; exit 1; }
  edits=()
  for m in "${staged[@]}"; do edits+=("-replace=$m=$m@$staging"); done
  (cd "$k8s" && go mod edit "${edits[@]}")
  minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  vpkg=k8s.io/component-base/version
  kld="-X $vpkg.gitVersion=$KUBERNETES_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor"
  kld+=" -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
  kld+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
  kld+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [ -x "$bin/$c" ] || build "$k8s" "$c" "k8s.io/kubernetes/cmd/$c" "$kld"
  done
fi

# ---- etcd -------------------------------------------------------------------
if [ ! -x "$bin/etcd" ]; then
  echo "== etcd $ETCD_VERSION" >&2
  go_module "$entry/src/etcd" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
  build "$entry/src/etcd" etcd go.etcd.io/etcd/server/v3
fi

# ---- kwok -------------------------------------------------------------------
if [ ! -x "$bin/kwok" ]; then
  echo "== kwok $KWOK_VERSION" >&2
  go_module "$entry/src/kwok" sigs.k8s.io/kwok "$KWOK_VERSION"
  build "$entry/src/kwok" kwok sigs.k8s.io/kwok/cmd/kwok \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
fi

# ---- helm -------------------------------------------------------------------
if [ ! -x "$bin/helm" ]; then
  echo "== helm $HELM_VERSION" >&2
  go_module "$entry/src/helm" helm.sh/helm/v3 "$HELM_VERSION"
  build "$entry/src/helm" helm helm.sh/helm/v3/cmd/helm \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
fi

complete
echo "cluster components: built in $(( $(date +%s) - started )) s into $bin" >&2
echo "$bin"

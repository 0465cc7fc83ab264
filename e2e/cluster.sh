#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, as plain processes: etcd,
# kube-apiserver (RBAC, admission, audit log), kube-controller-manager,
# kube-scheduler, and kwok playing the kubelet for one CPU node and two GPU
# nodes (e2e/cluster/nodes.yaml, e2e/cluster/kwok-stages.yaml). The
# components are built from Go modules at the versions in
# e2e/cluster/versions.env by e2e/cluster/build.sh (cached outside the repo).
#
#   bash e2e/cluster.sh up        # build or reuse, start, wait; prints the kubeconfig path
#   bash e2e/cluster.sh down      # stop every process it started, remove the state
#   bash e2e/cluster.sh status    # which components run
#   bash e2e/cluster.sh restart kube-apiserver|etcd|...   # stop and start one component
#   bash e2e/cluster.sh stop|start COMPONENT              # the two halves of restart
#   bash e2e/cluster.sh bin       # the directory holding kubectl, helm, ...
#
# State (certificates, etcd data, logs, the audit log, the admin kubeconfig)
# lives in e2e/.cluster (git-ignored). Ports: LANEKEEPER_CLUSTER_PORT (the
# API server, default 26443) and the three after it for etcd and kwok.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
state=${LANEKEEPER_CLUSTER_STATE:-$here/.cluster}
port=${LANEKEEPER_CLUSTER_PORT:-26443}
etcd_client=$((port + 1))
etcd_peer=$((port + 2))
kwok_port=$((port + 3))
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

log() { echo "cluster: $*" >&2; }

bin_dir() {
  if [ -f "$state/bin" ]; then cat "$state/bin"; else bash "$here/cluster/build.sh"; fi
}

running() { # running NAME: its pid is alive
  local f="$state/run/$1.pid"
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

start_one() { # start_one NAME: runs $state/run/NAME.cmd in the background
  local name=$1
  running "$name" && return 0
  if [ "$name" = kwok ] && [ -f "$state/kubeconfig" ] && running kube-apiserver; then
    # A new kwok process has a new holder identity and will not take over
    # the node Leases its predecessor held: drop them, it creates its own.
    kctl -n kube-node-lease delete leases --all >/dev/null 2>&1 || true
  fi
  setsid bash "$state/run/$name.cmd" >>"$state/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$state/run/$name.pid"
}

stop_one() { # stop_one NAME: TERM, then KILL after 10 s
  local name=$1 f="$state/run/$1.pid" pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

wait_for() { # wait_for WHAT SECONDS COMMAND...
  local what=$1 secs=$2 i
  shift 2
  for i in $(seq 1 $((secs * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  log "timed out after ${secs}s waiting for $what; last lines of the logs:"
  local f
  for f in "$state"/logs/*.log; do echo "--- $f" >&2; tail -n 15 "$f" >&2; done
  return 1
}

certs() { # a CA, the serving certificate and one client certificate per user
  local d="$state/pki"
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=lanekeeper-e2e-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
  issue() { # issue NAME SUBJECT [SAN]
    local name=$1 subj=$2 san=${3:-}
    openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$d/$name.key" -out "$d/$name.csr" 2>/dev/null
    if [ -n "$san" ]; then
      printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$d/$name.ext"
    else
      printf 'extendedKeyUsage=clientAuth\n' >"$d/$name.ext"
    fi
    openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
      -days 30 -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
  }
  issue apiserver "/CN=kube-apiserver" \
    "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  issue admin "/O=system:masters/CN=kubernetes-admin"
  issue controller-manager "/CN=system:kube-controller-manager"
  issue scheduler "/CN=system:kube-scheduler"
  issue kwok "/O=system:masters/CN=kwok"
}

kubeconfig() { # kubeconfig USER FILE
  local user=$1 file=$2 d="$state/pki"
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lanekeeper-e2e
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority: $d/ca.crt
users:
- name: $user
  user:
    client-certificate: $d/$user.crt
    client-key: $d/$user.key
contexts:
- name: lanekeeper-e2e
  context: {cluster: lanekeeper-e2e, user: $user}
current-context: lanekeeper-e2e
EOF
}

write_commands() { # the command line of each component, so restart can replay it
  local bin=$1 d="$state/pki"
  mkdir -p "$state/run" "$state/logs" "$state/etcd"
  cat >"$state/run/etcd.cmd" <<EOF
exec "$bin/etcd" --name=e2e --data-dir="$state/etcd" \\
  --listen-client-urls=http://127.0.0.1:$etcd_client --advertise-client-urls=http://127.0.0.1:$etcd_client \\
  --listen-peer-urls=http://127.0.0.1:$etcd_peer --initial-advertise-peer-urls=http://127.0.0.1:$etcd_peer \\
  --initial-cluster=e2e=http://127.0.0.1:$etcd_peer --listen-metrics-urls= \\
  --quota-backend-bytes=4294967296 --log-level=warn
EOF
  cat >"$state/run/kube-apiserver.cmd" <<EOF
exec "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:$etcd_client \\
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=$port \\
  --service-cluster-ip-range=10.96.0.0/16 \\
  --client-ca-file="$d/ca.crt" --tls-cert-file="$d/apiserver.crt" --tls-private-key-file="$d/apiserver.key" \\
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \\
  --service-account-key-file="$d/sa.pub" --service-account-signing-key-file="$d/sa.key" \\
  --api-audiences=https://kubernetes.default.svc.cluster.local \\
  --authorization-mode=Node,RBAC \\
  --enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,ResourceQuota,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,PodSecurity,Priority,DefaultTolerationSeconds,TaintNodesByCondition,NodeRestriction \\
  --allow-privileged=true \\
  --audit-policy-file="$here/cluster/audit-policy.yaml" --audit-log-path="$state/audit.log" \\
  --audit-log-maxsize=200 --audit-log-mode=batch --audit-log-batch-max-wait=1s \\
  --v=1
EOF
  cat >"$state/run/kube-controller-manager.cmd" <<EOF
exec "$bin/kube-controller-manager" --kubeconfig="$state/controller-manager.kubeconfig" \\
  --authentication-kubeconfig="$state/controller-manager.kubeconfig" \\
  --authorization-kubeconfig="$state/controller-manager.kubeconfig" \\
  --bind-address=127.0.0.1 --secure-port=0 --leader-elect=false \\
  --use-service-account-credentials=true \\
  --service-account-private-key-file="$d/sa.key" --root-ca-file="$d/ca.crt" \\
  --cluster-signing-cert-file="$d/ca.crt" --cluster-signing-key-file="$d/ca.key" \\
  --controllers=*,-nodeipam --v=1
EOF
  cat >"$state/run/kube-scheduler.cmd" <<EOF
exec "$bin/kube-scheduler" --kubeconfig="$state/scheduler.kubeconfig" \\
  --authentication-kubeconfig="$state/scheduler.kubeconfig" \\
  --authorization-kubeconfig="$state/scheduler.kubeconfig" \\
  --bind-address=127.0.0.1 --secure-port=0 --leader-elect=false --v=1
EOF
  cat >"$state/run/kwok.cmd" <<EOF
exec "$bin/kwok" --kubeconfig="$state/kwok.kubeconfig" --config="$here/cluster/kwok-stages.yaml" \\
  --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \\
  --server-address=127.0.0.1:$kwok_port
EOF
}

kctl() { "$(cat "$state/bin")/kubectl" --kubeconfig "$state/kubeconfig" "$@"; }

api_ready() { kctl get --raw /readyz; }

up() {
  local bin
  if running kube-apiserver; then
    log "already up"
    echo "$state/kubeconfig"
    return 0
  fi
  bin=$(bash "$here/cluster/build.sh" | tail -n 1)
  rm -rf "$state"
  mkdir -p "$state"
  echo "$bin" >"$state/bin"
  certs
  kubeconfig admin "$state/kubeconfig"
  kubeconfig controller-manager "$state/controller-manager.kubeconfig"
  kubeconfig scheduler "$state/scheduler.kubeconfig"
  kubeconfig kwok "$state/kwok.kubeconfig"
  write_commands "$bin"

  start_one etcd
  wait_for etcd 60 curl -sf "http://127.0.0.1:$etcd_client/health"
  start_one kube-apiserver
  wait_for kube-apiserver 120 api_ready
  start_one kube-controller-manager
  start_one kube-scheduler
  start_one kwok
  kctl apply -f "$here/cluster/nodes.yaml" >/dev/null
  # The Node objects are created with their capacity; kwok then runs their
  # status (Ready, addresses, heartbeats).
  wait_for "three Ready nodes" 120 bash -c \
    "[ \"\$(\"$bin/kubectl\" --kubeconfig \"$state/kubeconfig\" get nodes --no-headers 2>/dev/null | awk '\$2==\"Ready\"' | wc -l)\" = 3 ]"
  wait_for "the default ServiceAccount" 60 kctl -n default get serviceaccount default
  log "up: kubernetes $("$bin/kubectl" version --client -o json | sed -n 's/.*"gitVersion": "\(.*\)".*/\1/p' | head -n 1) on https://127.0.0.1:$port"
  log "export KUBECONFIG=$state/kubeconfig PATH=$bin:\$PATH"
  echo "$state/kubeconfig"
}

down() {
  local c i
  for ((i = ${#components[@]} - 1; i >= 0; i--)); do
    c=${components[$i]}
    stop_one "$c"
  done
  rm -rf "$state"
  log "down"
}

status() {
  local c
  for c in "${components[@]}"; do
    if running "$c"; then echo "$c running (pid $(cat "$state/run/$c.pid"))"; else echo "$c stopped"; fi
  done
}

component() { # validates a component name
  local c
  for c in "${components[@]}"; do [ "$c" = "$1" ] && return 0; done
  log "unknown component '$1' (one of: ${components[*]})"
  exit 2
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  bin) bin_dir ;;
  stop) component "${2:-}"; stop_one "$2" ;;
  start)
    component "${2:-}"; start_one "$2"
    [ "$2" != kube-apiserver ] || wait_for kube-apiserver 120 api_ready
    ;;
  restart)
    component "${2:-}"; stop_one "$2"; start_one "$2"
    [ "$2" != kube-apiserver ] || wait_for kube-apiserver 120 api_ready
    ;;
  *)
    echo "usage: $0 up|down|status|bin|start COMPONENT|stop COMPONENT|restart COMPONENT" >&2
    exit 2
    ;;
esac

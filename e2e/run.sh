#!/usr/bin/env bash
# End-to-end suite on a kind cluster. Needs docker, kind, kubectl, helm and
# cargo. Creates the cluster (e2e/kind-config.yaml), gives the GPU node an
# nvidia.com/gpu extended resource, builds and loads the image, installs the
# fake model servers and lanekeeper (Helm), runs tests/e2e_kind.rs, collects
# logs and events on failure, and deletes the cluster.
#
#   bash e2e/run.sh                 # everything
#   KEEP_CLUSTER=1 bash e2e/run.sh  # leave the cluster up afterwards
#
# Environment: CLUSTER (kind cluster name, default lanekeeper-e2e), IMAGE
# (default lanekeeper:e2e), ARTIFACTS (where logs go on failure, default
# e2e/artifacts), KEEP_CLUSTER=1.
set -euo pipefail

cd "$(dirname "$0")/.."

CLUSTER="${CLUSTER:-lanekeeper-e2e}"
IMAGE="${IMAGE:-lanekeeper:e2e}"
ARTIFACTS="${ARTIFACTS:-e2e/artifacts}"
RELEASE=lanekeeper
RELEASE_NS=lanekeeper-system
POOL_NS=ai-platform
KUBECONFIG_FILE="$(mktemp)"
export KUBECONFIG="${KUBECONFIG_FILE}"

for tool in docker kind kubectl helm cargo; do
  if ! command -v "${tool}" >/dev/null 2>&1; then
    echo "e2e/run.sh: ${tool} is required but not installed" >&2
    exit 2
  fi
done

collect() {
  echo "== collecting logs and events into ${ARTIFACTS}"
  mkdir -p "${ARTIFACTS}"
  kubectl get nodes -o wide >"${ARTIFACTS}/nodes.txt" 2>&1 || true
  kubectl get all,leases,configmaps -A -o wide >"${ARTIFACTS}/objects.txt" 2>&1 || true
  kubectl get capacityprofiles,lanecontracts,degradationpolicies -A -o yaml >"${ARTIFACTS}/lanekeeper-objects.yaml" 2>&1 || true
  kubectl get events -A --sort-by=.lastTimestamp >"${ARTIFACTS}/events.txt" 2>&1 || true
  kubectl -n "${POOL_NS}" get pods -o yaml >"${ARTIFACTS}/pool-pods.yaml" 2>&1 || true
  local pod
  for pod in $(kubectl -n "${RELEASE_NS}" get pods -o name 2>/dev/null); do
    kubectl -n "${RELEASE_NS}" logs "${pod}" --all-containers --prefix >"${ARTIFACTS}/$(basename "${pod}").log" 2>&1 || true
    kubectl -n "${RELEASE_NS}" logs "${pod}" --all-containers --prefix --previous >"${ARTIFACTS}/$(basename "${pod}").previous.log" 2>&1 || true
  done
  kind export logs "${ARTIFACTS}/kind" --name "${CLUSTER}" >/dev/null 2>&1 || true
}

finish() {
  local rc=$?
  if [[ ${rc} -ne 0 ]]; then
    echo "== e2e FAILED (exit ${rc})"
    collect
  fi
  if [[ "${KEEP_CLUSTER:-0}" == "1" ]]; then
    echo "== keeping cluster ${CLUSTER} (KUBECONFIG=${KUBECONFIG_FILE})"
  else
    echo "== deleting cluster ${CLUSTER}"
    kind delete cluster --name "${CLUSTER}" >/dev/null 2>&1 || true
    rm -f "${KUBECONFIG_FILE}"
  fi
  exit "${rc}"
}
trap finish EXIT

echo "== creating kind cluster ${CLUSTER}"
kind create cluster --name "${CLUSTER}" --config e2e/kind-config.yaml --kubeconfig "${KUBECONFIG_FILE}" --wait 120s

echo "== advertising nvidia.com/gpu on the GPU node"
gpu_node="$(kubectl get nodes -l nvidia.com/gpu.present=true -o jsonpath='{.items[0].metadata.name}')"
kubectl patch node "${gpu_node}" --subresource=status --type=json -p '[
  {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"},
  {"op": "add", "path": "/status/allocatable/nvidia.com~1gpu", "value": "8"}
]'

echo "== building and loading ${IMAGE}"
docker build -t "${IMAGE}" .
kind load docker-image "${IMAGE}" --name "${CLUSTER}"

echo "== installing lanekeeper with Helm"
helm install "${RELEASE}" charts/lanekeeper \
  --namespace "${RELEASE_NS}" --create-namespace \
  --set image.repository="${IMAGE%%:*}" \
  --set image.tag="${IMAGE##*:}" \
  --set image.pullPolicy=Never \
  --set controller.resyncSeconds=2 \
  --set controller.logLevel=info \
  --set leaderElection.leaseDurationSeconds=6 \
  --wait --timeout 3m

echo "== installing the fake model servers"
kubectl apply -f e2e/fake-pool.yaml
# The pods carry the lanekeeper.dev/serving readiness gate: they turn Ready
# only once a CapacityProfile selects them (the suite applies it), so wait
# for their containers, not for the rollout.
kubectl -n "${POOL_NS}" wait pod -l app=vllm-agent-assist \
  --for=condition=ContainersReady --timeout=3m

echo "== running the suite"
LANEKEEPER_E2E=1 \
LANEKEEPER_E2E_RELEASE="${RELEASE}" \
LANEKEEPER_E2E_RELEASE_NAMESPACE="${RELEASE_NS}" \
  cargo test --locked --test e2e_kind -- --test-threads=1 --nocapture

echo "== e2e passed"

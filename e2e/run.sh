#!/usr/bin/env bash
# End-to-end suite on a kind cluster. Needs docker, kind, kubectl, helm,
# cargo, and prometheus and promtool (Debian's `prometheus`: each test runs a
# real Prometheus). Creates the cluster (e2e/kind-config.yaml), gives the two
# GPU nodes an nvidia.com/gpu extended resource, builds and loads the image,
# runs the e2e suite (the test binary tests/e2e/, the server half of cel_rules included:
# the same suite CI runs on the local control plane of e2e/cluster.sh, less
# the three tests that need its processes), collects logs and events on
# failure, and deletes the cluster.
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
RELEASE_NS=lanekeeper-system
KUBECONFIG_FILE="$(mktemp)"
export KUBECONFIG="${KUBECONFIG_FILE}"

for tool in docker kind kubectl helm cargo prometheus promtool; do
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
  kubectl get pods -A -l app=vllm-agent-assist -o yaml >"${ARTIFACTS}/pool-pods.yaml" 2>&1 || true
  cp -r target/e2e "${ARTIFACTS}/controller-logs" 2>/dev/null || true
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

echo "== advertising nvidia.com/gpu: 8 on the GPU nodes"
for gpu_node in $(kubectl get nodes -l nvidia.com/gpu.present=true -o jsonpath='{.items[*].metadata.name}'); do
  kubectl patch node "${gpu_node}" --subresource=status --type=json -p '[
    {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"},
    {"op": "add", "path": "/status/allocatable/nvidia.com~1gpu", "value": "8"}
  ]'
done

echo "== building and loading ${IMAGE}"
docker build -t "${IMAGE}" .
kind load docker-image "${IMAGE}" --name "${CLUSTER}"

echo "== running the suite (the same one CI runs on e2e/cluster.sh)"
# The suite installs the chart itself (its ServiceAccount and RBAC, and a
# second release for the install test, with the image loaded above), runs
# the controller out of cluster with that ServiceAccount's token, and creates
# its pool Deployments on the GPU nodes. No test may skip, except the three
# that need the local control plane's processes (restarts, the audit log),
# which kind does not have: they are left out by name.
LANEKEEPER_E2E=1 \
LANEKEEPER_REQUIRE_CLUSTER=1 \
LANEKEEPER_REQUIRE_PROMETHEUS=1 \
LANEKEEPER_E2E_IMAGE="${IMAGE}" \
  cargo test --locked --test e2e -- \
    --skip apiserver_and_etcd_restarts_mid_incident \
    --skip steady_state_makes_no_api_calls \
    --skip the_charts_rules_are_exactly_what_the_controller_calls

echo "== e2e passed"

#!/usr/bin/env bash
# Runs a command against the local control plane (e2e/cluster.sh): starts it
# (building the components first when they are not cached), exports
# KUBECONFIG, LANEKEEPER_E2E=1, LANEKEEPER_REQUIRE_CLUSTER=1 and
# LANEKEEPER_REQUIRE_PROMETHEUS=1 (so no e2e test may skip, for want of the
# cluster, its local processes or Prometheus) and the components' directory
# on PATH (kubectl, helm), runs the command, and stops the cluster again,
# also when the command fails. A cluster that was already up is used and
# left up.
#
#   bash e2e/with-cluster.sh cargo test --locked
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
state=${LANEKEEPER_CLUSTER_STATE:-$here/.cluster}
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }

started=0
# (status is read whole first: grep -q exiting early would fail the pipe under
# pipefail and make a running cluster look stopped.)
status=$(bash "$here/cluster.sh" status 2>/dev/null || true)
if ! grep -q '^kube-apiserver running' <<<"$status"; then
  started=1
  trap 'bash "$here/cluster.sh" down' EXIT
fi
kubeconfig=$(bash "$here/cluster.sh" up | tail -n 1)
[ "$started" = 1 ] || echo "with-cluster: using the cluster that was already up" >&2
export KUBECONFIG="$kubeconfig" LANEKEEPER_E2E=1 LANEKEEPER_REQUIRE_CLUSTER=1 LANEKEEPER_REQUIRE_PROMETHEUS=1
PATH="$(cat "$state/bin"):$PATH"
export PATH
"$@"

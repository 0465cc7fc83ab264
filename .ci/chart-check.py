#!/usr/bin/env python3
"""Lint, render and validate the Helm chart; keep manifests/install.yaml in sync.

Uses Helm v4's own library (PyPI `helm-python-sdk`) and strict offline
OpenAPI validation (PyPI `kubernetes-validate`). No cluster, no helm binary.

    python3 .ci/chart-check.py           # check (CI)
    python3 .ci/chart-check.py --write   # copy crds/ into the chart and
                                         # regenerate manifests/install.yaml

Checks:
  * every value in values.yaml has a comment;
  * values.schema.json accepts the default and example values and rejects
    a list of bad ones;
  * `helm lint --strict` with the default and each non-default value set;
  * every manifest rendered with each value set validates strictly against
    the Kubernetes OpenAPI schemas (prometheus-operator kinds, which have no
    built-in schema, get a structural check);
  * a deployed shared store with a password gets it off its command line,
    and, with valkey-server or redis-server on PATH, runs from the rendered
    command and args and asks for it (chart_store_password.py);
  * every rendered PodDisruptionBudget allows at least one eviction of the
    replicas its Deployment renders (else node drains block on it);
  * the chart's crds/ equal the top-level crds/ byte for byte;
  * manifests/install.yaml is the default render (Namespace, CRDs, templates).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import yaml

from chart_store_password import check_store_password

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "lanekeeper"
INSTALL = ROOT / "manifests" / "install.yaml"
RELEASE = "lanekeeper"
NAMESPACE = "lanekeeper-system"
KUBE_VERSION = "1.33.0"

OBJECTIVE_RULES = (ROOT / "examples" / "objectives" / "rules.yaml").read_text()

# Value sets rendered besides the defaults. Each must lint, render and validate.
VALUE_SETS: dict[str, dict] = {
    "namespaced": {
        "watchNamespaces": ["ai-platform", "batch-jobs"],
        "rbac": {"extraScaleTargets": [{"apiGroup": "argoproj.io", "resource": "rollouts"}]},
    },
    "monitoring": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "podMonitor": {"enabled": True},
        "dashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "lanekeeper"}},
    },
    "single-no-election": {
        "replicaCount": 1,
        "leaderElection": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
        "topologySpread": {"enabled": False},
        "rbac": {"hpaMinReplicas": False, "drain": False, "secrets": False},
        "serviceAccount": {"create": False, "name": "existing-sa"},
        "image": {"digest": "sha256:" + "a" * 64},
        "controller": {"logFormat": "text", "extraArgs": ["--resync-seconds=30"],
                       "extraEnv": [{"name": "EXTRA", "value": "1"}]},
        "nodeSelector": {"node-pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
        "podDisruptionBudget_unused": None,
    },
    "gateway": {
        "gateway": {"enabled": True, "profile": "agent-assist", "profileNamespace": "ai-platform",
                    "routes": {"agent-large": "http://vllm-agent-large.ai-platform:8000",
                               "batch-medium": "http://vllm-batch.ai-platform:8000"}},
    },
    "gateway-observe": {
        "gateway": {"enabled": True, "profile": "agent-assist", "profileNamespace": "ai-platform",
                    "observe": True, "routes": {"agent-large": "http://vllm-agent-large.ai-platform:8000"},
                    "logLevel": "lanekeeper=debug,info"},
        "controller": {"logLevel": "warn"},
    },
    "gateway-auth": {
        "gateway": {"enabled": True, "profile": "agent-assist", "profileNamespace": "ai-platform",
                    "routes": {"agent-large": "http://vllm-agent-large.ai-platform:8000"},
                    "auth": {"apiKeyHeader": "x-api-key", "tokenAudience": "gateway.example",
                             "jwksConfigMaps": ["idp-jwks"], "credentialsSecret": "gateway-credentials"}},
    },
    "gateway-named-secrets": {
        "gateway": {"enabled": True, "profile": "agent-assist", "profileNamespace": "ai-platform",
                    "routes": {"agent-large": "http://vllm-agent-large.ai-platform:8000"},
                    "auth": {"apiKeySecretNames": ["agent-keys", "batch-keys"]}},
    },
    "gateway-shared-state": {
        "gateway": {"enabled": True, "profile": "agent-assist", "profileNamespace": "ai-platform",
                    "routes": {"agent-large": "http://vllm-agent-large.ai-platform:8000"},
                    "sharedState": {"address": "rediss://valkey.lanekeeper-system:6380",
                                    "passwordSecret": "valkey-auth", "timeoutMillis": 20,
                                    "caSecret": "valkey-ca", "caKey": "ca.pem"}},
    },
    "gateway-shared-state-deployed": {
        "gateway": {"enabled": True, "profile": "agent-assist", "profileNamespace": "ai-platform",
                    "replicaCount": 3,
                    "routes": {"agent-large": "http://vllm-agent-large.ai-platform:8000"},
                    "sharedState": {"deploy": True, "passwordSecret": "valkey-auth",
                                    "store": {"image": "docker.io/valkey/valkey:8.1", "maxMemory": "64mb"}}},
    },
    "gateway-tokenizers": {
        "gateway": {"enabled": True, "profile": "agent-assist", "profileNamespace": "ai-platform",
                    "routes": {"agent-large": "http://vllm-agent-large.ai-platform:8000",
                               "batch-medium": "http://vllm-batch.ai-platform:8000"},
                    "tokenizers": [
                        {"route": "agent-large", "volume": {"persistentVolumeClaim": {"claimName": "llama-tokenizer", "readOnly": True}}},
                        {"route": "batch-medium", "file": "qwen/tokenizer.json",
                         "volume": {"image": {"reference": "registry.example/model-files:1", "pullPolicy": "IfNotPresent"}}},
                    ]},
    },
    "gateway-trusting": {
        "gateway": {"enabled": True, "profile": "agent-assist", "profileNamespace": "ai-platform",
                    "routes": {"agent-large": "http://vllm-agent-large.ai-platform:8000"},
                    "auth": {"trustLaneHeader": True}},
    },
    "gateway-tls": {
        "gateway": {"enabled": True, "profile": "agent-assist", "profileNamespace": "ai-platform",
                    "bindAddress": "[::]",
                    "routes": {"agent-large": "https://vllm-agent-large.ai-platform:8443"},
                    "tls": {"secretName": "gateway-tls", "clientCASecretName": "clients-ca",
                            "clientCert": "optional"},
                    "auth": {"credentialsSecret": "gateway-credentials"}},
        "controller": {"bindAddress": "[::]"},
    },
    # Values the schema accepts that end in ':' (a plain YAML scalar ending
    # in ':' is a map key, not a string): every templated arg is quoted.
    "gateway-colon-ended-values": {
        "gateway": {"enabled": True, "profile": "agent-assist", "profileNamespace": "ai-platform",
                    "routes": {"agent-large": "http://vllm-agent-large.ai-platform:"},
                    "sharedState": {"address": "redis://valkey.lanekeeper-system:"},
                    "auth": {"tokenAudience": "urn:lanekeeper:"}},
    },
    # The rules `lanekeeper rules -f examples/objectives` prints (kept equal
    # to that command's output by tests/it/rules_cli.rs).
    "objective-rules-configmap": {
        "objectiveRules": {"enabled": True, "rules": OBJECTIVE_RULES},
    },
    "objective-rules-prometheusrule": {
        "objectiveRules": {"enabled": True, "kind": "PrometheusRule", "rules": OBJECTIVE_RULES,
                           "labels": {"release": "kube-prometheus-stack"}},
    },
    # One replica of each: a PodDisruptionBudget must still let a node drain.
    "single-replica": {
        "replicaCount": 1,
        "gateway": {"enabled": True, "profile": "agent-assist", "profileNamespace": "ai-platform",
                    "replicaCount": 1, "routes": {"agent-large": "http://vllm-agent-large.ai-platform:8000"}},
    },
    "pdb-max-unavailable": {
        "podDisruptionBudget": {"maxUnavailable": "50%"},
        "fullnameOverride": "lk",
    },
}
# Drop helper keys that are not values.
VALUE_SETS["single-no-election"].pop("podDisruptionBudget_unused")

# Values the schema must reject (each a small override of the defaults).
BAD_VALUES: list[tuple[str, dict]] = [
    ("unknown top-level key", {"replicas": 2}),
    ("unknown nested key", {"controller": {"resync": 5}}),
    ("negative replicas", {"replicaCount": -1}),
    ("replicas as a string", {"replicaCount": "2"}),
    ("bad log format", {"controller": {"logFormat": "yaml"}}),
    ("tokenizer without volume", {"gateway": {"tokenizers": [{"route": "agent-large"}]}}),
    ("tokenizer file escapes", {"gateway": {"tokenizers": [{"route": "a", "file": "../etc/passwd", "volume": {"emptyDir": {}}}]}}),
    ("tokenizer absolute file", {"gateway": {"tokenizers": [{"route": "a", "file": "/etc/passwd", "volume": {"emptyDir": {}}}]}}),
    ("tokenizer empty volume", {"gateway": {"tokenizers": [{"route": "a", "volume": {}}]}}),
    ("tokenizer unknown key", {"gateway": {"tokenizers": [{"route": "a", "volume": {"emptyDir": {}}, "mountPath": "/x"}]}}),
    ("shared state not redis", {"gateway": {"sharedState": {"address": "http://valkey:6379"}}}),
    ("shared state timeout 0", {"gateway": {"sharedState": {"timeoutMillis": 0}}}),
    ("shared store port 0", {"gateway": {"sharedState": {"store": {"port": 0}}}}),
    ("shared store bad maxMemory", {"gateway": {"sharedState": {"store": {"maxMemory": "lots"}}}}),
    ("shared store unknown key", {"gateway": {"sharedState": {"store": {"replicas": 3}}}}),
    ("resync below 1", {"controller": {"resyncSeconds": 0}}),
    ("lease shorter than 2 s", {"leaderElection": {"leaseDurationSeconds": 1}}),
    ("two replicas without leader election", {"leaderElection": {"enabled": False}}),
    ("namespace not DNS-1123", {"watchNamespaces": ["Bad_NS"]}),
    ("duplicate namespaces", {"watchNamespaces": ["a", "a"]}),
    ("bad pull policy", {"image": {"pullPolicy": "Sometimes"}}),
    ("API-key Secret name not a name", {"gateway": {"auth": {"apiKeySecretNames": ["Agent Keys"]}}}),
    ("bad digest", {"image": {"digest": "md5:abc"}}),
    ("scale target without resource", {"rbac": {"extraScaleTargets": [{"apiGroup": "argoproj.io"}]}}),
    ("bad whenUnsatisfiable", {"topologySpread": {"whenUnsatisfiable": "Maybe"}}),
    ("port out of range", {"service": {"port": 70000}}),
    ("bad scrape interval", {"serviceMonitor": {"interval": "30 seconds"}}),
    ("bad PDB value", {"podDisruptionBudget": {"minAvailable": "half"}}),
    ("gateway enabled without a profile", {"gateway": {"enabled": True}}),
    ("gateway route without http://", {"gateway": {"routes": {"agent-large": "vllm:8000"}}}),
    ("gateway header with a space", {"gateway": {"laneHeader": "x lane"}}),
    ("gateway API-key header with a space", {"gateway": {"auth": {"apiKeyHeader": "x key"}}}),
    ("gateway unknown auth key", {"gateway": {"auth": {"trust": True}}}),
    ("bind address with a port", {"gateway": {"bindAddress": "0.0.0.0:80"}}),
    ("bind address a host name", {"controller": {"bindAddress": "localhost"}}),
    ("client cert mode unknown", {"gateway": {"tls": {"clientCert": "maybe"}}}),
    ("objective rules of an unknown kind", {"objectiveRules": {"kind": "Recording"}}),
]

MONITOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def fail(msg: str) -> None:
    print(f"chart-check: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check_value_comments() -> None:
    """Every key line in values.yaml is preceded by a comment line (or is
    inside a block that the previous commented key introduced: list items and
    maps given as defaults, e.g. securityContext's contents)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    key_re = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):")
    # Keys whose whole subtree is one documented default value.
    opaque_indent: int | None = None
    missing = []
    for n, line in enumerate(lines):
        m = key_re.match(line)
        if not m:
            continue
        indent = len(m.group(1))
        if opaque_indent is not None and indent > opaque_indent:
            continue
        opaque_indent = None
        prev = lines[n - 1].strip() if n > 0 else ""
        rest = line[m.end():].strip()
        if prev.startswith("#"):
            if rest == "" and not _is_section(lines, n):
                # A documented map default: its contents are the value.
                opaque_indent = indent
            continue
        if rest == "" and _is_section(lines, n):
            # A section header (its children carry the comments).
            continue
        missing.append(f"values.yaml:{n + 1}: {line.strip()}")
    if missing:
        fail("values without a comment:\n  " + "\n  ".join(missing))


def _is_section(lines: list[str], n: int) -> bool:
    """A key with no value whose first child line is a comment: a section."""
    for nxt in lines[n + 1:]:
        if nxt.strip():
            return nxt.strip().startswith("#")
    return False


def check_schema(chart: helm.Chart) -> None:
    chart.validate_schema(chart.merge_values({}))
    for name, values in VALUE_SETS.items():
        try:
            chart.validate_schema(chart.merge_values(values))
        except helm.HelmError as e:
            fail(f"value set {name!r} rejected by values.schema.json: {e}")
    for name, bad in BAD_VALUES:
        try:
            chart.validate_schema(chart.merge_values(bad))
        except helm.HelmError:
            continue
        fail(f"values.schema.json accepts bad values ({name}): {json.dumps(bad)}")
    print(f"schema: defaults and {len(VALUE_SETS)} value sets accepted, {len(BAD_VALUES)} bad sets rejected")


def lint(values: dict | None, label: str) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    if problems or report.get("errors"):
        fail(f"helm lint ({label}): {json.dumps(problems or report.get('errors'), indent=2)}")


def render(chart: helm.Chart, values: dict | None) -> list[tuple[str, str]]:
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for path in sorted(out):
        if path.endswith("NOTES.txt") or not out[path].strip():
            continue
        for text in re.split(r"(?m)^---\s*$", out[path]):
            if text.strip() and yaml.safe_load(text) is not None:
                docs.append((path, text.strip("\n") + "\n"))
    return docs


def validate(docs: list[tuple[str, str]], label: str) -> None:
    kinds = []
    for path, text in docs:
        obj = yaml.safe_load(text)
        kind = obj.get("kind")
        kinds.append(kind)
        if kind in MONITOR_KINDS:
            check_monitor(obj, path)
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            fail(f"{label}: {path}: {kind} {obj['metadata'].get('name')}: {e.message} at {list(e.path)}")
        except kubernetes_validate.SchemaNotFoundError as e:
            fail(f"{label}: {path}: no schema for {kind}: {e}")
    print(f"render {label}: {len(docs)} manifests valid ({', '.join(sorted(set(kinds)))})")


def check_monitor(obj: dict, path: str) -> None:
    """prometheus-operator kinds: the fields the chart sets, by shape."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1", path
    spec = obj["spec"]
    if obj["kind"] == "PrometheusRule":
        if spec != {"groups": yaml.safe_load(OBJECTIVE_RULES)["groups"]}:
            fail(f"{path}: the PrometheusRule must carry exactly the groups of `lanekeeper rules`")
        return
    eps = spec["endpoints"] if obj["kind"] == "ServiceMonitor" else spec["podMetricsEndpoints"]
    allowed = {"port", "path", "interval", "scrapeTimeout"}
    for ep in eps:
        if set(ep) - allowed:
            fail(f"{path}: unexpected endpoint fields {set(ep) - allowed}")
        if ep["port"] != "metrics":
            fail(f"{path}: endpoint port must be the named port 'metrics'")
    if set(spec) - {"selector", "namespaceSelector", "endpoints", "podMetricsEndpoints"}:
        fail(f"{path}: unexpected spec fields")


def structural_checks(label: str, docs: list[tuple[str, str]], values: dict) -> None:
    objs = [yaml.safe_load(t) for _, t in docs]
    by_kind: dict[str, list[dict]] = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    dep = by_kind["Deployment"][0]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    sc = c["securityContext"]
    if not (sc.get("readOnlyRootFilesystem") and sc.get("runAsNonRoot") and sc["capabilities"]["drop"] == ["ALL"]
            and sc.get("allowPrivilegeEscalation") is False and sc["seccompProfile"]["type"] == "RuntimeDefault"):
        fail(f"{label}: container security context is not locked down: {sc}")
    args = c["args"]
    namespaces = values.get("watchNamespaces", [])
    if [a for a in args if a.startswith("--namespace=")] != [f"--namespace={n}" for n in namespaces]:
        fail(f"{label}: --namespace flags {args} do not match watchNamespaces {namespaces}")
    roles = by_kind.get("Role", [])
    if namespaces:
        if "ClusterRole" in by_kind and any(not r["metadata"]["name"].endswith("-crds") for r in by_kind["ClusterRole"]):
            fail(f"{label}: namespaced mode must not render a ClusterRole beyond the CRD check")
        got = sorted(r["metadata"]["namespace"] for r in roles if not r["metadata"]["name"].endswith("-leader-election"))
        if got != sorted(namespaces):
            fail(f"{label}: Roles in {got}, expected {namespaces}")
    check_log_level(label, c, values.get("controller", {}))
    if c["livenessProbe"]["httpGet"]["path"] != "/healthz" or c["readinessProbe"]["httpGet"]["path"] != "/readyz":
        fail(f"{label}: probes must be /healthz and /readyz")
    rules = values.get("objectiveRules", {})
    if rules.get("enabled") and rules.get("kind", "Auto") != "PrometheusRule":
        # Offline there is no PrometheusRule API: Auto gives the ConfigMap.
        cms = [o for o in by_kind.get("ConfigMap", []) if o["metadata"]["name"].endswith("-objectives")]
        if [c["data"]["lanekeeper-objectives.rules.yaml"] for c in cms] != [rules["rules"]]:
            fail(f"{label}: the objectives ConfigMap must hold the rule file as given")
    check_pdbs(label, by_kind)
    gw = values.get("gateway", {})
    if gw.get("enabled"):
        # The gateway reads one ConfigMap, and its Role names that one.
        want = f"{gw['profile']}-lanes" + ("-observe" if gw.get("observe") else "")
        gdep = [d for d in by_kind["Deployment"] if d["metadata"]["name"].endswith("-gateway")]
        gargs = gdep[0]["spec"]["template"]["spec"]["containers"][0]["args"] if gdep else []
        check_log_level(label, gdep[0]["spec"]["template"]["spec"]["containers"][0], gw)
        if f"--configmap={gw['profileNamespace']}/{want}" not in gargs:
            fail(f"{label}: the gateway must read {want}: {gargs}")
        # Values reach the args verbatim, as strings (quoted in the template).
        want_args = [f"--route={r}={u}" for r, u in gw.get("routes", {}).items()]
        if not gw.get("auth", {}).get("trustLaneHeader"):
            want_args.append(f"--token-audience={gw.get('auth', {}).get('tokenAudience', 'lanekeeper')}")
        if gw.get("sharedState", {}).get("address") and not gw["sharedState"].get("deploy"):
            want_args.append(f"--shared-state={gw['sharedState']['address']}")
        check_shared_state_ca(label, gdep[0]["spec"]["template"]["spec"] if gdep else {}, gw)
        if missing := [a for a in want_args if a not in gargs]:
            fail(f"{label}: the gateway's args lack {missing}: {gargs}")
        names = [n for r in roles if r["metadata"]["name"].endswith("-gateway")
                 for rule in r["rules"] for n in rule.get("resourceNames", [])]
        if names != [want]:
            fail(f"{label}: the gateway's Role must name only {want}: {names}")
        # Who may use a lane: no identity access when it trusts the header;
        # else Secrets list/watch in the profile's namespace only, TokenReview
        # create and get on the cluster's ServiceAccount keys, nothing more.
        auth = gw.get("auth", {})
        trusting = auth.get("trustLaneHeader", False)
        if trusting != ("--trust-lane-header" in gargs):
            fail(f"{label}: --trust-lane-header must follow gateway.auth.trustLaneHeader: {gargs}")
        ident = [r for r in roles if r["metadata"]["name"].endswith("-gateway-identity")]
        review = [r for r in by_kind.get("ClusterRole", []) if r["metadata"]["name"].endswith("-gateway-tokenreview")]
        if trusting and (ident or review):
            fail(f"{label}: a gateway that trusts the lane header needs no Secret or TokenReview access")
        if not trusting:
            if len(ident) != 1 or ident[0]["metadata"]["namespace"] != gw["profileNamespace"]:
                fail(f"{label}: one identity Role in the profile's namespace: {ident}")
            secrets = [r for r in ident[0]["rules"] if r["resources"] == ["secrets"]]
            if [r["verbs"] for r in secrets] != [["list", "watch"]]:
                fail(f"{label}: Secrets list and watch only: {ident[0]['rules']}")
            # Named Secrets only, when the values name them.
            if [r.get("resourceNames") for r in secrets] != [auth.get("apiKeySecretNames") or None]:
                fail(f"{label}: the Secrets rule must name {auth.get('apiKeySecretNames')}: {secrets}")
            if len(review) != 1 or review[0]["rules"] != [
                {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                {"nonResourceURLs": ["/openid/v1/jwks"], "verbs": ["get"]},
            ]:
                fail(f"{label}: TokenReview create and the ServiceAccount keys' get only: {review}")


def check_shared_state_ca(label: str, pod: dict, gw: dict) -> None:
    """The shared store's CA Secret, when given, is mounted and passed as
    --shared-state-ca; without one, neither."""
    shared = gw.get("sharedState", {})
    args = pod.get("containers", [{}])[0].get("args", [])
    flag = "--shared-state-ca=/etc/lanekeeper/shared-state-ca/ca.crt"
    vols = [v for v in pod.get("volumes", []) if v["name"] == "shared-state-ca"]
    if not shared.get("caSecret") or not (shared.get("address") or shared.get("deploy")):
        if flag in args or vols:
            fail(f"{label}: no sharedState.caSecret, yet a shared-state CA is mounted or passed")
        return
    want = {"secretName": shared["caSecret"], "items": [{"key": shared.get("caKey", "ca.crt"), "path": "ca.crt"}]}
    mounts = [m for m in pod["containers"][0].get("volumeMounts", []) if m["name"] == "shared-state-ca"]
    if flag not in args or [v.get("secret") for v in vols] != [want] or len(mounts) != 1:
        fail(f"{label}: sharedState.caSecret must be mounted and passed as {flag}: {args} {vols} {mounts}")


def check_log_level(label: str, container: dict, component_values: dict) -> None:
    """A container's RUST_LOG is its own component's logLevel (default info)."""
    want = component_values.get("logLevel", "info")
    got = [e.get("value") for e in container["env"] if e["name"] == "RUST_LOG"]
    if got != [want]:
        fail(f"{label}: container {container['name']}: RUST_LOG {got}, expected [{want!r}] from its logLevel")


def check_pdbs(label: str, by_kind: dict[str, list[dict]]) -> None:
    """Every PodDisruptionBudget selects one Deployment and, for the replicas
    rendered, allows at least one voluntary disruption (else every node
    drain blocks on it)."""
    deps = by_kind.get("Deployment", [])
    for pdb in by_kind.get("PodDisruptionBudget", []):
        name, sel = pdb["metadata"]["name"], pdb["spec"]["selector"]["matchLabels"]
        matched = [d for d in deps if sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        if len(matched) != 1:
            fail(f"{label}: PodDisruptionBudget {name} selects {len(matched)} Deployments, not 1")
        replicas = matched[0]["spec"]["replicas"]
        if replicas > 0 and pdb_disruptions_allowed(pdb["spec"], replicas) < 1:
            fail(f"{label}: PodDisruptionBudget {name} allows no disruption of {replicas} replica(s): "
                 f"every node drain would block on it ({pdb['spec']})")


def pdb_disruptions_allowed(spec: dict, replicas: int) -> int:
    """As the disruption controller counts them with every pod healthy:
    a percentage is of the replicas, rounded up."""
    def scaled(v: int | str) -> int:
        return -(-int(v[:-1]) * replicas // 100) if isinstance(v, str) else v
    if "maxUnavailable" in spec:
        return scaled(spec["maxUnavailable"])
    return replicas - scaled(spec["minAvailable"])


def check_crd_copies(crds: Path, write: bool) -> None:
    top = {p.name: p.read_bytes() for p in crds.glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    if top == chart:
        return
    if not write:
        fail("charts/lanekeeper/crds/ differs from crds/: run `python3 .ci/chart-check.py --write`")
    for name in set(chart) - set(top):
        (CHART / "crds" / name).unlink()
    for name, data in top.items():
        (CHART / "crds" / name).write_bytes(data)
    print("copied crds/ into charts/lanekeeper/crds/")


def install_yaml(docs: list[tuple[str, str]]) -> str:
    header = (
        "# lanekeeper install manifests: the Helm chart charts/lanekeeper rendered with\n"
        f"# its default values (release {RELEASE!r}, namespace {NAMESPACE!r}), preceded by\n"
        "# the namespace and the CRDs. Generated by .ci/chart-check.py --write; do not edit.\n"
        "#\n"
        "#   kubectl apply --server-side -f manifests/install.yaml\n"
    )
    parts = [header, "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + NAMESPACE + "\n"]
    for crd in sorted((CHART / "crds").glob("*.yaml")):
        text = crd.read_text()
        parts.append(text if text.startswith("---") else "---\n" + text)
    for path, text in docs:
        parts.append(f"---\n# Source: {path}\n{text}")
    return "".join(parts)


def gateway_yaml(docs: list[tuple[str, str]]) -> str:
    header = (
        "# lanekeeper gateway for the INC-47 profile (ai-platform/agent-assist), as the\n"
        f"# Helm chart renders it with gateway.enabled (release {RELEASE!r}, namespace\n"
        f"# {NAMESPACE!r}; the \"gateway\" value set of .ci/chart-check.py). Install the\n"
        "# controller first (manifests/install.yaml). Generated by .ci/chart-check.py\n"
        "# --write; do not edit.\n"
        "#\n"
        "#   kubectl apply -f manifests/examples/gateway.yaml\n"
    )
    return header + "".join(f"---\n{text}" for _, text in docs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true",
                    help="copy crds/ into the chart and regenerate manifests/install.yaml")
    ap.add_argument("--crds-dir", type=Path, default=ROOT / "crds",
                    help="where the generated CRDs are (default: crds/)")
    args = ap.parse_args()

    print(f"helm library {helm.helm_sdk_version()}, kubernetes-validate {kubernetes_validate.__version__}")
    check_value_comments()
    check_crd_copies(args.crds_dir, args.write)
    chart = helm.Chart.load(CHART)
    check_schema(chart)

    default_docs: list[tuple[str, str]] = []
    gateway_docs: list[tuple[str, str]] = []
    for label, values in [("default", {}), *VALUE_SETS.items()]:
        lint(copy.deepcopy(values) or None, label)
        docs = render(chart, copy.deepcopy(values) or None)
        validate(docs, label)
        structural_checks(label, docs, values)
        for path, text in docs:
            obj = yaml.safe_load(text)
            if obj["kind"] == "Deployment" and path.endswith("templates/shared-state.yaml") \
                    and values.get("gateway", {}).get("sharedState", {}).get("passwordSecret"):
                check_store_password(label, obj["spec"]["template"]["spec"]["containers"][0], fail)
        if label == "default":
            default_docs = docs
        if label == "gateway":
            gateway_docs = [(p, t) for p, t in docs if p.endswith("templates/gateway.yaml")]
    # A tokenizer for a route the gateway has no URL for would stop every
    # gateway pod at start: the chart refuses to render it.
    unknown_route = copy.deepcopy(VALUE_SETS["gateway-tokenizers"])
    unknown_route["gateway"]["tokenizers"][0]["route"] = "no-such-route"
    try:
        render(chart, unknown_route)
        fail("gateway.tokenizers with a route not in gateway.routes rendered")
    except helm.HelmError as e:
        if "is not a key of gateway.routes" not in str(e):
            fail(f"gateway.tokenizers with an unknown route failed for another reason: {e}")
    print("render: a tokenizer of an unknown route is refused")
    # manifests/examples/gateway.yaml: the gateway for the INC-47 profile,
    # as the chart renders it with gateway.enabled (the "gateway" value set).
    want_gw = gateway_yaml(gateway_docs)
    gw_path = ROOT / "manifests" / "examples" / "gateway.yaml"
    if args.write:
        gw_path.write_text(want_gw)
        print(f"wrote {gw_path.relative_to(ROOT)}")
    elif not gw_path.exists() or gw_path.read_text() != want_gw:
        fail("manifests/examples/gateway.yaml is not the chart's gateway render: run `python3 .ci/chart-check.py --write`")
    # The example manifests: built-in kinds strictly; lanekeeper kinds are
    # checked by the CRDs' own schemas and CEL rules in the Rust tests.
    examples = []
    for f in sorted((ROOT / "manifests" / "examples").glob("*.yaml")):
        for text in re.split(r"(?m)^---\s*$", f.read_text()):
            obj = yaml.safe_load(text) if text.strip() else None
            if obj and not obj["apiVersion"].startswith("lanekeeper.dev/"):
                examples.append((f"manifests/examples/{f.name}", text))
    validate(examples, "examples")
    # The CRDs themselves validate too.
    validate([(f"crds/{p.name}", p.read_text()) for p in sorted((CHART / "crds").glob("*.yaml"))], "crds")

    want = install_yaml(default_docs)
    if args.write:
        INSTALL.write_text(want)
        print(f"wrote {INSTALL.relative_to(ROOT)}")
    elif not INSTALL.exists() or INSTALL.read_text() != want:
        fail("manifests/install.yaml is not the default render: run `python3 .ci/chart-check.py --write`")
    else:
        print("manifests/install.yaml matches the default render")
    print("chart-check: OK")


if __name__ == "__main__":
    main()

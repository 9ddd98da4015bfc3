#!/usr/bin/env python3
"""Structural check of the Kubernetes manifests in deploy/kubernetes/.

No Kubernetes schema validator (kubeconform, kubeval) is packaged in Debian,
so this checks what a schema check would catch in these files, plus the
references between objects that no schema check sees:

  - every document has the apiVersion its kind needs, metadata.name and (for
    namespaced kinds) metadata.namespace;
  - workloads: the selector matches the pod template's labels; containers
    have a name and image; ports are named, numbered 1..65535 and unique;
    probes name existing ports; volume mounts name declared volumes;
    ConfigMap volumes name a ConfigMap defined here; a StatefulSet's
    serviceName is a headless Service defined here;
  - Services select a workload's pods and target its named ports;
  - ServiceMonitors select a Service and name its ports;
  - the ConfigMap's tessera.toml parses as TOML with only Tessera's tables;
  - the workers request nvidia.com/gpu;
  - kustomization.yaml lists every manifest and only existing files.

    python3 tools/check_k8s_manifests.py deploy/kubernetes
"""
import pathlib
import sys
import tomllib

import yaml

API = {
    "Namespace": "v1", "ConfigMap": "v1", "Service": "v1", "Secret": "v1",
    "Deployment": "apps/v1", "StatefulSet": "apps/v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "Kustomization": "kustomize.config.k8s.io/v1beta1",
}
CLUSTER_SCOPED = {"Namespace", "Kustomization"}
TOML_TABLES = {"model", "parallel", "server", "heartbeat", "kv_cache", "scheduler", "admin",
               "logging", "worker"}


def main(folder):
    root = pathlib.Path(folder)
    errors = []
    docs = []  # (file, doc)
    files = sorted(root.glob("*.yaml"))
    for f in files:
        for d in yaml.safe_load_all(f.read_text()):
            if d is not None:
                docs.append((f.name, d))

    def err(where, msg):
        errors.append(f"{where}: {msg}")

    by_kind = {}
    for f, d in docs:
        kind = d.get("kind")
        name = (d.get("metadata") or {}).get("name", "?")
        where = f"{f}: {kind}/{name}"
        if kind not in API:
            err(where, f"unknown kind {kind!r}")
            continue
        if d.get("apiVersion") != API[kind]:
            err(where, f"apiVersion {d.get('apiVersion')!r}, expected {API[kind]!r}")
        if kind != "Kustomization":
            if not name or name == "?":
                err(where, "metadata.name missing")
            if kind not in CLUSTER_SCOPED and not d["metadata"].get("namespace"):
                err(where, "metadata.namespace missing")
        by_kind.setdefault(kind, []).append((where, d))

    configmaps = {d["metadata"]["name"]: d for _, d in by_kind.get("ConfigMap", [])}
    services = {d["metadata"]["name"]: (w, d) for w, d in by_kind.get("Service", [])}
    workloads = by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])

    def ports_of(pod_spec):
        out = {}
        for c in pod_spec.get("containers", []):
            for p in c.get("ports", []):
                out[p.get("name")] = p.get("containerPort")
        return out

    for where, d in workloads:
        spec = d.get("spec", {})
        tmpl = spec.get("template", {})
        labels = tmpl.get("metadata", {}).get("labels", {})
        sel = spec.get("selector", {}).get("matchLabels", {})
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            err(where, f"selector {sel} does not match the template labels {labels}")
        pod = tmpl.get("spec", {})
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for v in volumes.values():
            cm = v.get("configMap", {}).get("name")
            if cm and cm not in configmaps:
                err(where, f"volume {v['name']} names ConfigMap {cm!r}, not defined here")
        if not pod.get("containers"):
            err(where, "no containers")
        for c in pod.get("containers", []):
            cw = f"{where} container {c.get('name')}"
            if not c.get("name") or not c.get("image"):
                err(cw, "name and image are required")
            names = set()
            for p in c.get("ports", []):
                if not p.get("name") or len(p["name"]) > 15:
                    err(cw, f"port {p} needs a name of at most 15 characters")
                if not isinstance(p.get("containerPort"), int) or not 1 <= p["containerPort"] <= 65535:
                    err(cw, f"port {p.get('name')}: containerPort must be 1..65535")
                if p.get("name") in names:
                    err(cw, f"port name {p['name']} repeated")
                names.add(p.get("name"))
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str) and port not in names:
                    err(cw, f"{probe} names port {port!r}, not declared")
            for m in c.get("volumeMounts", []):
                if m.get("name") not in volumes:
                    err(cw, f"volumeMount {m.get('name')!r} names no volume")
                if not str(m.get("mountPath", "")).startswith("/"):
                    err(cw, f"volumeMount {m.get('name')}: mountPath must be absolute")
            for section in ("requests", "limits"):
                for k, v in c.get("resources", {}).get(section, {}).items():
                    if not isinstance(v, (int, str)):
                        err(cw, f"resources.{section}.{k} must be a quantity")
        if d["kind"] == "StatefulSet":
            svc = spec.get("serviceName")
            if svc not in services or services[svc][1]["spec"].get("clusterIP") != "None":
                err(where, f"serviceName {svc!r} is not a headless Service defined here")
            gpus = [c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
                    for c in pod.get("containers", [])]
            if not any(gpus):
                err(where, "the workers request no nvidia.com/gpu")

    for name, (where, s) in services.items():
        sel = s["spec"].get("selector", {})
        targets = [w for w in workloads
                   if sel and all(w[1]["spec"]["template"]["metadata"]["labels"].get(k) == v
                                  for k, v in sel.items())]
        if not targets:
            err(where, f"selector {sel} matches no workload defined here")
            continue
        pod_ports = ports_of(targets[0][1]["spec"]["template"]["spec"])
        for p in s["spec"].get("ports", []):
            t = p.get("targetPort", p.get("port"))
            if isinstance(t, str) and t not in pod_ports:
                err(where, f"port {p.get('name')} targets {t!r}, not a container port")

    for where, m in by_kind.get("ServiceMonitor", []):
        sel = m["spec"].get("selector", {}).get("matchLabels", {})
        matched = [s for _, s in services.values()
                   if all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        if not matched:
            err(where, f"selector {sel} matches no Service defined here")
            continue
        names = {p.get("name") for s in matched for p in s["spec"].get("ports", [])}
        for e in m["spec"].get("endpoints", []):
            if e.get("port") not in names:
                err(where, f"endpoint port {e.get('port')!r} is not a port of the selected Service")

    for name, cm in configmaps.items():
        for key, text in cm.get("data", {}).items():
            if not key.endswith(".toml"):
                continue
            try:
                parsed = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                err(f"ConfigMap/{name} {key}", f"not TOML: {e}")
                continue
            unknown = set(parsed) - TOML_TABLES
            if unknown:
                err(f"ConfigMap/{name} {key}", f"unknown tables {sorted(unknown)}")

    for where, k in by_kind.get("Kustomization", []):
        listed = set(k.get("resources", []))
        for r in listed:
            if not (root / r).exists():
                err(where, f"resource {r} does not exist")
        for f in files:
            if f.name != "kustomization.yaml" and f.name not in listed:
                err(where, f"{f.name} is not listed in resources")

    for e in errors:
        print(e)
    print(f"checked {len(docs)} objects in {len(files)} files: {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "deploy/kubernetes"))

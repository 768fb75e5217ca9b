// Validates rendered Kubernetes manifests offline: every object against the Kubernetes OpenAPI
// schema of its kind (the npm package kubernetes-models), then the references between objects
// that the schema cannot see: selectors that select, volumes, Secrets, claims, named ports and
// $(VAR) references that resolve, Services that a StatefulSet names, and the hardening every
// Trainyard pod is meant to have.
//
// Usage: node validate.js FILE.yaml   (a multi-document YAML stream, as `kubectl kustomize` prints)
// Prints one line per problem and exits 1 if there is any; prints a summary and exits 0 if not.
"use strict";

const fs = require("fs");
const yaml = require("js-yaml");

// apiVersion → the kubernetes-models module holding its kinds.
function modelFor(apiVersion, kind) {
  const group = apiVersion.includes("/") ? apiVersion : `${apiVersion}`;
  let module;
  try {
    module = require(`kubernetes-models/${group}`);
  } catch (e) {
    return null;
  }
  return module[kind] || null;
}

function labelsMatch(selector, labels) {
  if (!selector || Object.keys(selector).length === 0) return false;
  return Object.entries(selector).every(([k, v]) => labels && labels[k] === v);
}

function podTemplate(obj) {
  if (obj.kind === "StatefulSet" || obj.kind === "Deployment" || obj.kind === "DaemonSet")
    return obj.spec.template;
  if (obj.kind === "Job") return obj.spec.template;
  return null;
}

function main() {
  const file = process.argv[2];
  if (!file) {
    console.error("usage: node validate.js FILE.yaml");
    process.exit(2);
  }
  const docs = yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d);
  const problems = [];
  const where = (o) => `${o.kind}/${(o.metadata && o.metadata.name) || "?"}`;

  // 1. Each object against its schema.
  for (const obj of docs) {
    if (!obj.apiVersion || !obj.kind) {
      problems.push(`an object without apiVersion or kind: ${JSON.stringify(obj).slice(0, 80)}`);
      continue;
    }
    const Model = modelFor(obj.apiVersion, obj.kind);
    if (!Model) {
      problems.push(`${where(obj)}: no schema for ${obj.apiVersion} ${obj.kind}`);
      continue;
    }
    // kustomize wraps long base64 values over lines; the API server's decoder skips the line
    // breaks, so they are not an error.
    if (obj.kind === "Secret" && obj.data) {
      for (const k of Object.keys(obj.data)) obj.data[k] = String(obj.data[k]).replace(/\s+/g, "");
    }
    try {
      new Model(obj).validate();
    } catch (e) {
      problems.push(`${where(obj)}: ${e.message.split("\n")[0]}`);
    }
  }

  // 2. References between objects.
  const byKind = (k) => docs.filter((o) => o.kind === k);
  const names = (k) => new Set(byKind(k).map((o) => o.metadata.name));
  const secrets = names("Secret");
  const services = names("Service");
  const claims = names("PersistentVolumeClaim");
  const workloads = docs.filter((o) => podTemplate(o));
  const pods = workloads.map((o) => ({ owner: o, template: podTemplate(o) }));

  for (const { owner, template } of pods) {
    const w = where(owner);
    const labels = (template.metadata && template.metadata.labels) || {};
    if (owner.spec.selector && !labelsMatch(owner.spec.selector.matchLabels, labels))
      problems.push(`${w}: its selector does not select its own pods`);
    if (owner.kind === "StatefulSet" && !services.has(owner.spec.serviceName))
      problems.push(`${w}: serviceName ${owner.spec.serviceName} is not a Service here`);
    const spec = template.spec;
    if (!spec.securityContext || spec.securityContext.runAsNonRoot !== true)
      problems.push(`${w}: the pod does not require runAsNonRoot`);
    const volumes = new Map((spec.volumes || []).map((v) => [v.name, v]));
    for (const t of (owner.spec.volumeClaimTemplates || [])) volumes.set(t.metadata.name, t);
    for (const v of spec.volumes || []) {
      if (v.secret && !secrets.has(v.secret.secretName))
        problems.push(`${w}: volume ${v.name} names Secret ${v.secret.secretName}, which is not here`);
      const secret = v.secret && byKind("Secret").find((o) => o.metadata.name === v.secret.secretName);
      for (const item of (secret && v.secret.items) || []) {
        if (!(secret.data || {})[item.key] && !(secret.stringData || {})[item.key])
          problems.push(`${w}: volume ${v.name} mounts key ${item.key}, which Secret ${secret.metadata.name} lacks`);
      }
      if (v.persistentVolumeClaim && !claims.has(v.persistentVolumeClaim.claimName))
        problems.push(`${w}: volume ${v.name} names claim ${v.persistentVolumeClaim.claimName}, which is not here`);
    }
    const portNames = new Set();
    for (const c of spec.containers) {
      const cw = `${w} container ${c.name}`;
      for (const p of c.ports || []) if (p.name) portNames.add(p.name);
      if (!c.image) problems.push(`${cw}: no image`);
      if (!c.resources || !c.resources.requests || !c.resources.requests.memory)
        problems.push(`${cw}: no memory request`);
      if (!c.resources || !c.resources.limits || !c.resources.limits.memory)
        problems.push(`${cw}: no memory limit`);
      const sc = c.securityContext || {};
      if (sc.allowPrivilegeEscalation !== false)
        problems.push(`${cw}: allowPrivilegeEscalation is not false`);
      if (!sc.capabilities || !(sc.capabilities.drop || []).includes("ALL"))
        problems.push(`${cw}: does not drop all capabilities`);
      for (const m of c.volumeMounts || [])
        if (!volumes.has(m.name)) problems.push(`${cw}: mounts ${m.name}, which is not a volume`);
      if (owner.kind === "StatefulSet" && (!c.readinessProbe || !c.livenessProbe))
        problems.push(`${cw}: a long-running container without readiness and liveness probes`);
      for (const probe of [c.readinessProbe, c.livenessProbe]) {
        const port = probe && ((probe.httpGet && probe.httpGet.port) || (probe.tcpSocket && probe.tcpSocket.port));
        if (typeof port === "string" && !(c.ports || []).some((p) => p.name === port))
          problems.push(`${cw}: a probe names port ${port}, which the container does not have`);
      }
      const env = new Set((c.env || []).map((e) => e.name));
      for (const text of [...(c.args || []), ...(c.command || []), ...(c.env || []).map((e) => e.value || "")]) {
        for (const m of String(text).matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g))
          if (!env.has(m[1])) problems.push(`${cw}: $(${m[1]}) is not an environment variable of the container`);
      }
    }
    template.portNames = portNames;
  }

  for (const svc of byKind("Service")) {
    const selected = pods.filter(({ template }) => labelsMatch(svc.spec.selector, template.metadata.labels));
    if (selected.length === 0) {
      problems.push(`${where(svc)}: its selector selects no pods`);
      continue;
    }
    for (const p of svc.spec.ports || []) {
      if (typeof p.targetPort === "string" && !selected.every(({ template }) => template.portNames.has(p.targetPort)))
        problems.push(`${where(svc)}: targetPort ${p.targetPort} is not a port of the pods it selects`);
    }
  }
  for (const np of byKind("NetworkPolicy")) {
    if (!pods.some(({ template }) => labelsMatch(np.spec.podSelector.matchLabels, template.metadata.labels)))
      problems.push(`${where(np)}: its podSelector selects no pods`);
  }
  for (const [kind, name] of [["Namespace", null], ["StatefulSet", "trainyard-coordinator"],
    ["StatefulSet", "trainyard-agent"], ["Service", "trainyard-coordinator"],
    ["Service", "trainyard-agents"], ["NetworkPolicy", "trainyard-coordinator"],
    ["NetworkPolicy", "trainyard-agents"]]) {
    if (!byKind(kind).some((o) => name === null || o.metadata.name === name))
      problems.push(`missing ${kind}${name ? "/" + name : ""}`);
  }

  for (const p of problems) console.log(p);
  if (problems.length > 0) process.exit(1);
  const kinds = {};
  for (const o of docs) kinds[o.kind] = (kinds[o.kind] || 0) + 1;
  console.log(`${docs.length} objects valid: ` +
    Object.entries(kinds).map(([k, n]) => `${n} ${k}`).join(", "));
}

main();

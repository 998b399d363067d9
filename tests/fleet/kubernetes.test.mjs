// The manifests of deploy/kubernetes/ against the Kubernetes API's JSON schemas (the npm
// package kubernetes-models 5.1.0, pinned in package.json: each kind's schema compiled to
// a validator), strictly: a field no schema knows (a typo) fails too.  And what the
// manifests promise each other and the server: probes on /readyz and /healthz, a grace
// period that covers preStop and the drain, the Service selecting the pods, the Secret and
// ConfigMap mounted where the entry point reads them.  No cluster runs them here.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync, existsSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";

import { ROOT, freePort } from "./lib.mjs";

const DIR = join(ROOT, "deploy", "kubernetes");

/** The schema module's name for apiVersion + kind (kubernetes-models' _schemas). */
function schemaName(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["core", apiVersion];
  const g = group.replace(/\.k8s\.io$/, "").split(".").map((p) => p[0].toUpperCase() + p.slice(1)).join("");
  return `IoK8sApi${g}${version[0].toUpperCase()}${version.slice(1)}${kind}`;
}

/**
 * Validates doc with its kind's schema; returns the schema's errors plus every field that no
 * schema read.  The compiled validators test each property they know (data.name !== undefined)
 * and walk maps (labels, data) key by key: a proxy records what they read, and a key of the
 * document that was never read is a field the API does not have.
 */
async function validate(doc) {
  const name = schemaName(doc.apiVersion, doc.kind);
  const file = join(ROOT, "tests", "fleet", "node_modules", "kubernetes-models", "_schemas", `${name}.js`);
  assert.ok(existsSync(file), `no schema for ${doc.apiVersion} ${doc.kind} (${name})`);
  const { validate: v } = await import(file);
  const read = new Map();
  const wrap = (value, path) => {
    if (value === null || typeof value !== "object") return value;
    const keys = new Set();
    read.set(path, { value, keys });
    return new Proxy(value, {
      get(target, key) {
        if (typeof key === "string") keys.add(key);
        const child = target[key];
        return typeof key === "string" && child !== null && typeof child === "object" ? wrap(child, `${path}/${key}`) : child;
      },
    });
  };
  const ok = v(wrap(doc, ""));
  const errors = ok ? [] : v.errors.map((e) => `${e.instancePath || "/"} ${e.keyword} ${JSON.stringify(e.params)}`);
  const walk = (value, path) => {
    if (value === null || typeof value !== "object") return;
    const seen = read.get(path);
    for (const [k, child] of Object.entries(value)) {
      if (!Array.isArray(value) && !(seen && seen.keys.has(k))) errors.push(`${path}/${k}: not a field of ${doc.kind}`);
      walk(child, `${path}/${k}`);
    }
  };
  walk(doc, "");
  return errors;
}

function manifests() {
  const docs = [];
  for (const f of readdirSync(DIR).filter((f) => f.endsWith(".yaml")).sort()) {
    for (const d of parseAllDocuments(readFileSync(join(DIR, f), "utf8"))) {
      assert.deepEqual(d.errors, [], `${f}: YAML errors`);
      const doc = d.toJSON();
      if (doc) docs.push({ file: f, doc });
    }
  }
  return docs;
}

test("kubernetes: every manifest is valid against the API's schema, with no unknown field", async () => {
  const docs = manifests();
  assert.ok(docs.length >= 8, `only ${docs.length} documents`);
  for (const { file, doc } of docs) {
    if (doc.kind === "Kustomization") {
      for (const r of doc.resources) assert.ok(existsSync(join(DIR, r)), `kustomization.yaml: ${r} is missing`);
      continue;
    }
    assert.deepEqual(await validate(doc), [], `${file}: ${doc.kind} ${doc.metadata?.name}`);
  }
});

test("kubernetes: the check finds a wrong type and an unknown field (it is not a no-op)", async () => {
  const dep = manifests().find((m) => m.file === "deployment.yaml").doc;
  const typed = structuredClone(dep);
  typed.spec.replicas = "three";
  assert.ok((await validate(typed)).some((e) => e.includes("/spec/replicas")));
  const typo = structuredClone(dep);
  typo.spec.template.spec.containers[0].readinesProbe = typo.spec.template.spec.containers[0].readinessProbe;
  assert.ok((await validate(typo)).some((e) => e.includes("readinesProbe: not a field")));
  const enumBad = structuredClone(dep);
  enumBad.spec.template.spec.containers[0].securityContext.procMount = "Open";
  assert.ok((await validate(enumBad)).some((e) => e.includes("procMount")));
});

/** The principals a config.toml's metrics-token names (a list of strings, or one string). */
function metricsTokens(toml) {
  const m = /^metrics-token\s*=\s*(.*)$/m.exec(toml);
  return m ? [...m[1].matchAll(/"([^"]+)"/g)].flatMap((x) => x[1].split(",")) : [];
}

/** The token names of the Secret's example file (NAME:TOKEN lines). */
function tokenNames(secret) {
  return secret.stringData.tokens.split("\n").filter((l) => l.trim() && !l.startsWith("#")).map((l) => l.split(":")[0].trim());
}

test("kubernetes: probes, drain, Service, Secret and ConfigMap fit together and fit the server", () => {
  const docs = manifests();
  const service = docs.find((m) => m.doc.kind === "Service").doc;
  const cm = docs.find((m) => m.doc.kind === "ConfigMap").doc;
  const secret = docs.find((m) => m.doc.kind === "Secret").doc;
  const deployments = docs.filter((m) => m.doc.kind === "Deployment");
  assert.equal(deployments.length, 2, "the two isolation choices");
  assert.equal(service.spec.sessionAffinity, "ClientIP");
  for (const { file, doc } of deployments) {
    const pod = doc.spec.template;
    for (const [k, v] of Object.entries(service.spec.selector)) assert.equal(pod.metadata.labels[k], v, `${file}: the Service does not select the pods`);
    for (const [k, v] of Object.entries(doc.spec.selector.matchLabels)) assert.equal(pod.metadata.labels[k], v, `${file}: selector`);
    const c = pod.spec.containers[0];
    const env = Object.fromEntries(c.env.map((e) => [e.name, e.value]));
    assert.equal(c.readinessProbe.httpGet.path, "/readyz", file);
    assert.equal(c.livenessProbe.httpGet.path, "/healthz", file);
    assert.equal(c.ports.find((p) => p.name === service.spec.ports[0].targetPort)?.containerPort, 8080, `${file}: the Service's port`);
    const preStop = Number(c.lifecycle.preStop.exec.command.at(-1));
    const drain = Number(env.MPS_DRAIN_SECONDS);
    assert.ok(drain > 0 && preStop >= 0);
    assert.ok(pod.spec.terminationGracePeriodSeconds >= preStop + drain + 5,
      `${file}: grace ${pod.spec.terminationGracePeriodSeconds} s < preStop ${preStop} + drain ${drain} + 5`);
    const sc = c.securityContext;
    assert.equal(sc.allowPrivilegeEscalation, false);
    assert.deepEqual(sc.capabilities.drop, ["ALL"]);
    assert.equal(pod.spec.securityContext.runAsUser, 10001, "the image's user");
    assert.ok(c.resources.requests && c.resources.limits, `${file}: requests and limits`);
    const mounts = Object.fromEntries(c.volumeMounts.map((m) => [m.mountPath, m]));
    assert.ok(mounts["/var/lib/mcp-python-exec-sandbox"], `${file}: a volume for the state and environment cache`);
    assert.equal(mounts["/etc/mcp-python-exec-sandbox/config.toml"]?.subPath, "config.toml");
    const tokenDir = env.MPS_TOKEN_FILE.replace(/\/[^/]+$/, "");
    const tokenVol = pod.spec.volumes.find((v) => v.name === mounts[tokenDir]?.name);
    assert.equal(tokenVol?.secret?.secretName, secret.metadata.name, `${file}: the token file is not the Secret's`);
    assert.ok(Object.keys(secret.stringData).includes(env.MPS_TOKEN_FILE.split("/").pop()));
    assert.equal(pod.spec.volumes.find((v) => v.name === mounts["/etc/mcp-python-exec-sandbox/config.toml"].name)?.configMap?.name, cm.metadata.name);
    // /metrics is an operator's: the ConfigMap names one, a principal of the Secret's example.
    const operators = metricsTokens(cm.data["config.toml"]);
    assert.ok(operators.length > 0, "the ConfigMap names no metrics-token: every token would get 403 on /metrics");
    for (const name of operators) assert.ok(tokenNames(secret).includes(name), `metrics-token ${name} is not a token name of the Secret`);
    if (env.MPS_SANDBOX_BACKEND === "bwrap") {
      assert.equal(sc.procMount, "Unmasked", `${file}: bubblewrap mounts a fresh /proc`);
      assert.equal(pod.spec.hostUsers, false, `${file}: procMount Unmasked needs a user namespace`);
      const profile = pod.spec.securityContext.seccompProfile;
      assert.equal(profile.type, "Localhost");
      assert.ok(existsSync(join(ROOT, "deploy", "container", profile.localhostProfile.split("/").pop())), "the seccomp profile ships");
    } else {
      assert.equal(env.MPS_SANDBOX_BACKEND, "none");
      assert.ok(pod.spec.runtimeClassName, `${file}: backend none needs a runtime that isolates`);
      // The server refuses backend none with several principals unless told it is accepted.
      if (tokenNames(secret).length > 1)
        assert.equal(env.MCP_PY_SANDBOX_ALLOW_NONE_WITH_TOKENS, "1", `${file}: backend none with ${tokenNames(secret).length} principals would not start`);
      assert.ok(docs.some((m) => m.doc.kind === "RuntimeClass" && m.doc.metadata.name === pod.spec.runtimeClassName));
    }
  }
});

test("kubernetes: the ConfigMap's config.toml is one the server starts with", async (t) => {
  const binary = process.env.MPS_BINARY || join(ROOT, "build", "mcp-python-exec-sandbox");
  if (!existsSync(binary)) return t.skip(`no server binary at ${binary}`);
  const { mkdtempSync, writeFileSync, rmSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const { spawn } = await import("node:child_process");
  const cm = manifests().find((m) => m.doc.kind === "ConfigMap").doc;
  const secret = manifests().find((m) => m.doc.kind === "Secret").doc;
  const dir = mkdtempSync(join(tmpdir(), "mps-fleet-k8s-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  // The Secret's names, with tokens of our own.
  writeFileSync(join(dir, "tokens"), tokenNames(secret).map((n, i) => `${n}:${i}123456789abcdef0123456789abcdef\n`).join(""), { mode: 0o600 });
  // As shipped, and with the commented example settings (trusted-proxy) switched on.
  const asShipped = cm.data["config.toml"];
  const examples = asShipped.replace(/^# (trusted-proxy = .*)$/m, "$1");
  assert.notEqual(examples, asShipped, "the ConfigMap's commented trusted-proxy example is gone");
  for (const [what, text] of [["as shipped", asShipped], ["with its trusted-proxy example", examples]]) {
    writeFileSync(join(dir, "config.toml"), text);
    // A bad key or value stops the server at start-up naming the line; a good file serves.
    const proc = spawn(binary, ["--profile", join(dir, "config.toml"), "--state-dir", join(dir, "state"), "--port", String(await freePort()),
      "--host", "127.0.0.1", "--sandbox-backend", "none", "--allow-none-with-tokens", "--auth-token-file", join(dir, "tokens")], { stdio: ["ignore", "ignore", "pipe"] });
    let log = "";
    proc.stderr.on("data", (c) => (log += c));
    const exited = new Promise((r) => proc.once("exit", (code) => r(code)));
    const listening = await Promise.race([
      new Promise((r) => { const i = setInterval(() => { if (/listening on/.test(log)) { clearInterval(i); r(true); } }, 50); }),
      exited.then(() => false),
    ]);
    proc.kill("SIGTERM");
    await exited;
    assert.ok(listening, `the server did not start with the ConfigMap's config.toml ${what}:\n${log}`);
    assert.doesNotMatch(log, /metrics-token|answers 403 to every token/, `/metrics has no operator ${what}:\n${log}`);
  }
});

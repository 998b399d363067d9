// A one-node docker swarm on the hand-started dockerd: deploy/swarm/stack.yml (the server's
// image, N replicas with health checks and draining updates, the nginx front), MCP calls
// through the front, scaled 2 -> 4 -> 2, a rolling update with calls in flight, and the
// stack and the swarm removed at the end.
//
// MPS_SERVER_IMAGE, MPS_NGINX_IMAGE: the images (run.sh builds them).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, writeFileSync, rmSync } from "node:fs";
import { join } from "node:path";

import { ROOT, connectModern, connectV1, engine, get, makeToken, tempDir, waitUntil } from "./lib.mjs";

const STACK = "mps-fleet";
const FRONT = "http://127.0.0.1:18200";
const OURS = "/tmp/mps-fleet-swarm.ours"; // run.sh's trap leaves the swarm if this exists
const slotBase = (n) => `http://127.0.0.1:${18200 + n}`;

async function readyReplicas() {
  const out = await engine(["service", "ls", "--filter", `name=${STACK}_server`, "--format", "{{.Replicas}}"]);
  return out.trim();
}

async function waitSlots(slots, absent = []) {
  const ok = await waitUntil(async () => {
    for (const n of slots) if ((await get(`${slotBase(n)}/readyz`)).status !== 200) return false;
    for (const n of absent) if ((await get(`${slotBase(n)}/readyz`)).status !== 0) return false;
    return true;
  }, 120000, 500);
  assert.ok(ok, `slots ${slots} ready and ${absent} gone: ${await readyReplicas()}\n${await engine(["service", "ps", `${STACK}_server`]).catch((e) => e.message)}`);
}

/**
 * n sessions of the SDK v1 client through the front, 3 at a time (the lan profile lets a
 * token run 4 calls per replica), each 2 calls; returns their route tags.
 */
async function sessions(t, token, n) {
  const routes = [];
  let next = 0;
  await Promise.all(Array.from({ length: 3 }, async () => { for (let i; (i = next++) < n;) await one(i); }));
  return routes;
  async function one(i) {
    const { client, transport } = await connectV1(null, `${FRONT}/mcp`, token);
    try {
      for (let k = 0; k < 2; k++) {
        const r = await client.callTool({ name: "execute_python", arguments: { script: `print(${i} * 100 + ${k})` } });
        assert.equal(r.structuredContent?.stdout, `${i * 100 + k}\n`, JSON.stringify(r).slice(0, 1000));
      }
      routes.push(transport.sessionId.split(".")[0]);
      await transport.terminateSession().catch(() => {});
    } finally {
      await client.close().catch(() => {});
    }
  }
}

test("swarm: the stack deploys, serves through nginx, scales 2 -> 4 -> 2, updates draining, and is removed", async (t) => {
  const image = process.env.MPS_SERVER_IMAGE;
  const nginxImage = process.env.MPS_NGINX_IMAGE;
  assert.ok(image && nginxImage, "MPS_SERVER_IMAGE and MPS_NGINX_IMAGE (tests/fleet/run.sh builds them)");
  for (let n = 0; n <= 4; n++) assert.equal((await get(`${slotBase(n)}/healthz`)).status, 0, `port ${18200 + n} is taken`);
  const state = (await engine(["info", "--format", "{{.Swarm.LocalNodeState}}"])).trim();
  assert.equal(state, "inactive", "this engine is already in a swarm (not ours: the test would change it)");
  const hadGwbridge = (await engine(["network", "ls", "-q", "--filter", "name=^docker_gwbridge$"])) !== "";
  const since = Date.now();
  await engine(["swarm", "init", "--advertise-addr", "127.0.0.1", "--listen-addr", "127.0.0.1:2377"]);
  writeFileSync(OURS, `${process.pid}\n`);
  t.after(async () => {
    await engine(["stack", "rm", STACK]).catch(() => {});
    await waitUntil(async () => (await engine(["ps", "-aq", "--filter", `label=com.docker.stack.namespace=${STACK}`])) === "", 60000, 500);
    // The replicas' containers (the launchers remove theirs when stopped; a killed one's goes here).
    for (let n = 1; n <= 8; n++) {
      const ids = (await engine(["ps", "-aq", "--filter", `label=io.github.mcp-python-exec-sandbox.replica-of=${STACK}_server-slot${n}`]).catch(() => "")).split("\n").filter(Boolean);
      if (ids.length) await engine(["rm", "-f", "-v", ...ids]).catch(() => {});
    }
    await engine(["swarm", "leave", "--force"]).catch(() => {});
    rmSync(OURS, { force: true });
    // What the swarm made and leaves behind: the tasks' state volumes (the image's VOLUME,
    // anonymous, unused now) created since the test began, and the gateway bridge.
    const vols = (await engine(["volume", "ls", "-q", "--filter", "dangling=true"]).catch(() => "")).split("\n").filter((v) => /^[0-9a-f]{64}$/.test(v));
    for (const v of vols) {
      const created = Date.parse(await engine(["volume", "inspect", "--format", "{{.CreatedAt}}", v]).catch(() => ""));
      if (created >= since - 1000) await engine(["volume", "rm", v]).catch(() => {});
    }
    if (!hadGwbridge) await engine(["network", "rm", "docker_gwbridge"]).catch(() => {});
  });

  const dir = tempDir(t);
  const tok = makeToken(dir);
  // A second principal, for the isolation probe.
  const other = `${tok.token.slice(0, 24)}other`;
  writeFileSync(tok.file, `${tok.name}:${tok.token}\nother:${other}\n`);
  const env = { ...process.env, MPS_SERVER_IMAGE: image, MPS_NGINX_IMAGE: nginxImage, MPS_TOKENS_FILE: tok.file };
  const { execFileSync } = await import("node:child_process");
  execFileSync("docker", ["stack", "deploy", "-c", join(ROOT, "deploy", "swarm", "stack.yml"), STACK], { env, stdio: ["ignore", "ignore", "pipe"] });

  await t.test("2 replicas, healthy, e2e calls of both eras through the front", async () => {
    await waitSlots([1, 2]);
    assert.ok(await waitUntil(async () => (await get(`${FRONT}/healthz`)).status === 200, 60000, 500), "no nginx front");
    assert.ok(await waitUntil(async () => /healthy/.test(await engine(["ps", "--filter", `label=com.docker.swarm.service.name=${STACK}_server`, "--format", "{{.Status}}"])), 60000, 1000),
      "the replicas' health check never passed");
    const routes = await sessions(t, tok.token, 12);
    assert.deepEqual([...new Set(routes)].sort(), ["s1", "s2"], `sessions went to ${routes}`);
    const { client } = await connectModern(t, `${FRONT}/mcp`, tok.token);
    const r = await client.callTool({ name: "execute_python", arguments: { script: "print(6 * 7)" } });
    assert.equal(r.structuredContent?.stdout, "42\n");
    await client.close();
    // The replicas trust nginx (127.0.0.3, stack.yml's --trusted-proxy): their audit log
    // names this client (127.0.0.1, from nginx's X-Forwarded-For) beside nginx.
    let audit = [];
    const found = await waitUntil(() => {
      const out = spawnSync("docker", ["service", "logs", "--raw", `${STACK}_server`], { encoding: "utf8", timeout: 30000 });
      audit = `${out.stdout}\n${out.stderr}`.split("\n").filter((l) => l.startsWith("{")).map((l) => {
        try { return JSON.parse(l); } catch { return null; }
      }).filter((a) => a?.tool === "execute_python");
      return audit.some((a) => a.remote === "127.0.0.3" && a.client === "127.0.0.1" && a.forwarded === "ok");
    }, 30000, 1000);
    assert.ok(found, `no audit line naming the client behind nginx: ${JSON.stringify(audit.slice(-3))}`);
  });

  await t.test("the replicas run scripts in bubblewrap: the tokens file is out of reach, each principal's run another uid", async () => {
    const probe = [
      "import os, glob",
      "print('uid', os.getuid())",
      "seen = []",
      "for p in ['/run/mps/tokens', '/run/secrets/mcp_tokens', '/proc/1/root/run/mps/tokens']:",
      "    try:",
      "        open(p, 'rb').read(); seen.append(p)",
      "    except OSError as e:",
      "        pass",
      "print('readable', seen)",
      "print('sock', os.path.exists('/var/run/docker.sock'))",
    ].join("\n");
    const uids = [];
    for (const token of [tok.token, other]) {
      const { client } = await connectModern(t, `${FRONT}/mcp`, token);
      const r = await client.callTool({ name: "execute_python", arguments: { script: probe } });
      await client.close();
      const out = r.structuredContent?.stdout ?? "";
      assert.match(out, /^readable \[\]$/m, `a script read the tokens file: ${JSON.stringify(r).slice(0, 1500)}`);
      assert.match(out, /^sock False$/m, "a script sees the engine's socket");
      const uid = Number(/^uid (\d+)$/m.exec(out)?.[1]);
      assert.ok(uid > 0, `the script ran as root: ${out}`);
      uids.push(uid);
      const env = await connectModern(t, `${FRONT}/mcp`, token);
      const ce = await env.client.callTool({ name: "check_environment", arguments: {} });
      await env.client.close();
      assert.equal(ce.structuredContent.sandbox_backend, "bwrap", JSON.stringify(ce.structuredContent).slice(0, 1000));
      assert.equal(ce.structuredContent.sandbox_available, true);
    }
    assert.notEqual(uids[0], uids[1], `both principals' runs had uid ${uids[0]}`);
    // The replicas are the launchers' containers: the seccomp profile, /proc unmasked, only
    // the listed capabilities, no privileged mode.
    const ids = (await engine(["ps", "-q", "--filter", `label=io.github.mcp-python-exec-sandbox.replica-of=${STACK}_server-slot1`])).trim();
    assert.ok(ids, "no replica container of slot 1");
    const hc = JSON.parse(await engine(["inspect", "--format", "{{json .HostConfig}}", ids.split("\n")[0]]));
    assert.equal(hc.Privileged, false);
    assert.deepEqual(hc.CapDrop, ["ALL"]);
    assert.ok(!hc.CapAdd.includes("SYS_RESOURCE") && hc.CapAdd.includes("SYS_ADMIN"), JSON.stringify(hc.CapAdd));
    assert.ok(hc.SecurityOpt.some((o) => o.startsWith("seccomp=")) && hc.SecurityOpt.includes("no-new-privileges"), JSON.stringify(hc.SecurityOpt).slice(0, 300));
    assert.deepEqual(hc.MaskedPaths, []);
  });

  await t.test("scaled to 4: new sessions reach the new replicas", async () => {
    await engine(["service", "scale", "--detach", `${STACK}_server=4`]);
    await waitSlots([1, 2, 3, 4]);
    // nginx took slots 3 and 4 for down while they refused connections (max_fails=1,
    // fail_timeout=5s): it tries them again after that, so new sessions reach them soon.
    const routes = [];
    await waitUntil(async () => {
      routes.push(...(await sessions(t, tok.token, 12)));
      return routes.includes("s3") && routes.includes("s4");
    }, 60000, 500);
    for (const s of ["s3", "s4"]) assert.ok(routes.includes(s), `no session on ${s}: ${routes}`);
  });

  await t.test("scaled back to 2: slots 3 and 4 go, every call still answered", async () => {
    await engine(["service", "scale", "--detach", `${STACK}_server=2`]);
    await waitSlots([1, 2], [3, 4]);
    const routes = await sessions(t, tok.token, 12);
    assert.deepEqual([...new Set(routes)].sort(), ["s1", "s2"]);
    // Swarm counts a task as running once its health check has passed (every 5 s): a
    // replica swarm replaced while the machine was loaded answers /readyz before that.
    assert.ok(await waitUntil(async () => (await readyReplicas()) === "2/2", 90000, 1000),
      `replicas ${await readyReplicas()}: ${await engine(["service", "ps", `${STACK}_server`]).catch((e) => e.message)}`);
  });

  await t.test("a rolling update drains: calls in flight on every replica finish", async () => {
    // One session per slot, each with a call of 4 s running when the update starts.
    // nginx takes a replica for down for 5 s after one refused connection (max_fails=1,
    // fail_timeout=5s), and swarm may just have replaced one: keep opening sessions until
    // both slots hold one, for as long as nginx may keep a slot out.
    const conns = [];
    const seen = [];
    await waitUntil(async () => {
      const c = await connectV1(null, `${FRONT}/mcp`, tok.token);
      c.route = c.transport.sessionId.split(".")[0];
      seen.push(c.route);
      if (conns.some((x) => x.route === c.route)) await c.client.close();
      else conns.push(c);
      return conns.length === 2;
    }, 60000, 250);
    assert.equal(conns.length, 2, `no session on each slot: ${seen}`);
    const started = new Set();
    const calls = conns.map((c) => c.client.callTool({ name: "execute_python", arguments: { script: "import time\nprint('started', flush=True)\ntime.sleep(4)\nprint('done')" } }, undefined, {
      onprogress: (p) => { if ((p.message ?? "").includes("started")) started.add(c.route); },
      timeout: 120000,
    }));
    const early = Promise.race(calls.map((p) => p.then((r) => ({ early: r }))));
    assert.ok(await waitUntil(() => started.size === 2, 30000), `the calls never started: ${JSON.stringify(await Promise.race([early, new Promise((r) => setTimeout(() => r("pending"), 10))])).slice(0, 1000)}`);
    await engine(["service", "update", "--detach", "--force", `${STACK}_server`]);
    const results = await Promise.all(calls);
    for (const r of results) assert.equal(r.structuredContent?.stdout, "started\ndone\n", JSON.stringify(r).slice(0, 1000));
    for (const c of conns) await c.client.close().catch(() => {});
    // The update finishes with two fresh, ready replicas; the old tasks exited 0 (drained).
    assert.ok(await waitUntil(async () => (await engine(["service", "inspect", "--format", "{{if .UpdateStatus}}{{.UpdateStatus.State}}{{end}}", `${STACK}_server`])) === "completed", 180000, 1000),
      `the update did not complete: ${await engine(["service", "ps", `${STACK}_server`]).catch((e) => e.message)}`);
    await waitSlots([1, 2]);
    const exits = await engine(["ps", "-a", "--filter", `label=com.docker.swarm.service.name=${STACK}_server`, "--filter", "status=exited", "--format", "{{.Status}}"]);
    assert.ok(exits.split("\n").filter(Boolean).length >= 2, `no replaced task: ${exits}`);
    for (const line of exits.split("\n").filter(Boolean)) assert.match(line, /^Exited \(0\)/, `a replaced replica did not drain to exit 0: ${line}`);
    const routes = await sessions(t, tok.token, 6);
    assert.ok(routes.length === 6);
  });
});

test("swarm: the stack file is what docker stack config accepts", { skip: !existsSync("/usr/local/bin/docker") && "no docker CLI" }, async () => {
  // Validated without a swarm as well (the same check where no swarm can run).
  const out = await engine(["stack", "config", "-c", join(ROOT, "deploy", "swarm", "stack.yml")]).catch((e) => e.message);
  assert.match(out, /services:\s*\n\s*nginx:/, out.slice(0, 2000));
});

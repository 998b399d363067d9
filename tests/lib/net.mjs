// Helpers the node harnesses share (tests/e2e, tests/browser, tests/fleet): polling and
// loopback ports.  Node's built-in modules only, so that each harness imports it by path
// whatever its own node_modules holds.
import { connect, createServer } from "node:net";

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Polls pred until it is true or timeoutMs passes; returns its last value. */
export async function waitUntil(pred, timeoutMs = 10000, intervalMs = 100) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await pred()) return true;
    await sleep(intervalMs);
  }
  return pred();
}

/** A TCP port that was free a moment ago on 127.0.0.1. */
export function freePort() {
  return new Promise((done, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => done(port));
    });
  });
}

/** Whether something accepts a TCP connection on 127.0.0.1:port now. */
export function canConnect(port) {
  return new Promise((done) => {
    const sock = connect({ host: "127.0.0.1", port });
    sock.once("connect", () => {
      sock.destroy();
      done(true);
    });
    sock.once("error", () => done(false));
  });
}

// Run as a separate process with NODE_EXTRA_CA_CERTS pointing at the server's self-signed
// certificate (Node reads that variable only at start-up). Connects over https, lists the
// tools, runs one script, prints a JSON summary on stdout.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const client = new Client({ name: "mps-e2e-tls", version: "0.0.1" }, { capabilities: {} });
await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[2])));
const tools = (await client.listTools()).tools.map((tool) => tool.name);
const result = await client.callTool({ name: "execute_python", arguments: { script: "print('over tls')" } });
process.stdout.write(JSON.stringify({ server: client.getServerVersion(), tools, result }));
await client.close();

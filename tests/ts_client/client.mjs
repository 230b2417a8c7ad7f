// End-to-end client for `toolwire serve --transport http`, written against the
// TypeScript MCP SDK. Usage: node client.mjs <url>   (env TOOLWIRE_TOKEN: bearer token)
// Prints one JSON object on stdout with what it saw; exits non-zero on failure.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = process.argv[2];
if (!url) {
  console.error("usage: node client.mjs <url>");
  process.exit(2);
}
const token = process.env.TOOLWIRE_TOKEN;
const headers = token ? { Authorization: `Bearer ${token}` } : {};

async function connect(withToken) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: withToken ? headers : {} },
  });
  const client = new Client({ name: "toolwire-ts-e2e", version: "1.0.0" });
  await client.connect(transport);
  return client;
}

const out = {};

// Without the token: the server must refuse (HTTP 401).
if (token) {
  try {
    const c = await connect(false);
    await c.listTools();
    out.unauthenticated = "accepted";
  } catch (err) {
    out.unauthenticated = { code: err?.code ?? null, message: String(err?.message ?? err) };
  }
}

const client = await connect(true);
out.protocolVersion = client.transport?.protocolVersion ?? null;
const listed = await client.listTools();
out.tools = listed.tools.map((t) => t.name).sort();
out.addTool = listed.tools.find((t) => t.name === "add") ?? null;

out.add = await client.callTool({
  name: "add",
  arguments: { a: 2, b: 40 },
  _meta: { "io.toolwire/call-id": "ts-e2e-1" },
});
out.badArgs = await client.callTool({ name: "add", arguments: { a: "two", b: 40 } });
out.unknown = await client.callTool({ name: "no_such_tool", arguments: {} });

if (out.tools.includes("weather_report")) {
  const progress = [];
  out.report = await client.callTool(
    { name: "weather_report", arguments: { city: "Lyon" } },
    undefined,
    { onprogress: (p) => progress.push(p) },
  );
  out.progress = progress;
  out.alert = await client.callTool({ name: "weather_alert", arguments: { region: "Alps" } });
}

await client.close();
process.stdout.write(JSON.stringify(out) + "\n");

// A Streamable-HTTP MCP server written the way the TypeScript SDK's examples were
// written before they learned the spec's 404: one transport per session in a map, and a
// request carrying a session id the map does not hold (the server restarted) is answered
// HTTP 400 "Bad Request: No valid session ID provided". Many deployed servers copied it.
// With --spec, such a request is answered as the SDK's examples answer it now: HTTP 404,
// -32001 "Session not found".
// Usage: node forgetful_server.mjs [--spec] --http <port>   (plugins/mcp/tests/test_sessions.py)
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import * as z from "zod/v4";

const port = Number(process.argv[process.argv.indexOf("--http") + 1]);
const spec = process.argv.includes("--spec");
if (!Number.isInteger(port) || port <= 0) {
  console.error("usage: node forgetful_server.mjs --http <port>");
  process.exit(2);
}

function mcpServer() {
  const server = new McpServer({ name: "forgetful", version: "1.0.0" });
  server.registerTool(
    "forecast",
    { description: "The weather in a city", inputSchema: { city: z.string() } },
    async ({ city }) => ({ content: [{ type: "text", text: `sunny in ${city}` }] }),
  );
  server.registerTool(
    "strict",
    { description: "Refuses its call with HTTP 400 (see below)", inputSchema: {} },
    async () => ({ content: [{ type: "text", text: "never" }] }),
  );
  return server;
}

const transports = {};

function badRequest(res, message) {
  res.writeHead(400, { "content-type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message }, id: null }));
}

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString("utf8");
  return text ? JSON.parse(text) : undefined;
}

const http = createServer(async (req, res) => {
  try {
    if (!req.url.startsWith("/mcp")) {
      res.writeHead(404).end();
      return;
    }
    const sessionId = req.headers["mcp-session-id"];
    const body = req.method === "POST" ? await readJson(req) : undefined;
    // A live session's request that this server refuses at the HTTP layer: what a
    // gateway must not take for a forgotten session.
    if (body?.method === "tools/call" && body.params?.name === "strict") {
      badRequest(res, "Bad Request: this server refuses the call");
      return;
    }
    let transport;
    if (sessionId && transports[sessionId]) {
      transport = transports[sessionId];
    } else if (!sessionId && req.method === "POST" && isInitializeRequest(body)) {
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        enableJsonResponse: true,
        onsessioninitialized: (sid) => {
          transports[sid] = transport;
        },
      });
      transport.onclose = () => {
        if (transport.sessionId) delete transports[transport.sessionId];
      };
      await mcpServer().connect(transport);
    } else if (sessionId && spec) {
      res.writeHead(404, { "content-type": "application/json" });
      res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32001, message: "Session not found" }, id: null }));
      return;
    } else {
      badRequest(res, "Bad Request: No valid session ID provided");
      return;
    }
    await transport.handleRequest(req, res, body);
  } catch (error) {
    console.error(error);
    if (!res.headersSent) {
      res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32603, message: String(error) }, id: null }));
    }
  }
});
http.listen(port, "127.0.0.1", () => console.error(`listening on ${port}`));

-- wrk script: POSTs one JSON-RPC request per call to a Streamable HTTP MCP endpoint, in an
-- established session, with a fresh id each time (ids never repeat within a session).
--
--   MCP_METHOD=ping MCP_SESSION=<Mcp-Session-Id> MCP_VERSION=2025-11-25 \
--     wrk -t2 -c16 -d5s -s bench/wrk/mcp.lua http://127.0.0.1:PORT/mcp
--
-- At the end it prints one line "WRKJSON {...}" that bench/bench.py parses: the request
-- count, the duration, the errors (non-2xx statuses included) and latency percentiles (us).

local method = os.getenv("MCP_METHOD") or "ping"
local session = os.getenv("MCP_SESSION") or ""
local version = os.getenv("MCP_VERSION") or "2025-11-25"

local threads = {}
local counter = 0
local base = 0

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  base = (tid or 0) * 1000000000
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Accept"] = "application/json, text/event-stream"
  wrk.headers["Mcp-Protocol-Version"] = version
  if session ~= "" then
    wrk.headers["Mcp-Session-Id"] = session
  end
end

function request()
  counter = counter + 1
  local body = string.format('{"jsonrpc":"2.0","id":%d,"method":"%s","params":{}}', base + counter, method)
  return wrk.format(nil, nil, nil, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeout_errors":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end

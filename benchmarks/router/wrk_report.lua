-- wrk script: optional 4 KiB POST body (`-- 4k`), and a JSON summary line with exact percentiles.
function init(args)
  if args[1] == "4k" then
    wrk.method = "POST"
    wrk.body = string.rep("x", 4096)
    wrk.headers["Content-Type"] = "application/octet-stream"
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},"mean_us":%.1f,"max_us":%d',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.max))
  for _, p in ipairs({50, 90, 95, 99, 99.9}) do
    io.write(string.format(',"p%s_us":%d', tostring(p), latency:percentile(p)))
  end
  io.write("}\n")
end

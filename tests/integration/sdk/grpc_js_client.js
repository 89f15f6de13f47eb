// grpc-js through the router's h2c pass-through to a sandbox's process.v1 service; prints one JSON object.
// Usage: NODE_PATH=<grpc-js install>/node_modules node grpc_js_client.js <router host:port> <sandbox> <namespace> <process.proto>
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const [, , target, sandbox, namespace, proto] = process.argv;
const definition = loader.loadSync(proto, { keepCase: true, longs: Number, defaults: true, oneofs: true });
const client = new (grpc.loadPackageDefinition(definition).process.v1.ProcessService)(
  target, grpc.credentials.createInsecure());

function routing(name) {
  const md = new grpc.Metadata();
  md.set('x-sandbox-id', name);
  md.set('x-sandbox-namespace', namespace);
  md.set('x-sandbox-port', '9090');
  return md;
}

function execute(command, { name = sandbox, timeoutMs = 30000 } = {}) {
  return new Promise((resolve) => {
    client.Execute({ config: { command } }, routing(name), { deadline: Date.now() + timeoutMs },
      (err, resp) => resolve(err
        ? { code: err.code, details: err.details }
        : { code: 0, exit_code: resp.exit_code, stdout: resp.stdout.toString(), stdout_bytes: resp.stdout.length }));
  });
}

function start(command) {
  return new Promise((resolve) => {
    const events = [];
    const call = client.Start({ config: { command } }, routing(sandbox));
    call.on('data', (ev) => {
      if (ev.event === 'stdout') events.push(['stdout', ev.stdout.toString()]);
      else if (ev.event === 'exit') events.push(['exit', ev.exit.exit_code]);
      else events.push([ev.event]);
    });
    call.on('error', (err) => resolve({ code: err.code, details: err.details, events }));
    call.on('end', () => resolve({ code: 0, events }));
  });
}

async function main() {
  const out = {};
  out.first = await execute(['sh', '-c', 'echo hello from grpc-js']);
  // 50 calls at once on the one connection: many streams, HPACK dynamic-table references across them
  const many = await Promise.all(Array.from({ length: 50 }, (_, i) => execute(['echo', `call ${i}`])));
  out.concurrent = many.map((r) => r.stdout);
  // 1 MiB of output (the runtime's Execute bound): flow control through the pass-through
  out.big = await execute(['head', '-c', '1000000', '/dev/zero']);
  out.stream = await start(['sh', '-c', 'for i in 1 2 3; do echo line $i; sleep 0.1; done; exit 3']);
  // another sandbox on the same connection: refused (UNAVAILABLE), grpc-js retries it on a new connection
  out.other = await execute(['true'], { name: 'no-such-sandbox' });
  out.after_other = await execute(['echo', 'still here']);
  out.deadline = await execute(['sleep', '5'], { timeoutMs: 500 });
  out.after_deadline = await execute(['echo', 'after the deadline']);
  client.close();
  process.stdout.write(JSON.stringify(out));
}

main().catch((err) => { console.error(err); process.exit(1); });

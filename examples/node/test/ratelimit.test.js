'use strict';
// node --test: starts its own redis-server with the module on a free port and
// checks the reply -> header mapping for RL.SLIDING, RL.GCRA, CL.THROTTLE and
// RL.MULTI, through the HTTP middleware where it applies.
//
// The module is loaded with DEBUG_CLOCK so the tests can pin the limiter's
// clock (RL.DEBUG CLOCK SET/ADVANCE) and assert exact values without sleeping.
// RL_MODULE: the module .so (relative paths are taken from the repo root);
// RL_REDIS_SERVER: the redis-server binary.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const Redis = require('ioredis');

const rl = require('../ratelimit');
const { createServer } = require('../server');

const REPO = path.resolve(__dirname, '..', '..', '..');
// A unix time aligned to 60 s and 120 s windows, in µs.
const T0 = 1_700_000_040_000_000;

function modulePath() {
  const p = path.resolve(REPO, process.env.RL_MODULE || 'target/release/libredis_ratelimit.so');
  if (!fs.existsSync(p)) {
    throw new Error(`module not found at ${p}: run \`cargo build --release\` in ${REPO} (or set RL_MODULE)`);
  }
  return p;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function ping(port) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let buf = '';
    const done = (ok) => {
      sock.destroy();
      resolve(ok);
    };
    sock.setTimeout(1000, () => done(false));
    sock.on('error', () => done(false));
    sock.on('connect', () => sock.write('PING\r\n'));
    sock.on('data', (d) => {
      buf += d;
      if (buf.includes('\r\n')) done(buf.startsWith('+PONG'));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function startRedis() {
  const so = modulePath();
  const bin = process.env.RL_REDIS_SERVER || 'redis-server';
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rl-example-node-'));
  let log = '';
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort();
    const logfile = path.join(dir, `redis-${port}.log`);
    const proc = spawn(bin, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
      '--dir', dir, '--logfile', logfile, '--loadmodule', so, 'DEBUG_CLOCK'], { stdio: 'ignore' });
    let exited = false;
    proc.on('exit', () => { exited = true; });
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline && !exited) {
      if (await ping(port)) return { port, proc, dir };
      await sleep(20);
    }
    proc.kill('SIGKILL');
    log = fs.existsSync(logfile) ? fs.readFileSync(logfile, 'utf8') : '';
    if (!log.includes('Address already in use')) break;
  }
  fs.rmSync(dir, { recursive: true, force: true });
  throw new Error(`redis-server did not start:\n${log}`);
}

let server;
let redis;

before(async () => {
  server = await startRedis();
  redis = new Redis({ port: server.port, host: '127.0.0.1', lazyConnect: true });
  await redis.connect();
});

after(async () => {
  if (redis) redis.disconnect();
  if (server) {
    const exited = new Promise((r) => server.proc.once('exit', r));
    server.proc.kill('SIGTERM');
    await exited;
    fs.rmSync(server.dir, { recursive: true, force: true });
  }
});

const clockSet = (us) => redis.call('RL.DEBUG', 'CLOCK', 'SET', String(us));
const clockAdvance = (us) => redis.call('RL.DEBUG', 'CLOCK', 'ADVANCE', String(us));

/** Starts createServer(options) on a free port; returns { get(key), close() }. */
async function startService(options) {
  const srv = createServer({ redis, ...options });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${srv.address().port}`;
  return {
    async get(apiKey) {
      const r = await fetch(`${base}/hello`, { headers: apiKey ? { 'X-API-Key': apiKey } : {} });
      await r.text();
      return r;
    },
    close: () => new Promise((r) => srv.close(r)),
  };
}

const hdr = (r, name) => r.headers.get(name);
const nums = (r, ...names) => names.map((n) => (hdr(r, n) === null ? null : Number(hdr(r, n))));

// ---- the mapping on literal replies (no server) ----

test('parseReply takes RESP2 arrays and RESP3 maps', () => {
  const want = { allowed: 0, limit: 5, remaining: 0, retryAfterMs: 1001, resetAfterMs: 5000, admitted: false };
  assert.deepEqual(rl.parseReply([0, 5, 0, 1001, 5000]), want);
  assert.deepEqual(rl.parseReply([1, 10, 9, -1, 100, 0]).admitted, true); // RL.LEAKY's 6th field ignored
  const obj = { allowed: 0, limit: 5, remaining: 0, retry_after_ms: 1001, reset_after_ms: 5000 };
  assert.deepEqual(rl.parseReply(obj), want);
  assert.deepEqual(rl.parseReply(new Map(Object.entries(obj))), want);
  assert.throws(() => rl.parseReply([1, 2, 3]), TypeError);
  assert.throws(() => rl.parseReply(null), TypeError);
});

test('headersFor rounds up and omits Retry-After when the request can never pass', () => {
  const h = Object.fromEntries(rl.headersFor(rl.parseReply([0, 5, 0, 1001, 4001])));
  assert.deepEqual(h, { 'RateLimit-Limit': '5', 'RateLimit-Remaining': '0', 'RateLimit-Reset': '5', 'Retry-After': '2' });
  const never = Object.fromEntries(rl.headersFor(rl.parseReply([0, 5, 5, -1, 0])));
  assert.equal(never['Retry-After'], undefined);
  const legacy = Object.fromEntries(rl.headersFor(rl.parseReply([1, 5, 4, -1, 1500]), { legacy: true, now: 1_000_000 }));
  assert.equal(legacy['X-RateLimit-Reset'], '1002'); // (1_000_000 ms + 1500 ms) as unix seconds, rounded up
  assert.deepEqual([-1, 0, 1, 1000, 1001].map(rl.ceilSeconds), [0, 0, 1, 1, 2]);
});

test('parseMulti reports the most restrictive limit', () => {
  // admitted: fewest remaining wins
  let d = rl.parseMulti([1, -1, [1, 10, 7, -1, 300], [1, 100, 2, -1, 3600000]]);
  assert.deepEqual([d.binding, d.limit, d.remaining, d.resetAfterMs, d.retryAfterMs], [1, 100, 2, 3600000, -1]);
  // refused: the limit with the largest retry_after (the overall one)
  d = rl.parseMulti([0, 5000, [0, 10, 0, 100, 1000], [0, 100, 0, 5000, 60000], [0, 50, 9, -1, 10]]);
  assert.deepEqual([d.binding, d.limit, d.remaining, d.retryAfterMs], [1, 100, 0, 5000]);
  // refused for good (COST above a capacity): fewest remaining, no Retry-After
  d = rl.parseMulti([0, -1, [0, 3, 3, -1, 0], [0, 100, 90, -1, 500]]);
  assert.equal(d.binding, 0);
  assert.equal(Object.fromEntries(rl.headersFor(d))['Retry-After'], undefined);
});

// ---- against redis-server with the module ----

test('RL.SLIDING middleware: 200s, then 429 with Retry-After, then admitted again', async () => {
  await clockSet(T0);
  const svc = await startService({ algorithm: 'SLIDING', limit: 5, period: '60s' });
  try {
    for (let n = 1; n <= 5; n++) {
      const r = await svc.get('alice');
      assert.equal(r.status, 200);
      // the current window has a count: the key is fresh again at the end of the next window
      assert.deepEqual(nums(r, 'RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset', 'Retry-After'), [5, 5 - n, 120, null]);
    }
    const limited = await svc.get('alice');
    assert.equal(limited.status, 429);
    assert.equal(hdr(limited, 'content-type'), 'application/json');
    // 5 in this window: in the next one the weighted previous count, 5 × (60 − e)/60,
    // leaves room for one more once e ≥ 12 s, i.e. 72 s from now
    assert.deepEqual(nums(limited, 'RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset', 'Retry-After'), [5, 0, 120, 72]);

    await clockAdvance(71_999_000);
    assert.equal((await svc.get('alice')).status, 429, 'not admitted before Retry-After');
    await clockAdvance(1_000);
    const again = await svc.get('alice');
    assert.equal(again.status, 200, 'admitted once Retry-After has passed');
    assert.equal(hdr(again, 'RateLimit-Remaining'), '0');

    const other = await svc.get('bob');
    assert.deepEqual(nums(other, 'RateLimit-Remaining'), [4], 'keys are independent');
    assert.equal((await svc.get()).status, 401);
  } finally {
    await svc.close();
  }
});

test('RL.GCRA middleware with legacy X-RateLimit-* headers', async () => {
  await clockSet(T0);
  const svc = await startService({ algorithm: 'GCRA', limit: 5, period: '10s', legacy: true });
  try {
    for (let n = 1; n <= 5; n++) {
      const r = await svc.get('carol');
      assert.equal(r.status, 200);
      // one unit per 2 s: n units take 2n s to refill
      assert.deepEqual(nums(r, 'RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset'), [5, 5 - n, 2 * n]);
      assert.deepEqual(nums(r, 'X-RateLimit-Limit', 'X-RateLimit-Remaining'), [5, 5 - n]);
      const epoch = Number(hdr(r, 'X-RateLimit-Reset'));
      assert.ok(Math.abs(epoch - (Date.now() / 1000 + 2 * n)) <= 2, `X-RateLimit-Reset ${epoch} is a unix time`);
    }
    const limited = await svc.get('carol');
    assert.equal(limited.status, 429);
    assert.deepEqual(nums(limited, 'RateLimit-Remaining', 'RateLimit-Reset', 'Retry-After'), [0, 10, 2]);
    await clockAdvance(2_000_000);
    assert.equal((await svc.get('carol')).status, 200);
  } finally {
    await svc.close();
  }
});

test('CL.THROTTLE reply maps to the same headers', async () => {
  await clockSet(T0);
  // max_burst 2 (limit 3), 1 per 2 s
  for (let n = 1; n <= 3; n++) {
    const d = await rl.clThrottle(redis, 'cl:dave', 2, 1, 2);
    assert.equal(d.admitted, true);
    assert.deepEqual(Object.fromEntries(rl.headersFor(d)),
      { 'RateLimit-Limit': '3', 'RateLimit-Remaining': String(3 - n), 'RateLimit-Reset': String(2 * n) });
  }
  const d = await rl.clThrottle(redis, 'cl:dave', 2, 1, 2);
  assert.equal(d.admitted, false);
  assert.deepEqual(Object.fromEntries(rl.headersFor(d)),
    { 'RateLimit-Limit': '3', 'RateLimit-Remaining': '0', 'RateLimit-Reset': '6', 'Retry-After': '2' });
  // the same key is RL.GCRA key 1 2 BURST 3: a peek agrees
  const peek = await rl.check(redis, 'GCRA', 'cl:dave', { limit: 1, period: 2, burst: 3, cost: 0 });
  assert.deepEqual([peek.limit, peek.remaining, peek.resetAfterMs], [3, 0, 6000]);
});

test('RL.MULTI: headers describe the most restrictive limit', async () => {
  await clockSet(T0);
  const keys = ['{t1}:ip', '{t1}:user'];
  const limits = [
    { algorithm: 'GCRA', limit: 2, period: '10s' }, // burst 2, one per 5 s
    { algorithm: 'SLIDING', limit: 3, period: '60s' },
  ];
  const h = (d) => Object.fromEntries(rl.headersFor(d));

  let d = await rl.checkMulti(redis, keys, limits);
  assert.equal(d.binding, 0); // GCRA: 1 left, SLIDING: 2 left
  assert.deepEqual(h(d), { 'RateLimit-Limit': '2', 'RateLimit-Remaining': '1', 'RateLimit-Reset': '5' });
  d = await rl.checkMulti(redis, keys, limits);
  assert.deepEqual(h(d), { 'RateLimit-Limit': '2', 'RateLimit-Remaining': '0', 'RateLimit-Reset': '10' });

  d = await rl.checkMulti(redis, keys, limits); // GCRA refuses, SLIDING would admit
  assert.equal(d.admitted, false);
  assert.equal(d.binding, 0);
  assert.deepEqual(h(d), { 'RateLimit-Limit': '2', 'RateLimit-Remaining': '0', 'RateLimit-Reset': '10', 'Retry-After': '5' });

  await clockAdvance(5_000_000);
  d = await rl.checkMulti(redis, keys, limits); // both now at 0 left: the one that resets last
  assert.equal(d.admitted, true);
  assert.equal(d.binding, 1);
  assert.deepEqual(h(d), { 'RateLimit-Limit': '3', 'RateLimit-Remaining': '0', 'RateLimit-Reset': '115' });

  d = await rl.checkMulti(redis, keys, limits); // both refuse: GCRA in 5 s, SLIDING in 75 s
  assert.deepEqual(d.limits.map((l) => l.retryAfterMs), [5000, 75000]);
  assert.equal(d.binding, 1);
  assert.deepEqual(h(d), { 'RateLimit-Limit': '3', 'RateLimit-Remaining': '0', 'RateLimit-Reset': '115', 'Retry-After': '75' });
});

test('Redis down: 503, or straight through with failOpen', async () => {
  const dead = new Redis({ port: await freePort(), host: '127.0.0.1', lazyConnect: true,
    enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => null });
  dead.on('error', () => {});
  for (const [failOpen, status] of [[false, 503], [true, 200]]) {
    const srv = createServer({ redis: dead, algorithm: 'GCRA', limit: 1, period: '1s', failOpen });
    await new Promise((r) => srv.listen(0, '127.0.0.1', r));
    try {
      const r = await fetch(`http://127.0.0.1:${srv.address().port}/`, { headers: { 'X-API-Key': 'k' } });
      assert.equal(r.status, status);
      assert.equal(hdr(r, 'RateLimit-Limit'), null);
    } finally {
      await new Promise((r) => srv.close(r));
    }
  }
  dead.disconnect();
});

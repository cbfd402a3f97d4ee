'use strict';
// Demo: a node:http service rate-limited per X-API-Key.
//   REDIS_URL=redis://127.0.0.1:6379 PORT=8080 ALGORITHM=SLIDING LIMIT=100 PERIOD=1m node server.js
//   curl -i -H 'X-API-Key: alice' http://127.0.0.1:8080/
const http = require('node:http');
const Redis = require('ioredis');
const { rateLimit } = require('./ratelimit');

function createServer({ redis, ...options }) {
  const limiter = rateLimit({ redis, ...options });
  return http.createServer((req, res) =>
    limiter(req, res, () => {
      res.setHeader('Content-Type', 'application/json');
      res.end(JSON.stringify({ ok: true, path: req.url }));
    }),
  );
}

if (require.main === module) {
  const env = process.env;
  const redis = new Redis(env.REDIS_URL || 'redis://127.0.0.1:6379');
  const server = createServer({
    redis,
    algorithm: env.ALGORITHM || 'SLIDING',
    limit: Number(env.LIMIT || 100),
    period: env.PERIOD || '1m',
    burst: env.BURST ? Number(env.BURST) : undefined,
    legacy: env.LEGACY === '1',
  });
  server.listen(Number(env.PORT || 8080), '127.0.0.1', () => {
    console.log(`listening on http://127.0.0.1:${server.address().port}`);
  });
}

module.exports = { createServer };

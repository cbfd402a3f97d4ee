'use strict';
/**
 * redis-ratelimit from Node.js with ioredis: limiter replies mapped to HTTP.
 *
 *   const Redis = require('ioredis');
 *   const { rateLimit } = require('./ratelimit');
 *   const limiter = rateLimit({ redis: new Redis(), algorithm: 'SLIDING', limit: 100, period: '1m' });
 *   app.use(limiter);                       // Express / Connect: (req, res, next)
 *   http.createServer((req, res) => limiter(req, res, () => handler(req, res)));  // plain node:http
 *
 * Every admitted response carries RateLimit-Limit, RateLimit-Remaining and
 * RateLimit-Reset (seconds, rounded up); a limited one is a 429 with the same
 * headers and Retry-After (seconds, rounded up: a client that waits that long
 * is never early). See docs/http-headers.md for the mapping of every command.
 *
 * Also here: decisions from CL.THROTTLE and from RL.MULTI (where the headers
 * describe the most restrictive of the limits).
 */

/** Milliseconds to whole seconds, rounded up; 0 for ms <= 0. */
function ceilSeconds(ms) {
  return ms > 0 ? Math.ceil(ms / 1000) : 0;
}

const FIELDS = ['allowed', 'limit', 'remaining', 'retry_after_ms', 'reset_after_ms'];

/**
 * A decision from an RL.* limiter reply: a RESP2 array
 * [allowed, limit, remaining, retry_after_ms, reset_after_ms(, delay_ms)]
 * (ioredis), or a RESP3 map given as an object or a Map (node-redis with RESP3).
 */
function parseReply(reply) {
  let v;
  if (Array.isArray(reply) && reply.length >= 5) {
    v = reply.slice(0, 5);
  } else if (reply instanceof Map) {
    v = FIELDS.map((f) => reply.get(f));
  } else if (reply && typeof reply === 'object') {
    v = FIELDS.map((f) => reply[f]);
  }
  if (!v || v.some((x) => x === undefined || x === null || !Number.isFinite(Number(x)))) {
    throw new TypeError(`not a limiter reply: ${JSON.stringify(reply)}`);
  }
  const [allowed, limit, remaining, retryAfterMs, resetAfterMs] = v.map(Number);
  return { allowed, limit, remaining, retryAfterMs, resetAfterMs, admitted: allowed > 0 };
}

/**
 * CL.THROTTLE's reply [limited, limit, remaining, retry_after_s, reset_after_s]
 * as a decision (its durations are already seconds, rounded up).
 */
function parseClThrottle(reply) {
  if (!Array.isArray(reply) || reply.length !== 5) {
    throw new TypeError(`not a CL.THROTTLE reply: ${JSON.stringify(reply)}`);
  }
  const [limited, limit, remaining, retryS, resetS] = reply.map(Number);
  return {
    allowed: limited ? 0 : 1,
    limit,
    remaining,
    retryAfterMs: retryS < 0 ? -1 : retryS * 1000,
    resetAfterMs: resetS * 1000,
    admitted: !limited,
  };
}

/**
 * RL.MULTI's RESP2 reply [allowed, retry_after_ms, reply_1, ..., reply_n] as one
 * decision describing the most restrictive limit:
 *  - admitted: the limit with the fewest remaining units (ties: the one that
 *    takes longest to reset), since that is all the client can still spend;
 *  - refused: the limit that sets the overall retry_after_ms (the largest);
 *    when the request can never pass (retry_after_ms -1), the limit with the
 *    fewest remaining units.
 * retryAfterMs is always the overall one. `limits` keeps every limit's decision.
 */
function parseMulti(reply) {
  if (!Array.isArray(reply) || reply.length < 3) {
    throw new TypeError(`not an RL.MULTI reply: ${JSON.stringify(reply)}`);
  }
  const allowed = Number(reply[0]);
  const retryAfterMs = Number(reply[1]);
  const limits = reply.slice(2).map(parseReply);
  const fewestRemaining = (a, b) =>
    a.remaining !== b.remaining ? a.remaining - b.remaining : b.resetAfterMs - a.resetAfterMs;
  let binding;
  if (allowed > 0 || retryAfterMs < 0) {
    binding = [...limits].sort(fewestRemaining)[0];
  } else {
    binding = [...limits].sort((a, b) => b.retryAfterMs - a.retryAfterMs || fewestRemaining(a, b))[0];
  }
  return {
    allowed,
    limit: binding.limit,
    remaining: binding.remaining,
    retryAfterMs: allowed > 0 ? -1 : retryAfterMs,
    resetAfterMs: binding.resetAfterMs,
    admitted: allowed > 0,
    binding: limits.indexOf(binding),
    limits,
  };
}

/**
 * The HTTP headers for a decision, as [name, value] pairs.
 * legacy: also X-RateLimit-Limit / -Remaining / -Reset, the last one as a Unix
 * time in seconds (GitHub's convention), computed on this process's clock.
 */
function headersFor(d, { legacy = false, now = Date.now() } = {}) {
  const reset = ceilSeconds(d.resetAfterMs);
  const h = [
    ['RateLimit-Limit', String(d.limit)],
    ['RateLimit-Remaining', String(d.remaining)],
    ['RateLimit-Reset', String(reset)],
  ];
  if (!d.admitted && d.retryAfterMs >= 0) {
    h.push(['Retry-After', String(ceilSeconds(d.retryAfterMs))]);
  }
  if (legacy) {
    h.push(
      ['X-RateLimit-Limit', String(d.limit)],
      ['X-RateLimit-Remaining', String(d.remaining)],
      ['X-RateLimit-Reset', String(Math.ceil((now + Math.max(d.resetAfterMs, 0)) / 1000))],
    );
  }
  return h;
}

/** RL.SLIDING key limit window [COST n], or RL.GCRA key limit period [BURST n] [COST n]. */
async function check(redis, algorithm, key, { limit, period, burst, cost } = {}) {
  const algo = String(algorithm).toUpperCase();
  if (algo !== 'SLIDING' && algo !== 'GCRA') {
    throw new TypeError(`algorithm must be SLIDING or GCRA, got ${algorithm}`);
  }
  const args = [key, limit, period];
  if (burst !== undefined) {
    if (algo !== 'GCRA') throw new TypeError('BURST is an option of GCRA only');
    args.push('BURST', burst);
  }
  if (cost !== undefined) args.push('COST', cost);
  return parseReply(await redis.call(`RL.${algo}`, ...args));
}

/** CL.THROTTLE key max_burst count_per_period period [quantity] as a decision. */
async function clThrottle(redis, key, maxBurst, countPerPeriod, periodSeconds, quantity = 1) {
  return parseClThrottle(await redis.call('CL.THROTTLE', key, maxBurst, countPerPeriod, periodSeconds, quantity));
}

/**
 * RL.MULTI over several keys, one limit each: limits is a list of
 * { algorithm: 'GCRA' | 'SLIDING' | ..., limit, period, burst? }.
 * In Redis Cluster the keys must share a hash slot ({tag}).
 */
async function checkMulti(redis, keys, limits, { cost } = {}) {
  const args = [keys.length, ...keys];
  for (const l of limits) {
    args.push(l.algorithm, l.limit, l.period);
    if (l.burst !== undefined) args.push('BURST', l.burst);
  }
  if (cost !== undefined) args.push('COST', cost);
  return parseMulti(await redis.call('RL.MULTI', ...args));
}

function sendJson(res, status, body) {
  const data = JSON.stringify(body);
  res.statusCode = status;
  res.setHeader('Content-Type', 'application/json');
  res.setHeader('Content-Length', Buffer.byteLength(data));
  res.end(data);
}

/**
 * Middleware (req, res, next) for node:http, Express or Connect.
 *   redis      an ioredis client
 *   algorithm  'SLIDING' (default) or 'GCRA'
 *   limit, period, burst (GCRA only)
 *   key        req => the client's identity (default: the X-API-Key header);
 *              a request without one gets 401
 *   prefix     Redis key prefix (default 'rl:')
 *   legacy     also send X-RateLimit-* headers
 *   failOpen   when Redis fails: true lets the request through (no headers),
 *              false (default) answers 503
 */
function rateLimit({
  redis,
  algorithm = 'SLIDING',
  limit,
  period,
  burst,
  key = (req) => req.headers['x-api-key'],
  prefix = 'rl:',
  legacy = false,
  failOpen = false,
}) {
  if (!redis) throw new TypeError('rateLimit needs an ioredis client');
  return async function rateLimitMiddleware(req, res, next) {
    const id = key(req);
    if (!id) {
      res.setHeader('WWW-Authenticate', 'ApiKey header="X-API-Key"');
      return sendJson(res, 401, { error: 'missing X-API-Key header' });
    }
    let d;
    try {
      d = await check(redis, algorithm, prefix + id, { limit, period, burst });
    } catch (err) {
      if (failOpen) return next();
      return sendJson(res, 503, { error: 'rate limiter unavailable' });
    }
    for (const [name, value] of headersFor(d, { legacy })) res.setHeader(name, value);
    if (!d.admitted) {
      return sendJson(res, 429, { error: 'rate limit exceeded', retry_after_ms: d.retryAfterMs });
    }
    return next();
  };
}

module.exports = {
  ceilSeconds,
  parseReply,
  parseClThrottle,
  parseMulti,
  headersFor,
  check,
  clThrottle,
  checkMulti,
  rateLimit,
};

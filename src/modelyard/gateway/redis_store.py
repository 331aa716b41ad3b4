"""The Redis limit store: the `ratelimit` algorithm as two Lua scripts; N replicas, one limit.

Each script runs atomically inside Redis and takes the time from Redis (`TIME`), so replica
clocks do not matter. Keys: `<prefix>{tenant}:rpm|tpm|ipm|conc` (the braces keep a tenant's keys in
one Redis Cluster slot). Bucket hashes expire once they would be full again; the concurrency
counter expires `concurrency_ttl_s` after its last admit, so slots held by a crashed replica
come back. Socket timeouts are short and there are no client retries: a dead Redis costs at
most `timeout_s` per call and surfaces as `StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from modelyard.gateway.config import Quota
from modelyard.gateway.ratelimit import (
    Charge,
    Limit,
    LimitDecision,
    LimitState,
    StoreUnavailable,
    decide,
    item_need,
    token_cost,
)

_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function level(key, cap)
  local s = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(s[1])
  if tokens == nil then return cap end
  return math.min(cap, tokens + math.max(0, now - tonumber(s[2])) * cap / 60)
end
local function store(key, cap, tokens)
  redis.call('HSET', key, 'tokens', string.format('%.6f', tokens), 'ts', string.format('%.6f', now))
  redis.call('PEXPIRE', key, math.ceil((cap - tokens) * 60000 / cap) + 1000)
end
"""

# KEYS: rpm, tpm, ipm, conc.
# ARGV: rpm cap, tpm cap, tpm cost, ipm cap, ipm need, ipm debit, max concurrent, conc ttl ms
ACQUIRE_LUA = (
    _COMMON
    + """
local rcap, tcap = tonumber(ARGV[1]), tonumber(ARGV[2])
local cost, icap = tonumber(ARGV[3]), tonumber(ARGV[4])
local ineed, idebit, cmax = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local r, tk, it = 0, 0, 0
if rcap > 0 then r = level(KEYS[1], rcap) end
if tcap > 0 then tk = level(KEYS[2], tcap) end
if icap > 0 then it = level(KEYS[3], icap) end
local c = tonumber(redis.call('GET', KEYS[4]) or '0')
local refused = 0
if rcap > 0 and r < 1 then refused = 1
elseif tcap > 0 and cost > 0 and tk < cost then refused = 2
elseif icap > 0 and idebit > 0 and it < ineed then refused = 4
elseif cmax > 0 and c >= cmax then refused = 3 end
if refused == 0 then
  if rcap > 0 then r = r - 1; store(KEYS[1], rcap, r) end
  if tcap > 0 then tk = tk - cost; store(KEYS[2], tcap, tk) end
  if icap > 0 then it = it - idebit; store(KEYS[3], icap, it) end
  if cmax > 0 then
    c = redis.call('INCR', KEYS[4])
    redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[8]))
  end
end
return {refused, string.format('%.6f', r), string.format('%.6f', tk), string.format('%.6f', it), c}
"""
)

# KEYS: tpm, conc. ARGV: tpm cap, token delta, release (0/1)
SETTLE_LUA = (
    _COMMON
    + """
local tcap, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
if tcap > 0 and delta ~= 0 then
  store(KEYS[1], tcap, math.min(tcap, level(KEYS[1], tcap) + delta))
end
if ARGV[3] == '1' then
  if redis.call('DECR', KEYS[2]) < 0 then redis.call('SET', KEYS[2], 0) end
end
return 1
"""
)

REDIS_ERRORS = (RedisError, OSError, TimeoutError)


def make_client(url: str, timeout_s: float) -> Redis:
    """An asyncio client that gives up fast: short timeouts, no retries."""
    client: Redis = Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )
    return client


class RedisStore:
    """Shared buckets in Redis; raises `StoreUnavailable` when Redis does not answer in time."""

    def __init__(
        self,
        client: Redis,
        *,
        prefix: str = "modelyard:rl:",
        timeout_s: float = 0.25,
        concurrency_ttl_s: float = 600.0,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.concurrency_ttl_ms = int(concurrency_ttl_s * 1000)
        self._acquire = client.register_script(ACQUIRE_LUA)
        self._settle = client.register_script(SETTLE_LUA)

    def _keys(self, tenant: str, *names: str) -> list[str]:
        return [f"{self.prefix}{{{tenant}}}:{name}" for name in names]

    async def _run(self, coro: Any) -> Any:
        try:
            async with asyncio.timeout(self.timeout_s * 2):
                return await coro
        except REDIS_ERRORS as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc

    async def acquire(self, tenant: str, quota: Quota, charge: Charge) -> LimitDecision:
        args = [quota.rpm or 0, quota.tpm or 0, token_cost(quota, charge.tokens)]
        args += [quota.ipm or 0, item_need(quota, charge.items), max(0, charge.items)]
        args += [quota.max_concurrent or 0, self.concurrency_ttl_ms]
        keys = self._keys(tenant, "rpm", "tpm", "ipm", "conc")
        raw = await self._run(self._acquire(keys=keys, args=args))
        levels = (float(raw[1]), float(raw[2]), float(raw[3]))
        state = LimitState(Limit(int(raw[0])), *levels, int(raw[4]))
        return decide(quota, charge, state)

    async def settle(self, tenant: str, quota: Quota, token_delta: int, release: bool) -> None:
        release = release and bool(quota.max_concurrent)
        if not release and not (quota.tpm and token_delta):
            return
        args = [quota.tpm or 0, token_delta, 1 if release else 0]
        await self._run(self._settle(keys=self._keys(tenant, "tpm", "conc"), args=args))

    async def close(self) -> None:
        await self.client.aclose()

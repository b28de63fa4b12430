"""The federation state in Redis: one set of peer checkpoints and pending entries per deployment.

Same interface as :class:`akrelay.federation.state.FederationState` (the SQLite file of one
data directory), so that the sync leader of a deployment (:class:`akrelay.leader.RedisLease`)
can move to another node and continue from the checkpoints its predecessor saved.

Every write is *fenced*: it carries the fencing token the writer got when it took the
lease, and one Lua script compares it with the deployment's current token before it
writes anything. A leader that stalled past its lease (a long GC pause, a frozen VM)
and was replaced has an older token: its write is refused atomically and raises
:class:`~akrelay.leader.LeadershipLost`, which stops its sync loop. Reads need no token.

Keys (``<p>`` is :data:`KEY_PREFIX`, ``akrelay:sync:``), next to the lease's ``<p>leader``
and ``<p>token`` (:class:`~akrelay.leader.RedisLease`):

* ``<p>peers`` hash: origin -> the peer's state (JSON);
* ``<p>pending:<origin>`` hash: per entry ``r:<id>`` raw envelope, ``m:<id>`` missing (JSON),
  ``a:<id>`` added at, ``n:<id>`` attempts, ``t:<id>`` retry at; and ``#ord``, ``#bytes``;
* ``<p>pending-order:<origin>`` sorted set: entry ids by arrival (oldest first);
* ``<p>pending-origins`` set: origins with pending entries.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Callable, Iterator

from akrelay.federation.state import PeerState, PendingEntry
from akrelay.leader import TOKEN_KEY, LeadershipLost
from akrelay.store.redis.client import connect, unavailable

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

KEY_PREFIX = "akrelay:sync:"

#: Methods wrapped in this answer a Redis outage as StoreUnavailable (503 with Retry-After upstream).
_outage_is_503 = unavailable("the federation state (Redis)")

#: Every write script starts here: a token other than the deployment's current one writes nothing.
_FENCE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
"""
_PUT = _FENCE + """
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
"""
_ADD_PENDING = _FENCE + """
local h, z, id = KEYS[2], KEYS[3], ARGV[2]
if redis.call('HEXISTS', h, 'r:' .. id) == 1 then
  redis.call('HSET', h, 'm:' .. id, ARGV[4], 't:' .. id, ARGV[6])
  redis.call('HINCRBY', h, 'n:' .. id, 1)
  return 0
end
local ord = redis.call('HINCRBY', h, '#ord', 1)
redis.call('HSET', h, 'r:' .. id, ARGV[3], 'm:' .. id, ARGV[4], 'a:' .. id, ARGV[5], 'n:' .. id, 1, 't:' .. id, ARGV[6])
local bytes = redis.call('HINCRBY', h, '#bytes', string.len(ARGV[3]))
redis.call('ZADD', z, ord, id)
redis.call('SADD', KEYS[4], ARGV[9])
local max_count, max_bytes = tonumber(ARGV[7]), tonumber(ARGV[8])
local evicted = 0
while true do
  local count = redis.call('ZCARD', z)
  if count <= 1 or (count <= max_count and bytes <= max_bytes) then
    break
  end
  local oldest = redis.call('ZRANGE', z, 0, 0)[1]
  bytes = redis.call('HINCRBY', h, '#bytes', -redis.call('HSTRLEN', h, 'r:' .. oldest))
  redis.call('HDEL', h, 'r:' .. oldest, 'm:' .. oldest, 'a:' .. oldest, 'n:' .. oldest, 't:' .. oldest)
  redis.call('ZREM', z, oldest)
  evicted = evicted + 1
end
return evicted
"""
_REMOVE_PENDING = _FENCE + """
local h, z, id = KEYS[2], KEYS[3], ARGV[2]
if redis.call('HEXISTS', h, 'r:' .. id) == 0 then
  return 0
end
redis.call('HINCRBY', h, '#bytes', -redis.call('HSTRLEN', h, 'r:' .. id))
redis.call('HDEL', h, 'r:' .. id, 'm:' .. id, 'a:' .. id, 'n:' .. id, 't:' .. id)
redis.call('ZREM', z, id)
if redis.call('ZCARD', z) == 0 then
  redis.call('DEL', h, z)
  redis.call('SREM', KEYS[4], ARGV[3])
end
return 1
"""
#: An operator's change to one peer's state, not fenced (the operator holds no lease) but a
#: compare-and-set on the state it read: a concurrent write by the leader makes it retry.
_SWAP = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""
#: Oldest first, up to ARGV[1] (an index: -1 for all), in one consistent read.
_PENDING = """
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[1]))) do
  local v = redis.call('HMGET', KEYS[1], 'r:' .. id, 'm:' .. id, 'a:' .. id, 'n:' .. id, 't:' .. id)
  table.insert(out, id)
  for i = 1, 5 do
    table.insert(out, v[i])
  end
end
return out
"""



class RedisFederationState:
    """Thread-safe store of :class:`PeerState` and pending entries in Redis, writes fenced by ``token``.

    ``token`` is the fencing token of the lease this writer holds (``None``: read only).
    ``on_fenced`` is called (once per refusal) before :class:`LeadershipLost` is raised,
    so the owner can stop its loop.
    """

    def __init__(self, client: redis.Redis, *, token: int | None = None, prefix: str = KEY_PREFIX,
                 max_pending: int = 10_000, max_pending_bytes: int = 64 * 1024 * 1024,
                 on_fenced: Callable[[], None] | None = None, owns_client: bool = False) -> None:
        self._r = client
        self.token = token
        self.prefix = prefix
        self.path = f"redis {prefix}"
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.on_fenced = on_fenced
        self._owns_client = owns_client
        self._put = client.register_script(_PUT)
        self._add = client.register_script(_ADD_PENDING)
        self._remove = client.register_script(_REMOVE_PENDING)
        self._pending = client.register_script(_PENDING)
        self._swap = client.register_script(_SWAP)

    @classmethod
    def connect(cls, url: str, *, token: int | None = None, prefix: str = KEY_PREFIX, max_pending: int = 10_000,
                max_pending_bytes: int = 64 * 1024 * 1024,
                on_fenced: Callable[[], None] | None = None) -> "RedisFederationState":
        """A state over a new client for ``url``, closed with the state."""
        return cls(connect(url), token=token, prefix=prefix, max_pending=max_pending,
                   max_pending_bytes=max_pending_bytes, on_fenced=on_fenced, owns_client=True)

    def close(self) -> None:
        if self._owns_client:
            self._r.close()

    # -- keys and fencing ---------------------------------------------------

    @property
    def _token_key(self) -> str:
        return self.prefix + TOKEN_KEY

    @property
    def _peers(self) -> str:
        return self.prefix + "peers"

    @property
    def _origins(self) -> str:
        return self.prefix + "pending-origins"

    def _hash(self, origin: str) -> str:
        return f"{self.prefix}pending:{origin}"

    def _order(self, origin: str) -> str:
        return f"{self.prefix}pending-order:{origin}"

    def _fenced(self, script: Script, keys: list[str], args: list[str | int | bytes]) -> int:
        """Run a write script with our token first; a refusal stops us (:class:`LeadershipLost`)."""
        if self.token is None:
            raise LeadershipLost("this process holds no sync lease: the federation state is read only here")
        reply = int(script(keys=[self._token_key, *keys], args=[self.token, *args]))
        if reply < 0:
            stale, self.token = self.token, None
            if self.on_fenced is not None:
                self.on_fenced()
            raise LeadershipLost(f"fencing token {stale} is stale: another node leads the sync loop now")
        return reply

    # -- peer state ---------------------------------------------------------

    @_outage_is_503
    def get(self, origin: str) -> PeerState:
        raw = self._r.hget(self._peers, origin)
        return PeerState.from_json(raw) if raw is not None else PeerState(origin)

    @_outage_is_503
    def put(self, state: PeerState) -> None:
        self._fenced(self._put, [self._peers], [state.origin, json.dumps(state.to_json(), sort_keys=True)])

    @_outage_is_503
    def all(self) -> list[PeerState]:
        rows = self._r.hgetall(self._peers)
        return [PeerState.from_json(data) for _origin, data in sorted(rows.items())]

    @_outage_is_503
    def clear_misbehaving(self, origin: str, now_ms: int) -> PeerState | None:
        """An operator's ``peers clear`` (see :meth:`PeerState.clear_misbehaving`); ``None`` if not misbehaving.

        Needs no lease: the running leader skips (and does not write) a misbehaving peer, and
        the swap only happens if the state is still the one read, so no write is lost.
        """
        for _ in range(100):
            raw = self._r.hget(self._peers, origin)
            if raw is None:
                return None
            old = PeerState.from_json(raw)
            if not old.misbehaving:
                return None
            new = old.clear_misbehaving(now_ms)
            if int(self._swap(keys=[self._peers], args=[origin, raw, json.dumps(new.to_json(), sort_keys=True)])):
                return new
        raise RuntimeError(f"the state of {origin} kept changing while it was being cleared; try again")

    # -- pending set --------------------------------------------------------

    @_outage_is_503
    def pending(self, origin: str, limit: int | None = None) -> list[PendingEntry]:
        """Oldest first, so long-waiting events are retried before new ones."""
        if limit is not None and limit <= 0:
            return []
        flat = self._pending(keys=[self._hash(origin), self._order(origin)], args=[-1 if limit is None else limit - 1])
        out = []
        for i in range(0, len(flat), 6):
            event_id, raw, missing, added, attempts, retry_at = flat[i:i + 6]
            if raw is None:  # never: the script reads the hash and the order together
                continue
            out.append(PendingEntry(origin, event_id.decode(), bytes(raw), tuple(json.loads(missing)), int(added),
                                    int(attempts), int(retry_at)))
        return out

    @_outage_is_503
    def pending_count(self, origin: str | None = None) -> int:
        if origin is not None:
            return int(self._r.zcard(self._order(origin)))
        return sum(int(self._r.zcard(self._order(o))) for o in self.iter_origins_with_pending())

    @_outage_is_503
    def add_pending(self, origin: str, event_id: str, raw: bytes, missing: list[str] | tuple[str, ...],
                    now_ms: int, retry_at: int = 0) -> int:
        """Keep ``raw`` until its dependencies arrive; returns how many old entries were evicted.

        Bounded by count and bytes per peer like the SQLite set; the oldest entries go first.
        """
        return self._fenced(self._add, [self._hash(origin), self._order(origin), self._origins],
                            [event_id, raw, json.dumps(sorted(missing)), now_ms, retry_at,
                             self.max_pending, self.max_pending_bytes, origin])

    @_outage_is_503
    def remove_pending(self, origin: str, event_id: str) -> bool:
        return bool(self._fenced(self._remove, [self._hash(origin), self._order(origin), self._origins],
                                 [event_id, origin]))

    @_outage_is_503
    def is_pending(self, origin: str, event_id: str) -> bool:
        return bool(self._r.hexists(self._hash(origin), "r:" + event_id))

    @_outage_is_503
    def iter_origins_with_pending(self) -> Iterator[str]:
        return iter(sorted(o.decode() if isinstance(o, bytes) else o for o in self._r.smembers(self._origins)))

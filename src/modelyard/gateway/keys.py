"""API keys: generation, hashing and the stores that keep only their SHA-256 hashes.

A key is `my-` + 32 random bytes (urlsafe base64), shown once at creation. A store never sees
the key itself: it is indexed by `hash_key(key)` and every match is confirmed with a
constant-time comparison. The stores are synchronous (the CLI uses them directly); the server
calls them off the event loop (`auth.KeyLookup`). The SQLite file is created readable by its
owner only (mode 0600, in a 0700 folder when the folder is new).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

KEY_PREFIX = "my-"


def generate_key() -> str:
    """A new high-entropy API key (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """Hex SHA-256 of the key: what the stores keep."""
    return hashlib.sha256(key.encode()).hexdigest()


def hashes_match(stored: str, presented_key: str) -> bool:
    """Constant-time check of a presented key against a stored hash."""
    return hmac.compare_digest(stored.encode(), hash_key(presented_key).encode())


@dataclass(frozen=True, kw_only=True)
class KeyRecord:
    """A stored key: its settings override the tenant's (None: use the tenant's)."""

    key_id: str  # public id (for list/revoke and logs), never the key
    key_hash: str  # hex SHA-256 of the key
    tenant: str  # tenant id
    models: tuple[str, ...] | None = None  # allowed models; None: tenant's list
    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens per minute
    ipm: int | None = None  # inputs per minute (non-LLM models)
    max_concurrent: int | None = None  # concurrent requests
    priority: int | None = None  # scheduler priority class
    admin: bool = False  # holds the admin scope (model control, /admin, /metrics)
    created_at: float = 0.0  # unix time
    revoked_at: float | None = None  # unix time of revocation; None: active

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def new_record(tenant: str, **settings: Any) -> tuple[str, KeyRecord]:
    """A fresh key and its record (not yet stored)."""
    if not tenant:
        raise ValueError("a key needs a tenant")
    key = generate_key()
    record = KeyRecord(
        key_id="k_" + secrets.token_hex(6),
        key_hash=hash_key(key),
        tenant=tenant,
        created_at=time.time(),
        **settings,
    )
    return key, record


class KeyStore(Protocol):
    def add(self, record: KeyRecord) -> None: ...

    def find(self, key: str) -> KeyRecord | None:
        """The active record for a presented key, or None."""
        ...

    def list(self) -> list[KeyRecord]: ...

    def revoke(self, key_id: str) -> bool:
        """Revoke by id; False when no such active key."""
        ...

    def has_keys(self) -> bool:
        """Whether any active key exists (decides `auth: auto`)."""
        ...


def _to_json(record: KeyRecord) -> str:
    return json.dumps(asdict(record))


def _from_json(text: str | bytes) -> KeyRecord:
    data = json.loads(text)
    if data.get("models") is not None:
        data["models"] = tuple(data["models"])
    return KeyRecord(**data)


class SqliteKeyStore:
    """Keys in one SQLite file (one connection per call: safe from any thread)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()

    def _connect(self) -> sqlite3.Connection:
        if not self.path.exists():
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # another process was first
                # owner-only before the first byte is written
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        conn = sqlite3.connect(self.path, timeout=5.0)
        conn.execute(
            "CREATE TABLE IF NOT EXISTS api_keys (key_id TEXT PRIMARY KEY, "
            "key_hash TEXT UNIQUE NOT NULL, record TEXT NOT NULL, revoked INTEGER DEFAULT 0)"
        )
        return conn

    def add(self, record: KeyRecord) -> None:
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO api_keys (key_id, key_hash, record) VALUES (?, ?, ?)",
                (record.key_id, record.key_hash, _to_json(record)),
            )
        conn.close()

    def find(self, key: str) -> KeyRecord | None:
        if not self.path.exists():
            return None
        conn = self._connect()
        try:
            row = conn.execute(
                "SELECT key_hash, record FROM api_keys WHERE key_hash = ? AND revoked = 0",
                (hash_key(key),),
            ).fetchone()
        finally:
            conn.close()
        if row is None or not hashes_match(row[0], key):
            return None
        return _from_json(row[1])

    def list(self) -> list[KeyRecord]:
        if not self.path.exists():
            return []
        conn = self._connect()
        try:
            rows = conn.execute("SELECT record FROM api_keys ORDER BY rowid").fetchall()
        finally:
            conn.close()
        return [_from_json(r[0]) for r in rows]

    def revoke(self, key_id: str) -> bool:
        if not self.path.exists():
            return False
        with self._connect() as conn:
            row = conn.execute(
                "SELECT record FROM api_keys WHERE key_id = ? AND revoked = 0", (key_id,)
            ).fetchone()
            if row is not None:
                data = json.loads(row[0])
                data["revoked_at"] = time.time()
                conn.execute(
                    "UPDATE api_keys SET revoked = 1, record = ? WHERE key_id = ?",
                    (json.dumps(data), key_id),
                )
        conn.close()
        return row is not None

    def has_keys(self) -> bool:
        return any(r.active for r in self.list())


class RedisKeyStore:
    """Keys in Redis: `<prefix>hash:<sha256>` -> record JSON, `<prefix>id:<key_id>` -> hash."""

    def __init__(self, url: str, *, prefix: str = "modelyard:keys:", timeout_s: float = 1.0):
        import redis

        self.prefix = prefix
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )

    def add(self, record: KeyRecord) -> None:
        pipe = self.client.pipeline()
        pipe.set(self.prefix + "hash:" + record.key_hash, _to_json(record))
        pipe.set(self.prefix + "id:" + record.key_id, record.key_hash)
        pipe.execute()

    def find(self, key: str) -> KeyRecord | None:
        digest = hash_key(key)
        raw = self.client.get(self.prefix + "hash:" + digest)
        if raw is None:
            return None
        record = _from_json(raw)
        if not record.active or not hashes_match(record.key_hash, key):
            return None
        return record

    def list(self) -> list[KeyRecord]:
        records = []
        for name in self.client.scan_iter(match=self.prefix + "hash:*"):
            raw = self.client.get(name)
            if raw is not None:
                records.append(_from_json(raw))
        return sorted(records, key=lambda r: r.created_at)

    def revoke(self, key_id: str) -> bool:
        digest = self.client.get(self.prefix + "id:" + key_id)
        if digest is None:
            return False
        name = self.prefix + "hash:" + (digest.decode() if isinstance(digest, bytes) else digest)
        raw = self.client.get(name)
        if raw is None:
            return False
        data = json.loads(raw)
        if data.get("revoked_at") is not None:
            return False
        data["revoked_at"] = time.time()
        self.client.set(name, json.dumps(data))
        return True

    def has_keys(self) -> bool:
        return any(r.active for r in self.list())

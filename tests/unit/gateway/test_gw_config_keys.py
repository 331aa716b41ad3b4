"""Gateway config loading, key generation/hashing/storage, credential header parsing."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from modelyard.gateway.auth import credentials_from_headers
from modelyard.gateway.config import GatewayConfig, Quota
from modelyard.gateway.keys import SqliteKeyStore, generate_key, hash_key, hashes_match, new_record

pytestmark = pytest.mark.unit


def test_from_dict_parses_every_section() -> None:
    config = GatewayConfig.from_dict(
        {
            "auth": True,
            "redis_url": "redis://127.0.0.1:1/0",
            "tenants": {
                "acme": {"models": ["chat"], "priority": 2, "rpm": 10, "ipm": 7, "admin": True}
            },
            "rate_limit": {"store": "redis", "on_store_error": "closed", "default": {"tpm": 99}},
            "jwt": {
                "jwks_file": "/x.json",
                "audience": "a",
                "algorithms": ["RS256"],
                "scope_claim": "scp",
                "admin_scope": "modelyard.admin",
            },
            "routes": {
                "seed": 3,
                "models": {"chat": {"target": "m1", "aliases": ["gpt"], "canary": {"m2": 0.1}}},
            },
        }
    )
    assert config.auth == "on"
    acme = config.tenants["acme"]
    assert acme.models == frozenset({"chat"})
    assert acme.priority == 2
    assert acme.admin
    assert acme.quota == Quota(rpm=10, ipm=7)
    assert config.rate_limit.default_quota == Quota(tpm=99)
    assert config.rate_limit.on_store_error == "closed"
    assert config.jwt is not None
    assert config.jwt.algorithms == ("RS256",)
    assert (config.jwt.scope_claim, config.jwt.admin_scope) == ("scp", "modelyard.admin")
    assert "/metrics" not in config.open_paths  # admin scope unless opened
    route = config.routes.models[0]
    assert (route.name, route.target, route.aliases, route.canary) == (
        "chat",
        "m1",
        ("gpt",),
        (("m2", 0.1),),
    )


@pytest.mark.parametrize(
    "data",
    [
        {"bogus": 1},
        {"auth": "maybe"},
        {"tenants": {"a": {"rpm": 0}}},
        {"tenants": {"a": {"rpm": "ten"}}},
        {"tenants": {"a": {"ipm": -1}}},
        {"rate_limit": {"store": "redis"}},  # no redis_url
        {"rate_limit": {"on_store_error": "sometimes"}},
        {"jwt": {"audience": "x"}},  # neither jwks_file nor jwks_url
        {"jwt": {"jwks_file": "f", "algorithms": ["HS256"]}},  # symmetric: refused
        {"routes": {"models": {"chat": {"canary": {"a": 0.7, "b": 0.6}}}}},
        {"routes": {"models": {"a": {"aliases": ["x"]}, "b": {"aliases": ["x"]}}}},
        {"tenants": ["acme"]},
    ],
)
def test_from_dict_rejects_invalid_config(data: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        GatewayConfig.from_dict(data)


def test_keys_are_high_entropy_and_stored_hashed(tmp_path) -> None:
    keys = {generate_key() for _ in range(50)}
    assert len(keys) == 50
    assert all(k.startswith("my-") and len(k) >= 3 + 43 for k in keys)
    key = next(iter(keys))
    assert hash_key(key) == hashlib.sha256(key.encode()).hexdigest()
    assert hashes_match(hash_key(key), key)
    assert not hashes_match(hash_key(key), key + "x")

    store = SqliteKeyStore(tmp_path / "private" / "keys.db")
    key, record = new_record("acme", models=("chat",), rpm=5)
    store.add(record)
    assert (tmp_path / "private" / "keys.db").stat().st_mode & 0o777 == 0o600  # owner only
    assert (tmp_path / "private").stat().st_mode & 0o777 == 0o700
    tmp_path = tmp_path / "private"
    raw = (tmp_path / "keys.db").read_bytes()
    assert key.encode() not in raw
    assert record.key_hash.encode() in raw
    found = store.find(key)
    assert found is not None
    assert found.tenant == "acme"
    assert found.models == ("chat",)
    assert store.find(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert store.has_keys()
    assert store.revoke(record.key_id)
    assert not store.revoke(record.key_id)
    assert store.find(key) is None
    assert not store.has_keys()
    assert [r.key_id for r in store.list()] == [record.key_id]
    with sqlite3.connect(tmp_path / "keys.db") as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(api_keys)")]
    assert "key" not in columns


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({b"authorization": b"Bearer my-abc"}, "my-abc"),
        ({b"authorization": b"bearer   tok.en.x  "}, "tok.en.x"),
        ({b"x-api-key": b"my-k"}, "my-k"),
        ({b"x-api-key": b"my-k", b"authorization": b"Bearer other"}, "my-k"),
        ({b"authorization": b"Basic dXNlcjpwdw=="}, None),
        ({b"authorization": b"Bearer "}, None),
        ({}, None),
    ],
)
def test_credentials_from_headers(headers: dict[bytes, bytes], expected: str | None) -> None:
    assert credentials_from_headers(headers) == expected

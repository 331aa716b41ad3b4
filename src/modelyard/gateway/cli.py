"""`modelyard keys create|list|revoke`: manage API keys (the key is printed once, at creation).

The store is the one of the config's `gateway.keys` section (`--config FILE`), or the SQLite
file given with `--db` (which wins).
"""

from __future__ import annotations

import argparse
import json
import sys

from modelyard.gateway.config import GatewayConfig
from modelyard.gateway.gateway import open_key_store
from modelyard.gateway.keys import KeyStore, new_record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="server YAML config (its gateway: section)")
    parser.add_argument("--db", help="SQLite key file (overrides the config)")
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a key and print it once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--models", help="comma-separated allowed models (default: tenant's)")
    create.add_argument("--rpm", type=int, help="requests per minute")
    create.add_argument("--tpm", type=int, help="tokens per minute (generation)")
    create.add_argument("--ipm", type=int, help="inputs per minute (/predict, embeddings, v2)")
    create.add_argument("--max-concurrent", type=int, help="concurrent requests")
    create.add_argument("--priority", type=int, help="scheduler priority class")
    create.add_argument(
        "--admin",
        action="store_true",
        help="admin scope: repository load/unload, /admin/*, /metrics (besides inference)",
    )
    create.add_argument("--json", action="store_true", help="print {key_id, key} as JSON")
    actions.add_parser("list", help="list keys (ids and settings, never the keys)")
    revoke = actions.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("key_id")


def _store(args: argparse.Namespace) -> KeyStore:
    from modelyard.config import load_config

    gateway = load_config(args.config).gateway if args.config else GatewayConfig()
    return open_key_store(gateway, sqlite_path=args.db)


def _create(store: KeyStore, args: argparse.Namespace) -> int:
    for name in ("rpm", "tpm", "ipm", "max_concurrent"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    models = tuple(m.strip() for m in args.models.split(",") if m.strip()) if args.models else None
    key, record = new_record(
        args.tenant,
        models=models,
        rpm=args.rpm,
        tpm=args.tpm,
        ipm=args.ipm,
        max_concurrent=args.max_concurrent,
        priority=args.priority,
        admin=args.admin,
    )
    store.add(record)
    if args.json:
        print(json.dumps({"key_id": record.key_id, "tenant": record.tenant, "key": key}))
    else:
        print(f"key id: {record.key_id}  tenant: {record.tenant}")
        print(f"key:    {key}")
        print("Store it now: it is not shown again.", file=sys.stderr)
    return 0


def _list(store: KeyStore) -> int:
    for r in store.list():
        state = "active" if r.active else "revoked"
        models = ",".join(r.models) if r.models is not None else "*"
        limits = (
            f"rpm={r.rpm} tpm={r.tpm} ipm={r.ipm} concurrent={r.max_concurrent} "
            f"priority={r.priority}"
        )
        admin = " admin" if r.admin else ""
        print(f"{r.key_id}\t{r.tenant}\t{state}\tmodels={models}\t{limits}{admin}")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        store = _store(args)
        if args.action == "create":
            return _create(store, args)
        if args.action == "list":
            return _list(store)
        if store.revoke(args.key_id):
            print(f"revoked {args.key_id}")
            return 0
        print(f"no active key {args.key_id}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

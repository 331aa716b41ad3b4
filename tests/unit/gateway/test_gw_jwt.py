"""JWT verification against a JWKS file generated in the test."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from gw_helpers import AUDIENCE, ISSUER, RsaSigner, write_jwks

from modelyard.gateway.config import JwtConfig
from modelyard.gateway.jwt_auth import JwksCache, JwksUnavailable, JwtError, JwtVerifier

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def signers() -> tuple[RsaSigner, RsaSigner]:
    return RsaSigner("k1"), RsaSigner("k2")


def _verifier(path: Path, **overrides: object) -> JwtVerifier:
    settings: dict[str, object] = {
        "jwks_file": str(path),
        "audience": AUDIENCE,
        "issuer": ISSUER,
        "leeway_s": 5.0,
        "refresh_min_interval_s": 0.0,
    }
    settings.update(overrides)
    return JwtVerifier(JwtConfig(**settings))  # type: ignore[arg-type]


async def test_valid_token_yields_claims_and_tenant(tmp_path, signers) -> None:
    verifier = _verifier(write_jwks(tmp_path / "jwks.json", signers[0]))
    claims = await verifier.verify(signers[0].token("acme"))
    assert verifier.tenant_of(claims) == "acme"


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({"exp": -60}, "expired"),  # times relative to the test's run, not to collection
        ({"nbf": +60}, "not yet valid"),
        ({"aud": "someone-else"}, "audience"),
        ({"iss": "https://evil"}, "issuer"),
        ({"exp": None}, "invalid"),
    ],
)
async def test_rejected_claims(tmp_path, signers, claims, message) -> None:
    verifier = _verifier(write_jwks(tmp_path / "jwks.json", signers[0]))
    now = int(time.time())
    claims = {k: now + v if k in ("exp", "nbf") and v is not None else v for k, v in claims.items()}
    with pytest.raises(JwtError, match=message):
        await verifier.verify(signers[0].token(**claims))


async def test_leeway_accepts_just_expired(tmp_path, signers) -> None:
    verifier = _verifier(write_jwks(tmp_path / "jwks.json", signers[0]), leeway_s=30.0)
    await verifier.verify(signers[0].token(exp=int(time.time()) - 5))


async def test_wrong_signature(tmp_path, signers) -> None:
    # signed by k2's private key but claiming k1's kid
    verifier = _verifier(write_jwks(tmp_path / "jwks.json", signers[0]))
    with pytest.raises(JwtError, match="invalid token"):
        await verifier.verify(signers[1].token(kid="k1"))
    tampered = signers[0].token()
    head, payload, sig = tampered.split(".")
    with pytest.raises(JwtError):
        await verifier.verify(f"{head}.{payload}.{sig[:-4]}AAAA")


async def test_unknown_kid_refreshes_once_then_rejects(tmp_path, signers) -> None:
    path = write_jwks(tmp_path / "jwks.json", signers[0])
    verifier = _verifier(path, refresh_min_interval_s=3600.0)
    await verifier.verify(signers[0].token())
    assert verifier.jwks.refreshes == 1
    for _ in range(3):  # unknown kid: rate-limited refresh, no refetch storm
        with pytest.raises(JwtError, match="unknown key id"):
            await verifier.verify(signers[1].token())
    assert verifier.jwks.refreshes == 1


async def test_unknown_kid_triggers_refresh_for_rotated_key(tmp_path, signers) -> None:
    path = write_jwks(tmp_path / "jwks.json", signers[0])
    clock = [0.0]
    config = JwtConfig(
        jwks_file=str(path), audience=AUDIENCE, issuer=ISSUER, refresh_min_interval_s=10
    )
    verifier = JwtVerifier(config, JwksCache(config, clock=lambda: clock[0]))
    await verifier.verify(signers[0].token())
    write_jwks(path, signers[0], signers[1])  # the IdP rotates in k2
    with pytest.raises(JwtError, match="unknown key id"):
        await verifier.verify(signers[1].token())  # within the refresh interval
    clock[0] = 11.0
    claims = await verifier.verify(signers[1].token())
    assert claims["tenant"] == "acme"
    assert verifier.jwks.refreshes == 2


async def test_algorithm_not_in_allow_list(tmp_path, signers) -> None:
    verifier = _verifier(write_jwks(tmp_path / "jwks.json", signers[0]), algorithms=("ES256",))
    with pytest.raises(JwtError, match="algorithm"):
        await verifier.verify(signers[0].token())


async def test_jwks_outage_keeps_cached_keys_and_reports_unavailable(tmp_path, signers) -> None:
    path = write_jwks(tmp_path / "jwks.json", signers[0])
    clock = [0.0]
    config = JwtConfig(jwks_file=str(path), audience=AUDIENCE, issuer=ISSUER, cache_ttl_s=60)
    verifier = JwtVerifier(config, JwksCache(config, clock=lambda: clock[0]))
    await verifier.verify(signers[0].token())
    path.unlink()  # the IdP goes away
    clock[0] = 120.0  # the cache is stale: the refresh fails, the cached key still verifies
    await verifier.verify(signers[0].token())
    clock[0] = 240.0
    with pytest.raises(JwksUnavailable):
        await verifier.verify(signers[1].token())  # a kid we never had: cannot verify


async def test_es256_token(tmp_path) -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(private.public_key()))
    jwk.update(kid="ec1", alg="ES256")
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk]}))
    verifier = _verifier(path)
    now = int(time.time())
    claims = {"tenant": "beta", "aud": AUDIENCE, "iss": ISSUER, "exp": now + 60}
    token = jwt.encode(claims, private, algorithm="ES256", headers={"kid": "ec1"})
    assert verifier.tenant_of(await verifier.verify(token)) == "beta"
    forged = jwt.encode(
        claims, ec.generate_private_key(ec.SECP256R1()), algorithm="ES256", headers={"kid": "ec1"}
    )
    with pytest.raises(JwtError):
        await verifier.verify(forged)

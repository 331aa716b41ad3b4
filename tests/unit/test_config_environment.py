"""`MODELYARD_REDIS_URL` replaces `gateway.redis_url` of the config file (a URL with a password
stays out of the file: deploy/k8s builds it from a Secret); nothing else is read from there."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.config import load_config

pytestmark = pytest.mark.unit

FILE = """gateway:
  auth: "on"
  redis_url: redis://modelyard-redis:6379/0
  keys: {backend: redis}
  rate_limit: {store: redis}
"""


def test_the_environment_gives_the_redis_url(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(FILE)
    url = "redis://:s3cret@modelyard-redis:6379/0"
    assert load_config(path, {"MODELYARD_REDIS_URL": url}).gateway.redis_url == url
    assert load_config(path, {}).gateway.redis_url == "redis://modelyard-redis:6379/0"
    assert load_config(None, {"MODELYARD_REDIS_URL": url}).gateway.redis_url == url
    assert load_config(None, {}).gateway.redis_url is None


def test_an_empty_variable_changes_nothing_and_the_file_is_still_checked(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(FILE)
    assert load_config(path, {"MODELYARD_REDIS_URL": ""}).gateway.redis_url.endswith("6379/0")
    path.write_text(FILE.replace("  redis_url: redis://modelyard-redis:6379/0\n", ""))
    with pytest.raises(ValueError, match="redis_url is required"):
        load_config(path, {})
    assert load_config(path, {"MODELYARD_REDIS_URL": "redis://r:6379/0"}).gateway.redis_url

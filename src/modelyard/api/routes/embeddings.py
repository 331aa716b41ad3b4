"""Placeholder router (the manager part fills it in)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()

"""Typed settings shared by every mode (pydantic, keyword-only, validated with clear messages),
and where tandem keeps its files (`tandem_home`)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class SamplingConfig(BaseModel):
    """How next tokens are drawn. temperature 0 = greedy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(0.7, ge=0.0, le=10.0)
    top_k: int | None = Field(None, ge=1)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int = 0
    max_new_tokens: int = Field(64, ge=1, le=1_000_000)
    stop_at_eos: bool = True


def tandem_home() -> Path:
    """Cache root (models, indexes, document KV, profiles, calibrations): $TANDEM_HOME or
    ~/.cache/tandem."""
    return Path(os.environ.get("TANDEM_HOME") or Path.home() / ".cache" / "tandem")

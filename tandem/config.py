"""Typed settings shared by every mode (pydantic, keyword-only, validated with clear messages)."""

from __future__ import annotations

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

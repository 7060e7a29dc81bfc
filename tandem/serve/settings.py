"""The config file of `tandem device serve` and `tandem cloud serve` (TOML or YAML).

Words used here:
- *section*: `device` or `cloud`; each holds exactly the flags of its `serve` command, under
  the flag's name with dashes as underscores (`--max-context` -> `max_context`).
- *key path*: where a bad value sits, dotted (`cloud.max_sessions`); every error names the
  file and the key path on one line, e.g. `tandem.toml: cloud.max_sesions: unknown key`.

The shared secret is never stored in a file: it comes from `$TANDEM_SECRET` only; nor is the
device API's key (`--api-key` or `$TANDEM_API_KEY`).

    [device]                      # tandem.toml
    cloud = "127.0.0.1:7700"
    mode = "spec"
    model = "qwen2.5-coder-0.5b"

    [cloud]
    mode = ["spec", "ar"]
    model = "qwen2.5-coder-1.5b"
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tandem.errors import TandemError

DeviceMode = Literal["local", "spec", "ar", "dragon", "rapid", "private-spec"]
CloudMode = Literal["spec", "ar", "dragon", "private-spec", "rapid"]  # = serve.cloud.MODES (tested)
SERVE_MODES, CLOUD_MODES = get_args(DeviceMode), get_args(CloudMode)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DeviceServeSettings(_Section):
    """Every flag of `tandem device serve`."""

    cloud: str = "127.0.0.1:7700"  # HOST:PORT of `tandem cloud serve` (unused in local mode)
    mode: DeviceMode = "spec"
    model: str = "qwen2.5-coder-0.5b"  # the device model
    backend: Literal["llamacpp", "hf"] | None = (
        None  # model engine (None: tandem --backend / default)
    )
    served_model_name: str | None = None  # the name clients use (default: `model`)
    listen: str = "127.0.0.1:8000"  # HOST:PORT of the HTTP API
    corpus: str | None = None  # dragon, private-spec: the device's private corpus
    strategy: str = "dragon"  # dragon: aggregator strategy
    docs: int = Field(2, ge=1)  # dragon, private-spec: documents per side
    # spec: None = adaptive (eager + the adaptive controller, which plans cloud AR or eager,
    # the draft length and branches), or async under a codec eager cannot carry (separate, c-sqs)
    pipeline: Literal["sync", "async", "eager", "adaptive"] | None = None
    codec: str | None = None  # spec, private-spec: uplink codec (None: k-sqs K=3, ell=100)
    eta: float | None = Field(None, ge=0.0)  # private-spec: knowledge transfer (None: 4)
    codec_params: dict[str, int | float] = Field(default_factory=dict)  # k=8 stays an int
    # The spec knobs: SpecConfig's defaults, written out (tested equal) so that reading a config
    # file does not import the protocols (and torch).
    draft_len: int = Field(4, ge=1)
    bit_budget: int | None = Field(None, ge=1)
    downlink_k: int = Field(10, ge=1)
    fast_verify: bool = True
    truncate_factor: float = Field(2.0, ge=0.0)
    verify_calls: Literal["block", "token"] = "block"  # "token": the cloud verifies AR-shaped
    branch_below: float = Field(0.0, ge=0.0, le=1.0)  # eager: branch where the draft is unsure
    branch_len: int = Field(4, ge=1)  # eager: drafts per branch
    max_context: int = Field(4096, ge=16)  # prompt + completion tokens, at most
    max_tokens: int = Field(1024, ge=1)  # the largest `max_tokens` a request may ask for
    default_max_tokens: int = Field(256, ge=1)  # when a request gives none
    connect_timeout: float = Field(3.0, gt=0.0)  # seconds to reach the cloud
    delay: float = Field(0.0, ge=0.0)  # emulated one-way delay (ms), device -> cloud
    threads: int = Field(1, ge=1)
    log_format: Literal["text", "json"] = "text"


class CloudServeSettings(_Section):
    """Every flag of `tandem cloud serve` (the secret excepted)."""

    mode: list[CloudMode] = Field(default_factory=lambda: ["spec", "ar"])
    corpus: str | None = None
    long_context: str | None = None  # rapid: the text file the target reads in full
    docs: int = Field(2, ge=1)
    model: str = "qwen2.5-coder-1.5b"
    backend: Literal["llamacpp", "hf"] | None = (
        None  # model engine (None: tandem --backend / default)
    )
    host: str = "127.0.0.1"
    port: int = Field(7700, ge=0, le=65535)
    delay: float = Field(0.0, ge=0.0)
    threads: int = Field(1, ge=1)
    max_sessions: int = Field(64, ge=1)
    max_context: int = Field(32768, ge=16)
    max_queued_tokens: int = Field(4096, ge=1)
    batch_window_ms: float = Field(2.0, ge=0.0)
    metrics_port: int | None = Field(None, ge=0, le=65535)
    log_format: Literal["text", "json"] = "text"


class TandemSettings(_Section):
    device: DeviceServeSettings = Field(default_factory=DeviceServeSettings)
    cloud: CloudServeSettings = Field(default_factory=CloudServeSettings)


_MESSAGES = {
    "extra_forbidden": "unknown key",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a table of key = value",
    "model_type": "must be a table of key = value",
    "model_attributes_type": "must be a table of key = value",
}


def describe_error(exc: ValidationError) -> str:
    """`key.path: problem` for the first error pydantic found."""
    error = exc.errors()[0]
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    path = path or "(top level)"
    message = _MESSAGES.get(error["type"])
    if message is None:
        message = error["msg"][0].lower() + error["msg"][1:]
        message = message.replace("input should be", "must be")
    return f"{path}: {message}"


def _parse(path: Path) -> object:
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    if suffix == ".toml":
        import tomllib

        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise TandemError(f"{path}: bad TOML: {exc}") from None
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise TandemError(f"{path}: bad YAML: {' '.join(str(exc).split())}") from None
        return {} if data is None else data
    raise TandemError(f"{path}: unknown config format; use .toml, .yaml or .yml")


_NOT_IN_FILES = (  # (section, key, the variable to set instead)
    ("device", "secret", "TANDEM_SECRET"),
    ("cloud", "secret", "TANDEM_SECRET"),
    ("device", "api_key", "TANDEM_API_KEY"),
)


def load_settings(path: str | Path) -> TandemSettings:
    """Read and validate a config file; one-line TandemErrors name the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise TandemError(f"{path}: config file not found")
    data = _parse(path)
    if not isinstance(data, dict):
        raise TandemError(f"{path}: the file must hold a table with [device] and/or [cloud]")
    for section, key, env in _NOT_IN_FILES:
        if isinstance(data.get(section), dict) and key in data[section]:
            raise TandemError(f"{path}: {section}.{key}: not allowed in a file; set ${env} instead")
    try:
        return TandemSettings.model_validate(data)
    except ValidationError as exc:
        raise TandemError(f"{path}: {describe_error(exc)}") from None


def merge_flags(base: BaseModel, flags: dict[str, object]) -> BaseModel:
    """`base` with the flags given explicitly on the command line put over it (validated)."""
    data = base.model_dump()
    data.update(flags)
    try:
        return type(base).model_validate(data)
    except ValidationError as exc:
        raise TandemError(describe_error(exc)) from None


def device_settings(config: str | Path | None, flags: dict[str, object]) -> DeviceServeSettings:
    """`tandem device serve`'s settings: the file's `[device]` (if any), then the flags given
    on the command line (None = not given)."""
    base = load_settings(config).device if config else DeviceServeSettings()
    given = {k: v for k, v in flags.items() if v is not None and v != [] and v != {}}
    return merge_flags(base, given)

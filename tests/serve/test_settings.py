"""The config file of `tandem device serve` / `tandem cloud serve`: TOML and YAML load; every
mistake is one line naming the file and the key path; flags override file values;
`tandem config show` prints the effective settings."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from tandem.cli.config import app as config_app
from tandem.errors import TandemError
from tandem.serve.settings import (
    CloudServeSettings,
    DeviceServeSettings,
    TandemSettings,
    device_settings,
    load_settings,
)

TOML = """
[device]
cloud = "10.0.0.2:7700"
mode = "dragon"
corpus = "notes/"
max_context = 2048
codec_params = {k = 8}

[cloud]
mode = ["spec", "dragon"]
port = 7701
max_sessions = 8
batch_window_ms = 1.5
metrics_port = 9100
log_format = "json"
"""

YAML = """
device:
  mode: local
  model: tiny-qwen2
cloud:
  max_context: 8192
  threads: 2
"""


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_toml_loads(tmp_path):
    settings = load_settings(write(tmp_path, "tandem.toml", TOML))
    assert settings.device.mode == "dragon" and settings.device.max_context == 2048
    assert settings.device.codec_params == {"k": 8}
    assert settings.device.model == DeviceServeSettings().model  # defaults fill the rest
    cloud = settings.cloud
    assert (cloud.mode, cloud.port, cloud.max_sessions) == (["spec", "dragon"], 7701, 8)
    assert (cloud.batch_window_ms, cloud.metrics_port, cloud.log_format) == (1.5, 9100, "json")
    assert cloud.max_queued_tokens == 4096  # not in the file: the default


def test_yaml_loads_and_sections_are_optional(tmp_path):
    settings = load_settings(write(tmp_path, "tandem.yaml", YAML))
    assert settings.device.mode == "local" and settings.cloud.max_context == 8192
    assert load_settings(write(tmp_path, "empty.yml", "")) == TandemSettings()
    only_cloud = load_settings(write(tmp_path, "c.toml", "[cloud]\nthreads = 3\n"))
    assert only_cloud.device == DeviceServeSettings() and only_cloud.cloud.threads == 3


@pytest.mark.parametrize(
    "name,text,message",
    [
        (
            "tandem.toml",
            "[cloud]\nmax_sesions = 3\n",
            "tandem.toml: cloud.max_sesions: unknown key",
        ),
        ("tandem.toml", '[device]\ndocs = "two"\n', "tandem.toml: device.docs: must be an integer"),
        ("t.yaml", "device:\n  draft_len: 1.5\n", "t.yaml: device.draft_len: must be an integer"),
        ("t.yaml", "cloud:\n  port: 70000\n", "t.yaml: cloud.port: must be less than"),
        ("t.toml", '[device]\nmode = "turbo"\n', "t.toml: device.mode: must be 'local'"),
        ("t.toml", '[cloud]\nmode = ["spec", "x"]\n', "t.toml: cloud.mode[1]: must be 'spec'"),
        ("t.toml", "[clod]\nport = 1\n", "t.toml: clod: unknown key"),
        ("t.toml", "device = 3\n", "t.toml: device: must be a table"),
        ("t.toml", '[cloud]\nsecret = "s"\n', "t.toml: cloud.secret: not allowed in a file"),
        ("t.toml", "[cloud\nport = 1\n", "t.toml: bad TOML: "),
        ("t.yaml", "device:\n  mode: [local\n", "t.yaml: bad YAML: "),
        ("t.yaml", "- 1\n- 2\n", "t.yaml: the file must hold a table"),
        ("t.json", "{}", "t.json: unknown config format"),
    ],
)
def test_mistakes_are_one_line_naming_file_and_key(tmp_path, name, text, message):
    with pytest.raises(TandemError) as info:
        load_settings(write(tmp_path, name, text))
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(str(tmp_path / name).replace(name, "") + message)


def test_missing_file(tmp_path):
    with pytest.raises(TandemError, match="config file not found"):
        load_settings(tmp_path / "nope.toml")


def test_flags_override_file_values(tmp_path):
    path = write(tmp_path, "tandem.toml", TOML)
    settings = device_settings(path, {"max_context": 1024, "listen": None, "codec_params": {}})
    assert settings.max_context == 1024  # the flag
    assert settings.mode == "dragon" and settings.codec_params == {"k": 8}  # the file
    assert settings.listen == "127.0.0.1:8000"  # neither: the default
    assert device_settings(None, {"mode": "local"}).mode == "local"
    with pytest.raises(TandemError, match="docs: must be greater than or equal to 1"):
        device_settings(path, {"docs": 0})


def test_cloud_settings_names_are_stable():
    fields = set(CloudServeSettings.model_fields)
    assert {"mode", "corpus", "docs", "model", "backend", "host", "port", "delay", "threads",
            "max_sessions", "max_context", "max_queued_tokens", "batch_window_ms",
            "metrics_port", "log_format", "long_context"} == fields  # fmt: skip


def tandem_config(*args: str):
    """`tandem config ...`, registered the way tandem.cli registers its groups."""
    root = typer.Typer()
    root.add_typer(config_app, name="config")
    return CliRunner().invoke(root, ["config", *args])


def test_config_show(tmp_path):
    out = tandem_config("show", "--config", str(write(tmp_path, "t.toml", TOML)))
    assert out.exit_code == 0, out.output
    assert "[device]" in out.output and 'mode = "dragon"' in out.output
    assert "max_sessions = 8" in out.output and "# bit_budget = (unset)" in out.output
    shown = write(tmp_path, "shown.toml", out.output)
    assert load_settings(shown) == load_settings(tmp_path / "t.toml")  # the output loads back
    out = tandem_config("show", "--json")
    assert out.exit_code == 0
    assert json.loads(out.output) == TandemSettings().model_dump(mode="json")
    out = tandem_config("show", "--config", str(tmp_path / "missing.toml"))
    assert out.exit_code != 0 and isinstance(out.exception, TandemError)


def test_modes_and_spec_defaults_come_from_the_protocols():
    """The config file cannot drift from what the servers and protocols accept."""
    from tandem.protocols.spec.config import SpecConfig
    from tandem.serve.cloud import MODES
    from tandem.serve.settings import CLOUD_MODES, DeviceServeSettings

    assert set(CLOUD_MODES) == set(MODES)
    device, spec = DeviceServeSettings(), SpecConfig()
    for knob in (
        "draft_len",
        "bit_budget",
        "downlink_k",
        "fast_verify",
        "truncate_factor",
        "verify_calls",
        "branch_below",
        "branch_len",
    ):
        assert getattr(device, knob) == getattr(spec, knob), knob

"""Optional TLS for tandem sessions: configuration, ssl contexts, a self-signed test cert.

TLS encrypts and authenticates the TCP stream; it is independent of (and under) the HMAC
handshake, which still runs inside it. `require_client_cert` turns on mutual TLS: the
server only accepts clients whose certificate is signed by `cafile`. Certificates for
tests come from `make_self_signed`, which calls the `openssl` command-line tool (the
`cryptography` package is not a dependency).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tandem.errors import TandemError


@dataclass(frozen=True, kw_only=True)
class TlsConfig:
    """TLS settings of one side."""

    certfile: Path | None = None  # our certificate chain (PEM); required on the server
    keyfile: Path | None = None  # its private key (PEM)
    cafile: Path | None = None  # certificates we trust for the peer (PEM)
    require_client_cert: bool = False  # server: mutual TLS
    server_hostname: str | None = None  # client: name to verify (default: the host dialled)


def server_context(tls: TlsConfig) -> ssl.SSLContext:
    """The server's ssl context (TLS 1.2+, client certificates checked if required)."""
    if tls.certfile is None:
        raise TandemError("TLS server needs a certificate (TlsConfig.certfile)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.certfile, tls.keyfile)
    if tls.require_client_cert:
        if tls.cafile is None:
            raise TandemError("require_client_cert needs TlsConfig.cafile (the client CA)")
        context.load_verify_locations(cafile=tls.cafile)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(tls: TlsConfig) -> ssl.SSLContext:
    """The client's ssl context: verifies the server against `cafile` (or the system CAs)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.certfile is not None:
        context.load_cert_chain(tls.certfile, tls.keyfile)
    return context


def make_self_signed(
    directory: Path, *, name: str = "localhost", days: int = 2
) -> tuple[Path, Path]:
    """Write `<name>.crt` and `<name>.key` (EC P-256, valid for localhost and 127.0.0.1)
    into `directory` with the openssl CLI; returns (certfile, keyfile)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise TandemError("the openssl command is needed to make a self-signed certificate")
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    command = [
        openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-days", str(days), "-subj", f"/CN={name}",
        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        "-keyout", str(key), "-out", str(cert),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise TandemError(f"openssl could not make a certificate: {result.stderr.strip()}")
    return cert, key

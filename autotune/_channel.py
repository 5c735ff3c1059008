"""The study server's address and its gRPC channels, with their secret and TLS.

Every client of an ``autotune server`` (the study store's calls and the control channel, in
``start study``, ``worker`` and ``status``) opens its channel here, and the server takes its
credentials and its guard from here, so both ends agree on one rule:

* **The shared secret** comes from the environment, never from a flag (a flag shows in
  ``ps``): ``AUTOTUNE_SERVER_TOKEN`` holds it, or ``AUTOTUNE_SERVER_TOKEN_FILE`` names a file
  whose first line holds it. A server given one refuses every call, storage and control alike,
  that does not carry it (gRPC ``UNAUTHENTICATED``); clients send it on every call.
* **TLS** when the server is given a certificate and key (``--tls-cert``, ``--tls-key``, PEM
  files); clients then trust the CA in ``AUTOTUNE_SERVER_CA`` (a PEM file; without it, the
  system's roots).
* **Without a secret** the server binds loopback only, and refuses any other address unless
  told it is insecure on purpose (``--insecure``).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["LOOPBACK", "SCHEME", "Address", "ServerSecurity", "client_token", "is_server_url",
           "open_channel", "parse_address", "read_token_file", "refused"]

SCHEME = "autotune://"
# gRPC metadata a study server honours: the trial states the caller wants. The reply holds the
# trials that finished, those new to the client and those in these states; not every running
# trial again (store.py sends it, server.py reads it).
STATES_KEY = "autotune-states"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKEN_ENV = "AUTOTUNE_SERVER_TOKEN"
TOKEN_FILE_ENV = "AUTOTUNE_SERVER_TOKEN_FILE"
CA_ENV = "AUTOTUNE_SERVER_CA"
_HEADER = "authorization"
_MIN_TOKEN = 16
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1),
                   ("grpc.initial_reconnect_backoff_ms", 200),
                   ("grpc.min_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 2000)]


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def is_server_url(url: str) -> bool:
    """Whether ``url`` names a study server (``autotune://HOST:PORT``), not a database."""
    return url.startswith(SCHEME)


def check_port(port: int, where: str) -> int:
    if not 1 <= port <= 65535:
        raise ConfigError(f"{where} {port} is not a port; use 1 to 65535")
    return port


def parse_address(text: str, where: str = "study server address") -> Address:
    """``HOST:PORT`` (or ``autotune://HOST:PORT``) as an address; a one-line error otherwise."""
    bare = text.removeprefix(SCHEME).rstrip("/")
    host, _, port = bare.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit():
        raise ConfigError(f"{where} {text!r} must be HOST:PORT (autotune://HOST:PORT), for "
                          "example 127.0.0.1:13000")
    return Address(host, check_port(int(port), where))


def read_token_file(path: str | os.PathLike[str], where: str) -> str:
    """The secret in ``path``'s first line; a one-line error for a missing, unreadable, empty
    or too short one."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where} {str(path)!r} cannot be read ({e.__class__.__name__}); "
                          "name a file whose first line is the study server's secret") from None
    return _checked(text.splitlines()[0] if text.strip() else "", where)


def _checked(token: str, where: str) -> str:
    token = token.strip()
    if len(token) < _MIN_TOKEN:
        raise ConfigError(f"{where} holds a secret of {len(token)} characters; use at least "
                          f"{_MIN_TOKEN} (for example: python -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))')")
    return token


def client_token() -> str | None:
    """The secret this process sends to study servers (None: it has none)."""
    if os.environ.get(TOKEN_ENV):
        return _checked(os.environ[TOKEN_ENV], TOKEN_ENV)
    if os.environ.get(TOKEN_FILE_ENV):
        return read_token_file(os.environ[TOKEN_FILE_ENV], TOKEN_FILE_ENV)
    return None


def _read_pem(path: str | os.PathLike[str], where: str) -> bytes:
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as e:
        raise ConfigError(f"{where} {str(path)!r} cannot be read ({e.__class__.__name__}); "
                          "name a PEM file") from None
    if b"-----BEGIN" not in data:
        raise ConfigError(f"{where} {str(path)!r} is not a PEM file")
    return data


def _token_interceptor(token: str) -> Any:
    """A client interceptor that sends the secret with every call."""
    import grpc

    class _Details(grpc.ClientCallDetails):  # type: ignore[misc]
        pass

    class _WithToken(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any,
                                  request: Any) -> Any:
            new = _Details()
            new.method, new.timeout = details.method, details.timeout
            new.credentials = details.credentials
            new.wait_for_ready = getattr(details, "wait_for_ready", None)
            new.compression = getattr(details, "compression", None)
            new.metadata = [*(details.metadata or ()), (_HEADER, f"Bearer {token}")]
            return continuation(new, request)

    return _WithToken()


def open_channel(address: Address) -> Any:
    """A gRPC channel to the study server at ``address``: TLS when ``AUTOTUNE_SERVER_CA`` is
    set, the secret on every call when this process has one."""
    import grpc

    target = str(address)
    ca = os.environ.get(CA_ENV)
    if ca:
        creds = grpc.ssl_channel_credentials(root_certificates=_read_pem(ca, CA_ENV))
        channel = grpc.secure_channel(target, creds, options=CHANNEL_OPTIONS)
    else:
        channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    token = client_token()
    if token is None:
        return channel
    return grpc.intercept_channel(channel, _token_interceptor(token))


def refused(error: BaseException) -> str | None:
    """What to tell the user when a study server refused this client (None: it did not)."""
    code = getattr(error, "code", None)
    if not callable(code) or not type(error).__module__.startswith("grpc"):
        return None
    name = getattr(code(), "name", "")
    if name == "UNAUTHENTICATED":
        return ("it refused this client's secret; set AUTOTUNE_SERVER_TOKEN (or "
                "AUTOTUNE_SERVER_TOKEN_FILE, a file holding it) to the secret the server was "
                "started with")
    return None


def _check_free(address: Address) -> None:
    """A one-line error unless ``address`` can be bound now (before gRPC tries, whose own
    failure is a log line on stderr and a bare RuntimeError)."""
    import socket

    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    except OSError:
        raise ConfigError(f"--host {address.host} is not an address of this machine") from None
    family, kind, proto, _, where = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(where)
        except OSError as e:
            raise ConfigError(f"cannot listen on {address}: {e.strerror or e}; pick another "
                              "--port, or stop what listens there") from None


@dataclass(frozen=True)
class ServerSecurity:
    """How a study server guards its port: its secret (None: none) and TLS key pair."""

    token: str | None = None
    cert: bytes | None = None
    key: bytes | None = None
    insecure: bool = False        # bind beyond loopback without a secret, on purpose

    @classmethod
    def from_options(cls, host: str, token_file: str | None, tls_cert: str | None,
                     tls_key: str | None, insecure: bool) -> ServerSecurity:
        """The server's security from its flags and environment; a one-line error for a
        combination that would leave it open or cannot work."""
        if token_file:
            token: str | None = read_token_file(token_file, "--token-file")
        else:
            token = client_token()
        if bool(tls_cert) != bool(tls_key):
            raise ConfigError("--tls-cert and --tls-key go together: give both PEM files, or "
                              "neither")
        cert = _read_pem(tls_cert, "--tls-cert") if tls_cert else None
        key = _read_pem(tls_key, "--tls-key") if tls_key else None
        if token is None and host not in LOOPBACK and not insecure:
            raise ConfigError(
                f"--host {host} would let anyone who reaches it run trials and read every "
                "study: give the server a secret (AUTOTUNE_SERVER_TOKEN, "
                "AUTOTUNE_SERVER_TOKEN_FILE or --token-file), bind 127.0.0.1, or pass "
                "--insecure to expose it without one on purpose")
        return cls(token, cert, key, insecure)

    def add_port(self, server: Any, address: Address) -> int:
        """Binds ``server`` to ``address`` (TLS when a key pair is given); the port bound, or
        a one-line error when it cannot be bound."""
        import grpc

        target = str(address)
        _check_free(address)
        try:
            if self.cert is not None and self.key is not None:
                creds = grpc.ssl_server_credentials([(self.key, self.cert)])
                bound = server.add_secure_port(target, creds)
            else:
                bound = server.add_insecure_port(target)
        except RuntimeError:
            bound = 0
        if bound != address.port:
            raise ConfigError(f"cannot listen on {target}: the port is in use or the address "
                              "is not this machine's; pick another --port or --host")
        return int(bound)

    def interceptors(self) -> list[Any]:
        """The server interceptors that refuse calls without the secret (none without one)."""
        if self.token is None:
            return []
        import grpc

        expected = f"Bearer {self.token}".encode()

        def deny(request: Any, context: Any) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "this study server needs its secret (AUTOTUNE_SERVER_TOKEN)")

        denied = grpc.unary_unary_rpc_method_handler(deny)

        class _Guard(grpc.ServerInterceptor):  # type: ignore[misc]
            def intercept_service(self, continuation: Callable[..., Any],
                                  details: Any) -> Any:
                sent = next((value for key, value in details.invocation_metadata or ()
                             if key == _HEADER), "")
                if isinstance(sent, str):
                    sent = sent.encode()
                if hmac.compare_digest(sent, expected):
                    return continuation(details)
                return denied

        return [_Guard()]

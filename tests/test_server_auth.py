"""The study server's guard, on a real `autotune server` over PostgreSQL: with a secret, every
storage and control call without it (or with another) is refused, and the clients that carry
it (a study, a worker's registry, `autotune status`) work, over TLS too; without a secret it
binds loopback only; a bad port or a port in use is one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from autotune.control import ControlClient
from autotune.errors import ConfigError
from autotune.store import open_storage

from ._services import Background, autotune, free_port, wait_for_port
from .conftest import run_cli

pytestmark = pytest.mark.postgres

SECRET = "s3cret-token-for-the-test-0123456789"


def _storage_calls() -> list[tuple[str, object]]:
    """Every call of Optuna's storage service, each with an empty request."""
    from optuna.storages._grpc.auto_generated import api_pb2

    service = api_pb2.DESCRIPTOR.services_by_name["StorageService"]
    return [(f"/{service.full_name}/{m.name}", getattr(api_pb2, m.input_type.name)())
            for m in service.methods]


def _start_server(url: str, tmp_path: Path, *extra: str, env: dict[str, str] | None = None
                  ) -> tuple[Background, int]:
    port = free_port()
    root = str(Path(__file__).resolve().parent.parent)
    server = Background([sys.executable, "-m", "autotune", "server", "--storage", url,
                         "--port", str(port), *extra], cwd=tmp_path,
                        env={**os.environ, "PYTHONPATH": root, **(env or {})})
    try:
        wait_for_port(port)
    except AssertionError:
        server.kill()
        _, err = server.communicate(timeout=20)
        raise AssertionError(err[-2000:]) from None
    return server, port


def _stop(server: Background) -> str:
    server.terminate()
    _, err = server.communicate(timeout=30)
    return err


def test_without_the_secret_every_call_is_refused_and_with_it_everything_works(
        postgres, tmp_path, monkeypatch):
    url = postgres.database()
    token_file = tmp_path / "token"
    token_file.write_text(SECRET + "\n")
    server, port = _start_server(url, tmp_path, "--token-file", str(token_file))
    try:
        # A plain gRPC client: every storage call and every control call is refused.
        calls = [*_storage_calls(), *((("/autotune.Control/Call"), None),)]
        for token in (None, "wrong-token-of-the-same-length-000000"):
            metadata = None if token is None else [("authorization", f"Bearer {token}")]
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                for method, request in calls:
                    call = channel.unary_unary(
                        method, request_serializer=None if request is None
                        else type(request).SerializeToString)
                    payload = (b'{"method": "workers", "args": {"study": "x"}}'
                               if request is None else request)
                    with pytest.raises(grpc.RpcError) as refused:
                        call(payload, timeout=10, metadata=metadata)
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
        # autotune's own clients without the secret: one line that says what to set.
        monkeypatch.delenv("AUTOTUNE_SERVER_TOKEN", raising=False)
        monkeypatch.delenv("AUTOTUNE_SERVER_TOKEN_FILE", raising=False)
        with pytest.raises(ConfigError, match="AUTOTUNE_SERVER_TOKEN"):
            open_storage(f"autotune://127.0.0.1:{port}")
        shown = run_cli("status", "x", "--storage", f"autotune://127.0.0.1:{port}",
                        cwd=tmp_path)
        assert shown.returncode == 2
        assert len(shown.stderr.strip().splitlines()) == 1, shown.stderr
        assert "refused this client's secret" in shown.stderr and "Traceback" not in shown.stderr
        # With it (from the environment, or a file it names), the store and registry work.
        monkeypatch.setenv("AUTOTUNE_SERVER_TOKEN_FILE", str(token_file))
        storage = open_storage(f"autotune://127.0.0.1:{port}")
        import optuna

        study = optuna.create_study(study_name="guarded", storage=storage)
        study.enqueue_trial({"x": 1.0})
        assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == ["guarded"]
        control = ControlClient("127.0.0.1", port)
        try:
            assert control.workers(study="guarded") == []
        finally:
            control.close()
        # A client carrying the secret but not autotune's: a malformed control call is told
        # it is malformed (not an outage to retry), and the server goes on serving.
        metadata = [("authorization", f"Bearer {SECRET}")]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/autotune.Control/Call")
            for payload, says in ((b"not json", "a control call is a JSON object"),
                                  (b"[1, 2]", "a control call is a JSON object"),
                                  (b"[" * 100_000 + b"]" * 100_000, "a control call is a JSON"),
                                  (b'{"method": "workers", "args": [1]}', "a JSON object"),
                                  (b'{"method": "exec", "args": {}}', "no control call 'exec'"),
                                  (b'{"method": "workers", "args": {"study": "x", "rm": 1}}',
                                   "control call workers: got an unexpected keyword")):
                with pytest.raises(grpc.RpcError) as refused:
                    call(payload, timeout=10, metadata=metadata)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, payload[:40]
                assert says in refused.value.details(), refused.value.details()
            assert call(b'{"method": "workers", "args": {"study": "guarded"}}', timeout=10,
                        metadata=metadata) == b"[]"
    finally:
        err = _stop(server)
    assert SECRET not in err
    assert "Traceback" not in err, err[-2000:]


def _self_signed(folder: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key


def test_over_tls_a_client_trusting_the_certificate_gets_in_and_a_plaintext_one_does_not(
        postgres, tmp_path, monkeypatch):
    url = postgres.database()
    cert, key = _self_signed(tmp_path)
    server, port = _start_server(url, tmp_path, "--tls-cert", str(cert), "--tls-key", str(key),
                                 env={"AUTOTUNE_SERVER_TOKEN": SECRET})
    try:
        monkeypatch.setenv("AUTOTUNE_SERVER_TOKEN", SECRET)
        monkeypatch.delenv("AUTOTUNE_SERVER_CA", raising=False)
        with pytest.raises(ConfigError, match="cannot reach the study server"):
            open_storage(f"autotune://127.0.0.1:{port}")        # plaintext to a TLS port
        monkeypatch.setenv("AUTOTUNE_SERVER_CA", str(cert))
        storage = open_storage(f"autotune://127.0.0.1:{port}")
        import optuna

        optuna.create_study(study_name="tls", storage=storage)
        assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == ["tls"]
    finally:
        _stop(server)


def _one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(("extra", "env", "words"), [
    (("--host", "0.0.0.0"), {}, ("--insecure", "secret")),
    (("--port", "70000"), {}, ("1 to 65535",)),
    (("--port", "0"), {}, ("1 to 65535",)),
    (("--token-file", "/nonexistent/token"), {}, ("--token-file", "cannot be read")),
    (("--tls-cert", "/nonexistent/cert.pem"), {}, ("--tls-key",)),
    ((), {"AUTOTUNE_SERVER_TOKEN": "short"}, ("at least 16",)),
])
def test_a_server_that_would_be_open_or_cannot_bind_is_refused_in_one_line(
        postgres, tmp_path, extra, env, words):
    url = postgres.database()
    root = str(Path(__file__).resolve().parent.parent)
    result = subprocess.run([sys.executable, "-m", "autotune", "server", "--storage", url,
                             *extra], cwd=tmp_path, text=True, capture_output=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": root, **env})
    _one_line_error(result, *words)
    assert list(tmp_path.iterdir()) == []


def test_a_port_in_use_is_one_line(postgres, tmp_path):
    url = postgres.database()
    server, port = _start_server(url, tmp_path)
    try:
        root = str(Path(__file__).resolve().parent.parent)
        result = subprocess.run([sys.executable, "-m", "autotune", "server", "--storage", url,
                                 "--port", str(port)], cwd=tmp_path, text=True,
                                capture_output=True, timeout=120,
                                env={**os.environ, "PYTHONPATH": root})
        _one_line_error(result, "cannot listen", str(port))
    finally:
        _stop(server)


def test_insecure_on_purpose_binds_beyond_loopback_and_warns(postgres, tmp_path):
    server = autotune("server", "--storage", postgres.database(), "--host", "0.0.0.0",
                      "--port", str(port := free_port()), "--insecure", cwd=tmp_path)
    try:
        wait_for_port(port)
        time.sleep(0.5)
    finally:
        server.terminate()
        _, err = server.communicate(timeout=20)
    assert "has no secret (--insecure)" in err


def test_secret_and_certificate_files_written_with_a_home_folder_are_read_there(tmp_path,
                                                                                monkeypatch):
    """AUTOTUNE_SERVER_TOKEN_FILE=~/secret in a service's environment file is not expanded by
    any shell: the file in the home folder is read, and a missing one named as given."""
    from autotune._channel import _read_pem, read_token_file

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "secret").write_text("s3cret-token-long-enough-for-autotune\n")
    (tmp_path / "ca.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\nMII\n")
    assert read_token_file("~/secret", "--token-file") == \
        "s3cret-token-long-enough-for-autotune"
    assert _read_pem("~/ca.pem", "AUTOTUNE_SERVER_CA").startswith(b"-----BEGIN")
    with pytest.raises(ConfigError, match=r"--token-file '~/nope' cannot be read"):
        read_token_file("~/nope", "--token-file")

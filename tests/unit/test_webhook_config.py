"""``PHOTOJOBS_WEBHOOK_URL``'s rules (issue 38, ``photojobs.webhooks``): http(s) only, no credentials,
an outside host only when the operator names it in ``PHOTOJOBS_WEBHOOK_HOSTS``, a secret required;
each refusal a ``ConfigError`` naming the variable at startup (``Settings.from_env``); the body's
signature is the HMAC-SHA256 of the raw bytes."""

from __future__ import annotations

import hashlib
import hmac
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from photojobs.config import Settings
from photojobs.errors import ConfigError
from photojobs.webhooks import WebhookDuty, encode, sign, webhook_config

SECRET = {"PHOTOJOBS_WEBHOOK_SECRET": "s3cret"}


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "https://localhost/hook",
        "http://[::1]:9000/",
        "http://10.1.2.3/hook",
        "http://192.168.1.20:81/x",
    ],
)
def test_a_loopback_or_private_host_is_accepted_as_is(url: str) -> None:
    # Given a webhook URL on the operator's own machine or network / When read / Then accepted
    config = webhook_config({"PHOTOJOBS_WEBHOOK_URL": url, **SECRET})
    assert config is not None and config.url == url and config.secret == b"s3cret"


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/photojobs",
        "http://93.184.216.34/hook",
        "http://169.254.169.254/latest/meta-data/",  # link-local: the cloud metadata service
        "http://0.0.0.0:8080/",
    ],
)
def test_an_outside_host_is_refused_unless_the_operator_names_it(url: str) -> None:
    # Given an outside host not named in PHOTOJOBS_WEBHOOK_HOSTS
    env = {"PHOTOJOBS_WEBHOOK_URL": url, **SECRET}
    # When the settings are read / Then a ConfigError names the variable and the way to allow it
    with pytest.raises(ConfigError) as err:
        Settings.from_env({**env, "PHOTOJOBS_DATABASE_URL": "sqlite:////tmp/x.db"})
    assert err.value.setting == "PHOTOJOBS_WEBHOOK_URL" and "PHOTOJOBS_WEBHOOK_HOSTS" in str(err.value)
    # And named by the operator it is accepted
    host = url.split("/")[2].split(":")[0]
    assert webhook_config({**env, "PHOTOJOBS_WEBHOOK_HOSTS": f"other.example.org, {host}"}) is not None


@pytest.mark.parametrize(
    ("env", "setting", "says"),
    [
        ({"PHOTOJOBS_WEBHOOK_URL": "ftp://127.0.0.1/x", **SECRET}, "PHOTOJOBS_WEBHOOK_URL", "http"),
        ({"PHOTOJOBS_WEBHOOK_URL": "file:///etc/passwd", **SECRET}, "PHOTOJOBS_WEBHOOK_URL", "http"),
        (
            {"PHOTOJOBS_WEBHOOK_URL": "http://u:p@127.0.0.1/x", **SECRET},
            "PHOTOJOBS_WEBHOOK_URL",
            "credentials",
        ),
        ({"PHOTOJOBS_WEBHOOK_URL": "http:///x", **SECRET}, "PHOTOJOBS_WEBHOOK_URL", "no host"),
        (
            {"PHOTOJOBS_WEBHOOK_URL": "http://127.0.0.1:99999/", **SECRET},
            "PHOTOJOBS_WEBHOOK_URL",
            "not a URL",
        ),
        ({"PHOTOJOBS_WEBHOOK_URL": "http://127.0.0.1/x"}, "PHOTOJOBS_WEBHOOK_SECRET", "must be set"),
        (
            {
                "PHOTOJOBS_WEBHOOK_URL": "http://127.0.0.1/x",
                "PHOTOJOBS_WEBHOOK_BACKOFF_MAX": "soon",
                **SECRET,
            },
            "PHOTOJOBS_WEBHOOK_BACKOFF_MAX",
            "number",
        ),
    ],
)
def test_a_bad_webhook_setting_is_refused_naming_its_variable(env: dict, setting: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        webhook_config(env)
    assert err.value.setting == setting and says in str(err.value)


def test_the_host_shown_is_the_urls_host_and_port_never_its_path() -> None:
    def shown(url: str) -> str:
        config = webhook_config({"PHOTOJOBS_WEBHOOK_URL": url, **SECRET})
        assert config is not None
        return config.host

    assert shown("http://127.0.0.1:8080/hook/T0KEN") == "127.0.0.1:8080"
    assert shown("http://[::1]:9000/x") == "[::1]:9000"
    assert shown("https://localhost/x") == "localhost"


def test_no_url_means_no_webhook() -> None:
    assert webhook_config({}) is None and webhook_config({"PHOTOJOBS_WEBHOOK_URL": " "}) is None


def test_the_signature_is_the_hmac_sha256_of_the_raw_body() -> None:
    raw = encode(
        {"event": "job_finished", "job": 7, "state": "succeeded", "counts": {"succeeded": 1}, "cursor": 3}
    )
    expected = hmac.new(b"k", raw, hashlib.sha256).hexdigest()
    assert sign(b"k", raw) == f"sha256={expected}"


def test_a_redirect_is_a_failed_attempt_and_is_never_followed() -> None:
    # Given a receiver on loopback that redirects the webhook to another path of its own
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            hits.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(307 if self.path == "/hook" else 204)
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        config = webhook_config({"PHOTOJOBS_WEBHOOK_URL": url, **SECRET})
        assert config is not None
        duty = WebhookDuty(None, config)  # type: ignore[arg-type] - post() needs no store
        # When the duty posts to it
        outcome = duty.post({"event": "job_finished", "job": 1})
        # Then the attempt failed, naming the redirect, and the redirect's target got nothing
        assert (outcome.ok, outcome.status) == (False, 307) and "redirect" in outcome.error
        assert hits == ["/hook"]
    finally:
        server.shutdown()
        server.server_close()

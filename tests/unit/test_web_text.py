"""Unit tests of the web boundary's text rules (issue 29): request strings must be text and numbers
finite (``photojobs.web.text``); stored strings that are not are shown escaped
(``photojobs.web.safe_json``); the connection limits' configuration (``photojobs.web.server``)."""

from __future__ import annotations

import json
import logging

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from photojobs.web import server
from photojobs.web.safe_json import dumps, escape_text
from photojobs.web.text import NotText, RequestText, check_json


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"got": (await request.body()).decode("utf-8", "replace")})


def _client() -> TestClient:
    app = Starlette(routes=[Route("/echo", _echo, methods=["GET", "POST"])])
    return TestClient(RequestText(app))


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ('{"params": {"exif.description": "\\ud800"}}', "body.params.exif.description"),
        ('{"params": {"exif.keywords": ["ok", "\\udfff"]}}', "body.params.exif.keywords[1]"),
        ('{"params": {"\\ud83d": 1}}', "body.params (a key)"),
        ('{"q": "a\\u001bb"}', "body.q"),
        ('{"older_than": NaN}', "body"),
        ('{"older_than": -Infinity}', "body"),
        ('{"older_than": 1e400}', "body"),
    ],
)
def test_a_body_string_that_is_not_text_or_a_number_that_is_not_finite_is_400(body: str, where: str) -> None:
    # Given valid JSON holding a lone surrogate, an ESC, or a non-finite number
    # When it is posted / Then it is a 400 in the JSON error shape, naming where, and the app never ran
    r = _client().post("/echo", content=body.encode())
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "invalid_request" and r.json()["detail"]["where"] == where


def test_text_with_tabs_newlines_and_any_script_passes_unchanged() -> None:
    # Given a body with a multi-line description, emoji (a surrogate pair in JSON) and CJK
    body = json.dumps({"params": {"exif.description": "line 1\n\tline 2 😀 写真"}}, ensure_ascii=True)
    # When it is posted / Then the app gets it byte for byte
    r = _client().post("/echo", content=body.encode())
    assert r.status_code == 200 and r.json()["got"] == body
    # And a body that is not JSON at all is the endpoint's to judge
    assert _client().post("/echo", content=b"not json").json()["got"] == "not json"


def test_a_query_or_path_with_a_control_character_is_400() -> None:
    # Given query values and a path holding control characters (percent-encoded)
    for url in ("/echo?q=a%0Ab", "/echo?q=%1B%5B31m", "/echo%0A", "/echo?a%00=1"):
        # When requested / Then 400 naming the query or path
        r = _client().get(url)
        assert r.status_code == 400, (url, r.text)
        assert r.json()["error"] == "invalid_request"


def test_check_json_names_the_invalid_utf8_byte() -> None:
    with pytest.raises(NotText, match="not UTF-8"):
        check_json(b'{"a": "\xff"}')


def test_stored_strings_that_cannot_be_encoded_are_shown_escaped() -> None:
    # Given what a store may hold: a surrogate-escaped file name, a lone surrogate, NaN
    content = {"path": "/p/bad\udcffname.jpg", "params": {"d": "x\ud800"}, "n": float("nan")}
    # When it is rendered / Then it is valid UTF-8 JSON with each shown escaped
    shown = json.loads(dumps(content))
    assert shown == {"path": "/p/bad\\xffname.jpg", "params": {"d": "x\\ud800"}, "n": "NaN"}
    assert escape_text("plain é") == "plain é"


def test_trusted_proxies_and_limits_come_from_the_environment() -> None:
    # Given no setting / Then no proxy is trusted and the documented defaults hold
    limits = server.ServerLimits.from_env({})
    assert limits.trusted == () and limits.header_timeout == server.HEADER_TIMEOUT
    assert 1 <= limits.max_connections <= server.MAX_CONNECTIONS
    # Given named proxies / Then exactly those
    named = server.ServerLimits.from_env({"PHOTOJOBS_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8"})
    assert named.trusted == ("127.0.0.1", "10.0.0.0/8")
    # And a bad one is refused naming it
    with pytest.raises(ValueError, match="'proxy.example'"):
        server.ServerLimits.from_env({"PHOTOJOBS_TRUSTED_PROXIES": "proxy.example"})
    with pytest.raises(ValueError, match="PHOTOJOBS_HTTP_HEADER_TIMEOUT"):
        server.ServerLimits.from_env({"PHOTOJOBS_HTTP_HEADER_TIMEOUT": "nan"})


def test_running_out_of_descriptors_is_one_log_line_not_a_flood(caplog: pytest.LogCaptureFixture) -> None:
    # Given accept() failing with EMFILE 10,000 times in a row
    import asyncio
    import errno

    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.WARNING, logger="photojobs.web"):
            for _ in range(10_000):
                exc = OSError(errno.EMFILE, "Too many open files")
                server.loop_exception_handler(
                    loop, {"message": "socket.accept() out of system resource", "exception": exc}
                )
    finally:
        loop.close()
    # Then one line says what happened and what to do
    lines = [r for r in caplog.records if r.name == "photojobs.web"]
    assert len(lines) == 1 and "ulimit -n" in lines[0].getMessage()


@pytest.mark.parametrize(
    "params",
    [
        {"exif.description": "x\udcff"},
        {"exif.keywords": ["ok", "\ud800"]},
        {"rename.pattern": "{stem}\udcfe{ext}"},
    ],
)
def test_a_parameter_that_is_not_text_is_refused_for_every_client(params: dict[str, object]) -> None:
    # Given a parameter holding a byte that is not UTF-8 (the CLI's argv) or a lone surrogate
    from photos.errors import InvalidParameter
    from photos.params import validate_params

    # When it is validated (CLI, Client and web alike) / Then it is refused, saying why
    with pytest.raises(InvalidParameter, match="not text"):
        validate_params(["exif", "rename"], params)

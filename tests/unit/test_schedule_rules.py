"""The schedule's rules that need no store (issue 38, ``photojobs.schedules``): durations, the next
tick (a catch-up jumps to the first tick after now), cron lines read by APScheduler, and command
lines parsed by ``photojobs sync``'s and ``submit``'s own click commands with clear refusals."""

from __future__ import annotations

from datetime import datetime

import pytest

from photojobs.schedules import BadSchedule, check_cadence, first_tick_after, parse_command, parse_every


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30.0), ("15m", 900.0), ("2h", 7200.0), ("1d", 86400.0), ("90", 90.0)]
)
def test_a_duration_reads_its_unit(text: str, seconds: float) -> None:
    assert parse_every(text) == seconds


@pytest.mark.parametrize(
    ("text", "says"), [("15x", "number and a unit"), ("0s", "at least 1 s"), ("", "number")]
)
def test_a_bad_duration_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(BadSchedule, match=says):
        parse_every(text)


def test_the_next_tick_after_downtime_is_the_first_tick_after_now_on_the_cadence() -> None:
    # Given a tick due at 1000 every 60 s, when the claim comes at 1000 + 10.5 ticks
    # Then the next tick is the 11th (one catch-up run now, no burst), and a claim on time moves one
    assert first_tick_after(60.0, None, 1630.0, anchor=1000.0) == 1660.0
    assert first_tick_after(60.0, None, 1000.0, anchor=1000.0) == 1060.0
    assert first_tick_after(60.0, None, 500.0) == 560.0


def test_a_cron_tick_is_the_expression_s_next_fire_time_after_now() -> None:
    at = datetime(2026, 12, 7, 14, 0, 30).astimezone().timestamp()
    fire = datetime.fromtimestamp(first_tick_after(None, "*/15 * * * *", at))
    assert (fire.hour, fire.minute, fire.second) == (14, 15, 0)


def test_a_cadence_is_exactly_one_of_every_and_cron_and_a_bad_cron_is_named() -> None:
    with pytest.raises(BadSchedule, match="exactly one of --every"):
        check_cadence("15m", "0 3 * * *")
    with pytest.raises(BadSchedule, match="exactly one of --every"):
        check_cadence(None, None)
    with pytest.raises(BadSchedule, match="five fields"):
        check_cadence(None, "0 3 * *")
    assert check_cadence(None, " 0  3 * * * ") == (None, "0 3 * * *")


def test_a_command_line_is_parsed_by_the_command_it_names() -> None:
    cmd = parse_command(["--", "sync", "/p", "--lanes", "analysis", "--param", "a.b=1", "--outdated"])
    assert (cmd.verb, cmd.lanes, cmd.paths, cmd.params, cmd.outdated) == (
        "sync",
        "analysis",
        ["/p"],
        ["a.b=1"],
        True,
    )
    sub = parse_command(["submit", "/p", "/q", "--lanes", "exif", "--priority", "normal"])
    assert sub.argv() == ["submit", "--lanes", "exif", "--priority", "normal", "/p", "/q"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "no command given"),
        (["rm", "-rf", "/"], "runs `sync` or `submit`"),
        (["sync", "/p"], "Missing option '--lanes'"),
        (["sync", "/p", "--lanes", "analysis", "--bogus"], "No such option '--bogus'"),
        (["sync", "--help"], "--help is not a command"),
        (
            ["submit", "/p", "--lanes", "analysis", "--idempotency-key", "k"],
            "each run of a schedule is a new",
        ),
    ],
)
def test_a_bad_command_line_is_refused_saying_why(argv: list[str], says: str) -> None:
    with pytest.raises(BadSchedule, match=says.replace("(", r"\(")):
        parse_command(argv)


def test_the_abandonment_time_is_read_from_the_environment_or_refused_naming_it() -> None:
    # Given the environment's PHOTOJOBS_SCHEDULE_ABANDONED, unset, set, and wrong
    from photojobs.schedules import abandoned_after
    from store.schedules import RUN_ABANDONED

    # Then unset is the default, a number is taken, and a bad value names the variable
    assert abandoned_after({}) == RUN_ABANDONED
    assert abandoned_after({"PHOTOJOBS_SCHEDULE_ABANDONED": "15"}) == 15.0
    for bad in ("soon", "1", "1e9"):
        with pytest.raises(ValueError, match="PHOTOJOBS_SCHEDULE_ABANDONED"):
            abandoned_after({"PHOTOJOBS_SCHEDULE_ABANDONED": bad})

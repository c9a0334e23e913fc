"""Parts of ``photojobs run`` (``photojobs.runner``) on their own: stop signals and the state folder lock."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from rich.console import Console

from photojobs.runner.signals import StopSignals
from photojobs.runner.state_folder import StateFolder, StateFolderBusy
from tests.support import wait_for


def test_stop_signals_are_counted_inside_the_block_and_handed_back_after() -> None:
    # Given the handlers in place before the block
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    # When a SIGTERM then a SIGINT arrive inside the block
    with StopSignals() as stops:
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: stops.pause_asked, 10, what="the first signal to be counted")
        assert not stops.stop_now
        os.kill(os.getpid(), signal.SIGINT)
        wait_for(lambda: stops.stop_now, 10, what="the second signal to be counted")
    # Then both were counted (pause, then stop now), and the earlier handlers are back
    assert stops.interrupts == 2
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_state_folder_is_private_and_held_by_one_run_at_a_time(tmp_path: Path) -> None:
    # Given a run holding a new state folder
    path = tmp_path / "state"
    console = Console(file=open(os.devnull, "w"))  # noqa: SIM115 - closed with the console's test
    with StateFolder(path, wait=False, console=console):
        # Then the folder is 0700
        assert path.stat().st_mode & 0o777 == 0o700
        # When a second run asks for it without --wait / Then it is refused, naming the holder
        with pytest.raises(StateFolderBusy, match=f"in use by photojobs run pid {os.getpid()}"):
            with StateFolder(path, wait=False, console=console):
                pass
    # When the first run is done / Then the next one gets the folder
    with StateFolder(path, wait=False, console=console):
        pass
    console.file.close()

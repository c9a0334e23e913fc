"""The heartbeat interval follows the shortest lease TTL of the lanes a worker serves; settings
that would lose leases are refused at start with the variable named."""

from __future__ import annotations

from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from middleware.heartbeat import check_heartbeat, heartbeat_interval_for
from middleware.lease import LeaseMiddleware
from photojobs.config import Settings
from store.engine import make_engine
from store.errors import ConfigError
from store.lanes import all_lanes


def test_interval_is_a_quarter_of_the_shortest_ttl_served() -> None:
    # Given a global TTL of 10 s and a noop lane TTL of 1 s
    specs = all_lanes({"PHOTOJOBS_LEASE_TTL": "10", "PHOTOJOBS_LANE_NOOP_LEASE_TTL": "1"})
    # When the interval is derived for a worker with and without the noop lane
    with_noop = heartbeat_interval_for(specs.values())
    without = heartbeat_interval_for([s for n, s in specs.items() if n != "noop"])
    # Then the noop lane's short TTL decides when it is served, the global TTL otherwise
    assert with_noop == 0.25 and without == 2.5
    # And an explicit interval wins
    assert heartbeat_interval_for(specs.values(), 0.1) == 0.1


def test_explicit_interval_not_below_half_a_lane_ttl_is_a_config_error() -> None:
    # Given a heartbeat of 3 s while the noop lane's lease lasts 1 s
    env = {"PHOTOJOBS_HEARTBEAT_INTERVAL": "3", "PHOTOJOBS_LANE_NOOP_LEASE_TTL": "1"}
    # When the settings are read / Then a ConfigError (a ValueError) names the variable and the lane
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    assert caught.value.setting == "PHOTOJOBS_HEARTBEAT_INTERVAL"
    assert "lane noop's lease TTL of 1 s (PHOTOJOBS_LANE_NOOP_LEASE_TTL)" in str(caught.value)
    assert isinstance(caught.value, ValueError)
    # And exactly half is refused too, just below half is accepted
    with pytest.raises(ConfigError):
        check_heartbeat(all_lanes({"PHOTOJOBS_LEASE_TTL": "2"}), 1.0)
    check_heartbeat(all_lanes({"PHOTOJOBS_LEASE_TTL": "2"}), 0.99)


def test_non_positive_lane_ttl_is_a_config_error() -> None:
    # Given a lane TTL of 0
    env = {"PHOTOJOBS_LANE_EXIF_LEASE_TTL": "0"}
    # When the settings are read / Then the lane's variable is named
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    assert caught.value.setting == "PHOTOJOBS_LANE_EXIF_LEASE_TTL"


def test_defaults_derive_and_pass() -> None:
    # Given no lease settings at all / When read / Then no error and no explicit interval
    assert Settings.from_env({}).heartbeat_explicit is None


def test_worker_beats_for_the_lanes_it_consumes(tmp_path: Path) -> None:
    # Given the lease middleware with a 1 s noop lane TTL and a 10 s global TTL
    specs = all_lanes({"PHOTOJOBS_LEASE_TTL": "10", "PHOTOJOBS_LANE_NOOP_LEASE_TTL": "1"})
    engine = make_engine(f"sqlite:///{tmp_path / 'hb.db'}")
    for queues, expected in (({"photojobs.noop"}, 0.25), ({"photojobs.exif"}, 2.5)):
        broker = StubBroker(middleware=[])
        lease = LeaseMiddleware(specs, engine_factory=lambda: engine)
        broker.add_middleware(lease)
        for spec in specs.values():
            broker.declare_queue(spec.queue)
        broker.emit_after("process_boot")
        # When a worker boots on those queues
        worker = dramatiq.Worker(broker, queues=queues, worker_timeout=50, worker_threads=1)
        worker.start()
        try:
            # Then the heartbeat interval is a quarter of their shortest TTL
            assert lease.heartbeat.interval == expected
        finally:
            worker.stop()
            lease.heartbeat.stop()
    engine.dispose()

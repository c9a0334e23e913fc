"""The sweeper's duties as small maintenance services run by one loop (docs/design.md "Maintenance services").

:mod:`.service` is the loop and the base class (name, interval, counters a test can wait on);
:mod:`.duties` the nine duties, each calling its store function, and ``sweep_once`` (one pass).
"""

from photojobs.maintenance.duties import (
    DispatchLane,
    EndAbandonedSubmissions,
    ForgetIdempotencyKeys,
    ForgetWorkers,
    NumberEvents,
    Publisher,
    RemoveStrayStaged,
    Republish,
    RevokeExpired,
    SettleOrphans,
    SweepReport,
    VacuumTables,
    default_services,
    sweep_once,
)
from photojobs.maintenance.service import Maintenance, Service

__all__ = [
    "DispatchLane",
    "EndAbandonedSubmissions",
    "ForgetIdempotencyKeys",
    "ForgetWorkers",
    "Maintenance",
    "NumberEvents",
    "Publisher",
    "RemoveStrayStaged",
    "Republish",
    "RevokeExpired",
    "Service",
    "SettleOrphans",
    "SweepReport",
    "VacuumTables",
    "default_services",
    "sweep_once",
]

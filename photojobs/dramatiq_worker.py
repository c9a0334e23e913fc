"""The worker command: ``python -m photojobs.dramatiq_worker <dramatiq arguments>``.

It is ``python -m dramatiq <arguments>`` plus the lifeline (see :mod:`photojobs.lifeline`): when
the supervisor that started it is gone, this worker and everything in its process group stop.
Dramatiq's ``--watch`` reload re-executes this same command, so the lifeline survives reloads.
"""

from __future__ import annotations

import sys

from photojobs.lifeline import watch_from_env


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    watch_from_env()
    from dramatiq.cli import main as dramatiq_main
    from dramatiq.cli import make_argument_parser

    # dramatiq re-executes sys.argv on a --watch reload (SIGHUP): make that this command again.
    sys.argv = [sys.executable, "-m", "photojobs.dramatiq_worker", *args]
    return int(dramatiq_main(make_argument_parser().parse_args(args)) or 0)


if __name__ == "__main__":
    sys.exit(main())

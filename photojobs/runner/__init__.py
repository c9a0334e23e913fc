"""The parts ``photojobs run`` (``photojobs.run.Runner``) is composed of, one concern per module.

- :mod:`.state_folder`: the state folder: where it is, its 0700/0600 modes, its ``run.lock``, the
  workers a killed run left behind;
- :mod:`.local_services`: the embedded Redis and SQLite defaults, the settings, the sweeper;
- :mod:`.signals`: Ctrl-C / SIGTERM / SIGHUP counted (once = pause, twice = stop now);
- :mod:`.workers`: the supervised worker fleet and its events (restarts, give-ups);
- :mod:`.watch`: live progress until the job ends, is paused, or the workers are given up;
- :mod:`.worker_killer`: the demo's SIGKILL of one worker midway;
- :mod:`.summary`: the closing summary (table or JSON) and its exit code;
- :mod:`.outcome`: the exit codes and final job states.
"""

"""The reliability harness behind ``python -m benchmarks.chaos`` and ``tests/chaos``.

Worker processes contend for a few keys with fencing on and write to a fenced resource; fault
injectors pause, restart, disconnect, slow down and confuse them; the checker reads every log
and the resource's history and reports what a user must never see (double grants, fences out of
order, losses nobody was told about) next to what a user should know (late writes, how long a
holder took to learn of its loss).

Modules:

- :mod:`.eventlog` — JSON-lines logs and the one host clock every log line is stamped with;
- :mod:`.recording` — a backend wrapper logging every primitive call with its send/receive times;
- :mod:`.clockctl` — a shared-memory knob that shifts a worker's wall and monotonic clocks;
- :mod:`.resource` — the fenced resource (an SQLite file or a PostgreSQL table);
- :mod:`.worker` — the workload process;
- :mod:`.proxy` — a loopback TCP proxy that adds latency, stalls or cuts connections;
- :mod:`.faults` — the fault injectors;
- :mod:`.scenario` — runs workers plus one injector and hands the logs to the checker;
- :mod:`.checker` — the log checker and its report.
"""

__all__: list[str] = []

"""`surge pulse`: an open-loop pulse load generator against any HTTP URL, and its report.

schedule (rates -> arrival times, pure; shared with `surge simulate`)  stats (the
per-100 ms record, pure)  summary (its timeline and summary, pure)  generator (the
asyncio shell)  replicas (surge replica counts)  options  runner (workers, progress)
report (JSON, HTML, PNG).

Importing the package stays light (numpy only): the generator, runner and report are
imported from their modules by whoever runs a pulse.
"""

from surge.loadtest.schedule import ARRIVALS, Schedule, Segment, arrival_times, pulse

__all__ = ["ARRIVALS", "Schedule", "Segment", "arrival_times", "pulse"]

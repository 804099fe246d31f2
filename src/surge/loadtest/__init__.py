"""`surge pulse`: an open-loop pulse load generator against any HTTP URL, and its report.

schedule (rates -> arrival times, pure)  stats (per-100 ms record and summary, pure)
generator (the asyncio shell)  replicas (surge replica counts)  options  runner  report
"""

from surge.loadtest.options import PulseOptions
from surge.loadtest.runner import PulseResult, run_pulse
from surge.loadtest.schedule import Schedule, Segment, pulse

__all__ = ["PulseOptions", "PulseResult", "Schedule", "Segment", "pulse", "run_pulse"]

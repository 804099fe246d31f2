import os
import sys

from surge.process import run_exit_hooks
from surge.replica.main import main_from_stdin

code = main_from_stdin()
run_exit_hooks()  # e.g. an engine's processes (surge.llm); atexit would not run
# As a forked replica leaves (replica/forkserver.py): no second round of finalizers, so
# the user's `__del__`, already called on the graceful stop, does not run again.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)

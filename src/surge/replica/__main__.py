import sys

from surge.replica.main import main_from_stdin

sys.exit(main_from_stdin())

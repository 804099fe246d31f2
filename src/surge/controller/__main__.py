import sys

from surge.backends.early_fork import start_early

# The spec's line, read here so the fork server starts before the controller's imports.
SPEC = sys.stdin.buffer.readline(1 << 20)
start_early(SPEC)

from surge.controller.main import main  # noqa: E402

sys.exit(main(spec_line=SPEC))

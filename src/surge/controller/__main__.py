import sys

from surge.backends.early import start_early, stop_untaken

# The spec's line, read here so the fork server and the first proxy start before the
# controller's imports.
SPEC = sys.stdin.buffer.readline(1 << 20)
start_early(SPEC)

from surge.controller.main import main  # noqa: E402

try:
    code = main(spec_line=SPEC)
finally:
    stop_untaken()
sys.exit(code)

import sys

from surge.proxy.server import main

# `early`: started before its controller had a spec to give (surge.backends.early); no
# spec then means the controller exited first, and there is nothing to say.
sys.exit(main(quiet_without_spec=sys.argv[1:] == ["early"]))

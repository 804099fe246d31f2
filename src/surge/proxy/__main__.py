import sys

from surge.proxy.server import main

sys.exit(main(sys.argv[1:]))

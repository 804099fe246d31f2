import sys

from surge.proxy.server import main

sys.exit(main())

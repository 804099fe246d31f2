import sys

from surge.replica.main import main

sys.exit(main(sys.argv[1:]))

import sys

from surge.weights.main import main

sys.exit(main())

import sys

from surge.controller.main import main

sys.exit(main())

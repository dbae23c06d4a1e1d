"""``python -m scripts.soak``: see :mod:`scripts.soak.run`."""

import sys

from scripts.soak.run import main

sys.exit(main())

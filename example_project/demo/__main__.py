"""``python -m example_project.demo``: see the package's docstring."""

import sys

from example_project.demo.run import main

sys.exit(main())

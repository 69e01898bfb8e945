"""``python -m sailor_tasks.cli``: the ``sailor`` command."""

import sys

from sailor_tasks.cli.main import main

sys.exit(main())

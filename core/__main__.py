"""``python -m agentcompact [command]``: the same as the ``agentcompact`` command."""

import sys

from ._cli import main

sys.exit(main())

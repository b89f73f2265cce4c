"""``python -m agentcompact.integrations.proxy [flags]``."""

import sys

from ._cli import main

sys.exit(main())

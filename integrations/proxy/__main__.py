"""``python -m agentcompact.integrations.proxy [flags]``."""

import sys

from .cli import main

sys.exit(main())

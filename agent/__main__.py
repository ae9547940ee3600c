"""``python -m agent`` runs the agent."""

import sys

from agent.main import main

sys.exit(main())

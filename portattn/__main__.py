"""``python -m portattn``: see ``portattn.tools.cli``."""

from portattn.tools.cli import main

raise SystemExit(main())

"""``python -m portattn``: see ``portattn.cli``."""

from portattn.cli import main

raise SystemExit(main())

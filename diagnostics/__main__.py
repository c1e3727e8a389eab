"""``python -m diagnostics …``: see ``diagnostics.cli``."""

from diagnostics.cli import main

raise SystemExit(main())

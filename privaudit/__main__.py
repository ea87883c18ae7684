"""``python -m privaudit`` runs the command-line interface."""

from privaudit.cli import main

raise SystemExit(main())

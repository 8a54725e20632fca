"""``python -m rightsizer.cli``: the ``rightsizer`` console script."""

from rightsizer.cli import main

raise SystemExit(main())

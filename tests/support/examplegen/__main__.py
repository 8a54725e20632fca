"""``python -m tests.support.examplegen``: see :func:`tests.support.examplegen.generate.main`."""

from tests.support.examplegen.generate import main

raise SystemExit(main())

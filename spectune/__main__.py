"""`python -m spectune` is the same as the `spectune` console script."""

from spectune.cli import main

raise SystemExit(main())

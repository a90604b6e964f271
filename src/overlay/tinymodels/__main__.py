from __future__ import annotations

from overlay.tinymodels.cli import main

raise SystemExit(main())
